"""The leader of a batch op's process group: the op dies with its batch, even a batch killed by SIGKILL.

`python -m harness.core.opguard BATCH_PID RUNNING_FILE [--gate=FD] -- CMD...` is what a batch starts (in
a new session) for each op attempt; with a gate it first waits there for the batch's go (passed_gate), and
runs nothing when the batch's stop came first. It runs CMD (`python -m harness record|replay ...`, which starts
the pytest child in the same group) and ends with CMD's exit status, a signal included. Meanwhile
it watches its parent pid: once the batch is gone, however it died, it terminates the whole group
(SIGTERM, then SIGKILL after a grace), so no op of a dead batch keeps running and would overlap,
on the same device, the batch that resumes it. Watching the parent needs nothing from the dying
batch; PR_SET_PDEATHSIG would be Linux-only and fires when the *thread* that forked exits.

While it runs it holds an exclusive flock on RUNNING_FILE, which names the group. The kernel
drops that lock the moment this process dies, so `stop_leftover` (run by `--resume`) tells a live
leftover from a stale file, and from a recycled pid, without comparing start times.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.core import bounded, launch, rundir

RUNNING = ".running"
RUNNING_CHARS = 64 * 1024  # far more than its one line of JSON: a file grown past it is not read whole
POLL_S = 0.2
GRACE_S = 3.0  # for the op's own SIGTERM handling (it writes its outcome) once its batch is gone


def command(running: Path, cmd: list[str], gate: int | None = None) -> list[str]:
    """The guard around CMD, for the batch (this process) that starts it; with `gate`, a descriptor the
    guard inherits, it waits there for the batch's go before it does anything (passed_gate)."""
    return [sys.executable, "-m", "harness.core.opguard", str(os.getpid()), str(running),
            *([f"--gate={gate}"] if gate is not None else []), "--", *cmd]


GO = launch.GATE_GO


def passed_gate(gate: int) -> bool:
    """Wait at `gate`, a pipe's read end, for the starter's go (GO), and close it. False when the
    starter closed it without one (its stop came first, or it died): then nothing of the op may run."""
    try:
        return os.read(gate, 1) == GO
    finally:
        os.close(gate)


def _end_group(proc: subprocess.Popen, running: Path) -> None:
    os.killpg(0, signal.SIGTERM)  # this process ignores it (see main)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    running.unlink(missing_ok=True)
    os.killpg(0, signal.SIGKILL)  # what is left of the group, this process included


def hold(running: Path, batch_pid: int, cmd: list[str]):
    """Take RUNNING_FILE's lock for this process, the leader of its op's group, and name the group
    in it: the guard does, and so does a step that a batch's warm worker forked (harness.core.forkserver),
    whose lock its forked children share. Returns the open file: the lock lasts while any of them holds it."""
    # Written and locked aside, then renamed into place: whoever opens RUNNING_FILE (a resume, a batch
    # watching its op) finds it whole and locked, never empty or part-written.
    aside = running.with_name(f"{running.name}.{os.getpid()}.new")
    f = rundir.open_write(aside, "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX)
        json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "batch_pid": batch_pid, "command": cmd}, f)
        f.flush()
        os.replace(aside, running)
    except BaseException:
        f.close()
        aside.unlink(missing_ok=True)
        raise
    return f


def main(argv: list[str]) -> int:
    head, cmd = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    batch_pid, running = int(head[0]), Path(head[1])
    gate = next((int(a.split("=", 1)[1]) for a in head[2:] if a.startswith("--gate=")), None)
    if gate is not None and not passed_gate(gate):
        return 128 + signal.SIGTERM  # the batch stopped before this op's start: exits as a stopped op does
    with hold(running, batch_pid, cmd):
        if os.getppid() != batch_pid:  # the batch died before this process got here
            running.unlink(missing_ok=True)
            return 1
        # The batch stops an op with SIGTERM to the whole group: the op handles it, and this process
        # ends when the op does. A Python handler, not SIG_IGN, which the op would inherit.
        signal.signal(signal.SIGTERM, lambda *_: None)
        launch.adopt_orphans()  # what the op leaves running, setsid or not, ends with it (below)
        proc = subprocess.Popen(cmd)
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if os.getppid() != batch_pid:
                    _end_group(proc, running)
        launch.end_orphans()
        running.unlink(missing_ok=True)
    if code < 0:  # the op died of a signal: so does this process, so the batch sees the same status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def stop_leftover(running: Path, grace_s: float) -> dict | None:
    """Stop what still runs of the op group RUNNING_FILE names (an op of a dead batch), and remove
    the file. Returns the file's facts when something was stopped, else None."""
    problem = bounded.path_problem(running, "file")
    if problem == "does not exist":
        return None
    if problem is not None:  # opened, a FIFO would hang the resume; read, a device would fill memory
        raise bounded.InputRefused(f"{running} {problem}: it names the group of an op of a dead batch; remove it")
    with open(running, "rb") as f:
        facts = _facts(running, f.read(RUNNING_CHARS + 1))
        stopped = None
        if facts is None:
            pass  # the guard died before it wrote anything, so before it started the op
        elif not _lock_free(f):
            # Its guard is alive: SIGTERM lets the op write its outcome; SIGCONT wakes a stopped one.
            launch.signal_group(facts["pgid"], signal.SIGTERM)
            launch.signal_group(facts["pgid"], signal.SIGCONT)
            if not _wait_lock_free(f, grace_s):
                launch.signal_group(facts["pgid"], signal.SIGKILL)
                _wait_lock_free(f, grace_s)
            launch.signal_group(facts["pgid"], signal.SIGKILL)  # whatever of the group outlived its leader
            stopped = facts
        elif not _exists(facts["pid"]) and launch.signal_group(facts["pgid"], 0):
            # The guard is gone but part of its group is not: a group id is never reused while the
            # group has members, so these are the op's. (A live process with the guard's pid is
            # another process that got a recycled pid: left alone.)
            launch.signal_group(facts["pgid"], signal.SIGKILL)
            stopped = facts
    running.unlink(missing_ok=True)
    return stopped


def _facts(running: Path, data: bytes) -> dict | None:
    """What RUNNING_FILE says (None when empty: its guard died before it wrote), checked before any of it
    is signalled: ids above 1, and never this process's own group. A file planted or
    torn there (`"pgid": 0` would SIGKILL the resuming batch itself, 1 init's group) is refused in one line."""
    if not data.strip():
        return None
    try:
        facts = json.loads(data.decode("utf-8")) if len(data) <= RUNNING_CHARS else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        facts = None
    ids = [facts.get(k) for k in ("pid", "pgid", "batch_pid")] if isinstance(facts, dict) else [None]
    if not (all(type(i) is int and i > 1 for i in ids) and facts["pgid"] != os.getpgid(0)):
        raise bounded.InputRefused(f"{running} is corrupt: not the guard's pid, process group and batch pid "
                                   "(positive integers, a group not this process's); it names the group of an op "
                                   "of a dead batch: remove it")
    return facts


def _lock_free(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(f, fcntl.LOCK_UN)
    return True


def _wait_lock_free(f, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not _lock_free(f):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
