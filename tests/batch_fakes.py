"""The fakes the batch's tests share: inventory entries, a child's run dir as written, the batch
command line, the fake process boundary (launch.start) with its fake clock, and a real op that hangs."""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import json
import os
import signal
import sys
import threading
from pathlib import Path

from conftest import REPO, alive, wait_for
from result_rows import result_row

from harness import cli
from harness.core import batchdir, launch, opguard, rundir
from harness.core.options import RunOptions
from harness.providers.catalog import Entry
from harness.sessions import batch

OPS = REPO / "tests" / "resources" / "batch_ops"
CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"
ADD = Entry("builtin", "add", "add", "ops/add.py")
MM = Entry("builtin", "mm", "mm", "ops/mm.py")
FG = Entry("flaggems", "broken_upstream", "triage", "benchmark/test_triage.py")


def options(backend="interpreter", devices=(0,), flaggems_dirs=None, op_timeout=batchdir.DEFAULT_OP_TIMEOUT,
            replay_root=None, triage=True, op_start="fork", **run):
    """A batch's resolved options (harness.sessions.batch.Options): FlagGems checkouts as repo -> path,
    every other run option by its field name."""
    dirs = tuple(f"{repo}={path}" for repo, path in (flaggems_dirs or {}).items())
    return batch.Options(RunOptions(backend=backend, flaggems_dirs=dirs, **run), list(devices), op_timeout,
                         replay_root, triage, op_start)


# --- the fake process boundary ---------------------------------------------------------------------
REAL_START = launch.start
UNCLAIMED_RUN_DIR = rundir.unclaimed_run_dir
class Clock:
    """batch's `time`: monotonic() moves only when a fake child takes its time."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@dataclasses.dataclass
class Step:
    """What one started child does: what it writes into its --run-dir (rows/observed; None: no run
    dir), its log text, its exit code (None: still running when the timeout ran out), its time."""

    code: int | None = 0
    rows: list[dict] | None = None
    observed: dict | None = None
    log: str = ""
    seconds: float = 1.0
    during: object = None  # called while it "runs" (the batch waits on it)
    running_left: bool = True  # its guard's .running is still there when it ends


def row(status="SUCCESS", timer="direct", markers=(), **kw) -> dict:
    return result_row(status=status, timer=timer, markers=list(markers), **kw)


def write_run(out: Path, rows: list[dict] | None, observed: dict | None = None, name: str = "run") -> Path:
    run = out / name
    run.mkdir(parents=True, exist_ok=True)
    (run / rundir.RUN_JSON).write_text(json.dumps({"observed": observed or {}}))
    if rows is not None:
        (run / rundir.RESULTS_JSON).write_text(json.dumps({"format": 1, "rows": rows}))
    (run / rundir.RUN_LOG).write_text("run log\n")
    return run


class FakeChild:
    def __init__(self, launcher, step: Step, pid: int):
        self.launcher, self.step, self.pid = launcher, step, pid
        self.stops: list[float] = []

    def wait(self, timeout=None):
        self.launcher.waits.append((self.pid, timeout, set(self.launcher.runner_children())))
        self.launcher.clock.now += self.step.seconds
        if self.step.during is not None:
            self.step.during()
        return self.step.code

    def stop(self, grace_s, signum=signal.SIGTERM):
        self.stops.append(grace_s)
        return -signum


class FakeWorker:
    """A device's warm worker (forkserver.Worker): each op it forks is one of the launcher's steps, its
    call marked `forked_by` this worker."""

    def __init__(self, launcher, log):
        self.launcher, self.log = launcher, log
        self.begun = self.closed = self.died = False

    def begin(self):
        self.begun = True

    def start(self, argv, log, on_stdout, guard=None, gate=None):
        assert self.begun and not self.closed
        index = self.launcher.workers.index(self)
        on_stdout(f"forked {argv[0]}\n")  # as the worker's pump hands on each line of the op's stdout
        return self.launcher.child([sys.executable, "-m", "harness", *argv], guard, log, {"forked_by": index})

    def close(self):
        self.closed = True


class Launcher:
    """launch.start for batch: steps per target (the op's `record` target, the replayed run dir or
    the upstream pytest node); the last step of a target repeats."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.plan: dict[str, list[Step]] = {}
        self.calls: list[dict] = []
        self.children: list[FakeChild] = []
        self.waits: list[tuple] = []
        self.workers: list[FakeWorker] = []
        self.runner = None

    def runner_children(self):
        return self.runner.children if self.runner is not None else {}

    def __call__(self, argv, *, log=None, **kw):
        if argv[1:3] == ["-m", "harness.providers.probe"]:  # --ops-path modules import for real, apart
            return REAL_START(argv, log=log, **kw)
        cmd = argv[argv.index("--") + 1:]
        guard = opguard.command(Path(argv[4]), cmd, kw.pop("pass_fds")[0])
        assert argv == guard, argv  # every op attempt started fresh runs under its guard, behind its start gate
        return self.child(cmd, Path(argv[4]), log, kw)

    def worker(self, log) -> FakeWorker:
        """What a batch's device thread gets for its warm worker (Batch._new_worker)."""
        self.workers.append(FakeWorker(self, log))
        return self.workers[-1]

    def child(self, cmd: list[str], running: Path, log, kw: dict) -> FakeChild:
        target = cmd[4] if cmd[2] == "harness" else cmd[3]
        steps = self.plan.get(target) or [Step(rows=[row()])]
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        if step.running_left:
            running.write_text("{}")  # the guard's .running, left when SIGKILL ends the guard
        named = Path(cmd[cmd.index("--run-dir") + 1]) if "--run-dir" in cmd else None
        if named is not None and (step.rows is not None or step.observed is not None):
            observed = step.observed or {}
            if step.code == 0 and "outcome" not in observed:  # what a run that exits 0 records
                observed = {**observed, "outcome": {"status": "COMPLETE", "exit_code": 0}}
            write_run(named.parent, step.rows, observed, named.name)
        log.write(step.log)
        self.calls.append({"cmd": cmd, "target": target, "log": log.name, "mode": log.mode, "running": str(running),
                           **kw})
        child = FakeChild(self, step, 4000 + len(self.children))
        self.children.append(child)
        return child


def status_rows(batch_dir: Path) -> list[dict]:
    with open(batch_dir / batchdir.STATUS_CSV, newline="") as f:
        return list(csv.DictReader(f))


def parse(*argv):
    """The batch's request (harness.core.commands.BatchRequest) that the command line ARGV asks."""
    return cli.parse_request(["batch", *argv])


# --- a real op that hangs, for the timeout's group kill --------------------------------------------------
# An op that starts a helper in its own process group (as the harness starts its pytest child), the
# helper deaf to SIGTERM; each appends "NAME PID" to the file argv[1] names and sleeps past any timeout.
HANGING = """
import os, signal, subprocess, sys, time
name, pids = sys.argv[2], sys.argv[1]
if name == "helper":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    subprocess.Popen([sys.executable, __file__, pids, "helper"])
with open(pids, "a") as f:
    f.write(f"{name} {os.getpid()}\\n")
time.sleep(600)
"""
HANG_ROOM_S = 10  # past an op's timeout and its stop's grace, for a loaded machine


class HangingOp:
    """Every op the batch starts fresh is HANGING, for real, under its real guard: launch.start with
    the op's command (after the guard's `--`) replaced. A start returns once the op and its helper both
    run, so the batch's timeout counts from there, whatever the load. Used as a context manager: what
    a broken stop left running is killed at its end, not left to outlive the test."""

    def __init__(self, tmp_path: Path, monkeypatch, on_start=None):
        self.pids, self.script = tmp_path / "hanging_pids", tmp_path / "hanging_op.py"
        self.script.write_text(HANGING)
        self.on_start = on_start  # given the op's own command as it starts
        self.started: dict[str, str] = {}  # "op", "helper" -> pid
        self.running = threading.Event()
        self.real_start = launch.start
        monkeypatch.setattr(launch, "start", self.start)

    def start(self, argv, **kwargs):
        guard, cmd = argv[:argv.index("--") + 1], argv[argv.index("--") + 1:]
        # Its guard runs it at once, not at the batch's go (opguard.passed_gate), which comes only once this
        # start returned: here, once the op runs.
        guard = [a for a in guard if not a.startswith("--gate=")]
        if self.on_start is not None:
            self.on_start(cmd)
        child = self.real_start([*guard, sys.executable, str(self.script), str(self.pids), "op"], **kwargs)
        if wait_for(self._both_started, 60, interval=0.1):
            self.running.set()
        return child

    def _both_started(self) -> bool:
        lines = self.pids.read_text().split("\n") if self.pids.exists() else []
        self.started.update(line.split() for line in lines if line)
        return {"op", "helper"} <= set(self.started)

    def ended_by_its_timeout(self, runner: batch.Batch, call, *args):
        """What `call(*args)`, the runner's, returns once the op's timeout ended the op, which must be
        within that timeout and the stop's grace: else TimeoutError, once the runner's stop (a Ctrl-C's)
        ended it, so a timeout not taken fails the test in seconds instead of hanging it."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(call, *args)
            try:
                assert self.running.wait(60), self.started
                return future.result(timeout=runner.opts.op_timeout + batch.KILL_GRACE_S + HANG_ROOM_S)
            finally:
                runner.stop()

    def left(self, within_s: float = 10) -> list[int]:
        """The op's processes still running after `within_s` (none, once its group was ended)."""
        wait_for(lambda: not any(alive(int(pid)) for pid in self.started.values()), within_s)
        return [int(pid) for pid in self.started.values() if alive(int(pid))]

    def __enter__(self) -> HangingOp:
        return self

    def __exit__(self, *exc) -> None:
        for pid in self.left(within_s=0):
            os.kill(pid, signal.SIGKILL)
