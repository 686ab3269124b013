"""A stop is final (issue 47, item 6): once a stop signal reached a batch, nothing of a new op runs,
whatever the timing. The batch runs in this process's main thread, as `python -m harness batch` runs
it; the signals are real (SIGINT to this process), delivered from a seam at the exact point the issue
found open: after the device thread's stop check and before the op's start, every round; the ops are
real processes (fresh under their real guard, or forked by a real warm worker)."""

import os
import signal
import sys
import threading
import time

import pytest
from batch_fakes import ADD, options

from harness.core import batchdir, forkserver, launch, opguard
from harness.sessions import batch

ROUNDS = 12  # each round delivers the stop in the same window again: a gate that holds only by luck fails one
STOP_SEEN_S = 60  # for the main thread to run its handler (the stop) on a loaded machine: waited for, not slept


def _run_stopped(tmp_path, op_start: str) -> batch.Batch:
    """A batch of one op whose start is reached only after a real SIGINT stopped the batch: the seam
    delivers it after the stop check, waits until the main thread's handler stopped the batch, and
    only then lets the real start go on. The runner, once its run ended by that KeyboardInterrupt."""
    runner = batch.Batch(tmp_path, options(op_start=op_start, op_timeout=120.0), {})
    with launch.stops_on_signals(), pytest.raises(KeyboardInterrupt):
        runner.run([ADD], lambda row: None)
    _device_threads_ended()
    return runner


def _device_threads_ended() -> None:
    """The batch's run ends some seconds after a stop (its joins are bounded); its device thread may still be
    finishing the op it stopped (a warm worker still importing torch on a loaded machine): waited for, so the
    op's row is there to check."""
    deadline = time.monotonic() + STOP_SEEN_S
    for t in threading.enumerate():
        target = getattr(t, "_target", None)
        if target is not None and target.__name__ == "device_thread":
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), "a device thread never finished after the stop"


def _stopping_first(real, runner_of):
    """A start that a SIGINT to this process precedes, once the batch's stop (run by the main thread's
    handler) is set: the stop came between the device thread's check and this start."""
    def start(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        assert runner_of().stopping.wait(STOP_SEEN_S), "the main thread never stopped the batch"
        return real(*args, **kwargs)

    return start


def _nothing_ran(runner: batch.Batch) -> None:
    rows = [runner.events.get_nowait() for _ in range(runner.events.qsize())]
    assert [(r.status, r.attempts) for r in rows] == [("INTERRUPTED", 0)], rows  # no attempt ran
    op_dir = batchdir.op_dir(runner.dir, ADD.key)
    assert not (op_dir / opguard.RUNNING).exists()
    # No run dir was claimed: the op's record never got as far as its first file.
    assert [p for p in op_dir.rglob("*") if p.is_file() and p.name != "batch.log"] == []
    assert runner.children == {}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_stop_between_the_check_and_a_fresh_ops_start_runs_nothing_of_it(tmp_path, monkeypatch, round_):
    runners = []
    monkeypatch.setattr(batch.Batch, "__init__", _remembered(batch.Batch.__init__, runners))
    monkeypatch.setattr(launch, "start", _stopping_first(launch.start, lambda: runners[0]))
    _nothing_ran(_run_stopped(tmp_path, "fresh"))


@pytest.mark.parametrize("round_", range(2))  # a warm worker imports torch first: seconds a round
def test_a_stop_between_the_check_and_a_forked_ops_start_runs_nothing_of_it(tmp_path, monkeypatch, round_):
    runners = []
    monkeypatch.setattr(batch.Batch, "__init__", _remembered(batch.Batch.__init__, runners))
    monkeypatch.setattr(forkserver.Worker, "start", _stopping_first(forkserver.Worker.start, lambda: runners[0]))
    _nothing_ran(_run_stopped(tmp_path, "fork"))


def test_a_stop_that_lands_as_the_device_threads_start_still_stops_the_batch(tmp_path, monkeypatch):
    """The issue's 'Ctrl-C as a batch starts': the KeyboardInterrupt is raised in the main thread just
    as it starts the device thread, before it waits for any row."""
    real = threading.Thread.start
    sent = threading.Event()

    def start(self):
        target = getattr(self, "_target", None)
        if target is None or target.__name__ != "device_thread":
            return real(self)

        def held(*args):
            # Not a step ahead of the signal, however this machine schedules the two threads: the thread goes
            # on once the signal reached the process, while the main thread may still be on its way to the
            # handler that stops the batch.
            assert sent.wait(STOP_SEEN_S)
            return target(*args)

        held.__name__ = target.__name__
        self._target = held
        real(self)
        try:
            os.kill(os.getpid(), signal.SIGINT)  # raised in this (the main) thread at its next instruction
        finally:
            sent.set()

    monkeypatch.setattr(threading.Thread, "start", start)
    runner = batch.Batch(tmp_path, options(op_start="fresh", op_timeout=120.0), {})
    try:
        with launch.stops_on_signals(), pytest.raises(KeyboardInterrupt):
            runner.run([ADD], lambda row: None)
        _device_threads_ended()
        assert runner.stopping.is_set()  # the batch's stop ran: its device thread starts nothing
        rows = [runner.events.get_nowait() for _ in range(runner.events.qsize())]
        assert all((r.status, r.attempts) == ("INTERRUPTED", 0) for r in rows), rows
        assert [p for p in runner.dir.rglob("*") if p.name == "run.json"] == []
    finally:
        runner.stop()  # what a broken stop left running ends with the test, not after it


def _remembered(init, into: list):
    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        into.append(self)

    return remember


def test_a_stop_as_a_steps_wait_begins_starts_no_step(tmp_path, monkeypatch):
    """An A/B step (and a run's child) starts through launch.run, which takes a stop signal for the
    step it waits on: one that lands as its handlers go in, before the start, starts nothing."""
    real_signal, started, sent = signal.signal, [], []

    def install(signum, handler):
        previous = real_signal(signum, handler)
        if signum == signal.SIGTERM and not sent:  # launch.run's handlers in place (SIGINT's went in first)
            sent.append(signum)
            os.kill(os.getpid(), signal.SIGINT)  # lands on launch.run's own handler
        return previous

    def starter(argv, **kw):
        started.append(argv)
        return launch.start(argv, **kw)

    monkeypatch.setattr(signal, "signal", install)
    marker, told = tmp_path / "ran", []
    code, signum = launch.run([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], grace_s=5, starter=starter,
                              on_stop=told.append)
    assert (started, signum) == ([], signal.SIGINT) and code == -signal.SIGINT
    assert not marker.exists()
    assert told == [signal.SIGINT]  # the caller hears of the stop (an A/B says "interrupted" from there)


def test_a_stop_while_a_warm_worker_starts_a_step_runs_nothing_of_it(tmp_path):
    """A forked A/B step's start waits for its warm worker's imports (seconds): a stop that lands then is
    final too. The step waits at its gate, and reads it closed: nothing of it runs. With no stop, the gate
    opens and the step runs."""
    def step(marker):
        # The step as a worker forks it, deaf to the Ctrl-C launch.run forwards (so that the gate alone decides
        # whether it runs), saying it is up; then the gate (opguard.passed_gate), then its work.
        return ["-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "os.write(int(sys.argv[2]), b'up'); from harness.core import opguard; "
                f"opguard.passed_gate(int(sys.argv[1])) and open({str(marker)!r}, 'w')"]

    def starter(stop_while_starting):
        def start(argv, gate, **kw):
            up, says_up = os.pipe()
            child = launch.start([sys.executable, *argv, str(gate), str(says_up)], pass_fds=(gate, says_up), **kw)
            os.close(says_up)
            assert os.read(up, 2) == b"up"
            os.close(up)
            if stop_while_starting:  # the Ctrl-C comes before the start returned
                os.kill(os.getpid(), signal.SIGINT)
            return child
        return start

    stopped, ran, told = tmp_path / "stopped", tmp_path / "ran", []
    code, signum = launch.run(step(stopped), grace_s=5, starter=starter(True), gated=True, on_stop=told.append)
    assert (code, signum) == (-signal.SIGINT, signal.SIGINT) and not stopped.exists()
    assert told == [signal.SIGINT]  # said once: an A/B stopped while its worker starts a step says so
    assert launch.run(step(ran), grace_s=5, starter=starter(False), gated=True, on_stop=told.append) == (0, None)
    assert ran.exists() and told == [signal.SIGINT]


def test_a_stop_signal_whose_handler_has_not_run_yet_lets_no_op_start(tmp_path, monkeypatch):
    """The gate asks launch.stop_signal_arrived too: a Ctrl-C that reached the process while the main thread,
    not scheduled yet on a loaded machine, has not stopped the batch, still closes the op's gate."""
    monkeypatch.setattr(launch, "stop_signal_arrived", lambda: True)
    runner = batch.Batch(tmp_path, options(op_start="fresh", op_timeout=120.0), {})
    try:
        rows = []
        runner.run([ADD], rows.append)
        assert [(r.status, r.attempts) for r in rows] == [("INTERRUPTED", 0)]
        assert runner.children == {}
        op_dir = batchdir.op_dir(runner.dir, ADD.key)
        assert [p for p in op_dir.rglob("*") if p.is_file() and p.name not in ("batch.log", ".complete")] == []
    finally:
        runner.stop()
