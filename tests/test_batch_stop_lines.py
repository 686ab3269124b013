"""What a stopped batch shows: every op ops_status.csv holds is on the terminal too (an op that passed as
the stop came included), and the interrupted line names the ops the stop killed."""

import queue
import signal
import time

from harness import cli
from harness.core import batchdir
from harness.sessions import batch


class StopOnceARowWaits(queue.Queue):
    """The batch's event queue, in which a Ctrl-C lands while a finished op's row waits to be shown."""

    def get(self, block=True, timeout=None):
        if not block:  # what the stopped batch reads back
            return super().get(block, timeout)
        if self.empty():  # none yet: the batch's wait times out, and waits again
            time.sleep(timeout)
            raise queue.Empty
        raise KeyboardInterrupt


class PassesOneKillsOne(batch.Batch):
    """`add` passes on device 0; `mm` runs on device 1 until the stop kills it. No process is started."""

    FORKS = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = StopOnceARowWaits()

    def device_of(self, entry):
        return 0 if entry.op == "add" else 1

    def run_op(self, entry, device):
        if entry.op == "add":
            status = "PASS"
        else:
            assert self.stopping.wait(60)
            status = "INTERRUPTED"
        row = batchdir.StatusRow(entry.op, entry.repo, entry.op_file, status, device=device, elapsed_s=0.1, rows=0)
        self.record(entry, row)
        return row


def test_a_stopped_batch_shows_the_op_that_passed_and_names_the_op_it_killed(tmp_path, capsys):
    d = tmp_path / "b"
    args = cli.parse_request(["batch", "--backend", "interpreter", "--ops", "add", "mm",
                              "--devices", "0,1", "--batch-dir", str(d)])
    assert batch.run_from_args(args, runner_cls=PassesOneKillsOne) == 128 + signal.SIGINT
    out = capsys.readouterr().out.splitlines()
    with open(d / batchdir.STATUS_CSV) as f:
        assert {line.split(",")[0] for line in f.readlines()[1:]} == {"add", "mm"}
    assert any(line.startswith("PASS     builtin:add device=0") for line in out), out
    assert any(line.startswith("INTERRUPTED builtin:mm device=1") for line in out), out
    assert (f"interrupted (SIGINT): every running op was killed (builtin:mm); resume with --resume --batch-dir {d}"
            in out), out
