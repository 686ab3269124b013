"""What a run leaves running is ended by several layers, each tested here alone (tests/test_leftovers.py: all of
them together, end to end). Each test builds a process tree that only its layer can reach: the harness process
that owns the layer runs in a fork of this one, and none of the other layers runs in that tree.

Sweeps: a process that adopted orphans (launch.adopt_orphans: what its tree leaves is reparented to it) ends them
(launch.end_orphans). Their leftover is a daemon (setsid, its parent gone), out of reach of any group kill.
1. The pytest child, once its run ends (harness.child.runner.entry).
2. A step, once its child ended (launch.run, in `python -m harness`, which adopted in harness.__main__): what the
   child could not sweep itself (killed outright, or gone by os._exit).
3. A forked step, once it ends (harness.worker._step): what it left outside launch.run.
4. A warm worker, once each step ended (forkserver.serve): what a step killed outright left.
5. A fresh batch op's guard, once the op ended (opguard.main).
6. A batch, once its ops are done (Batch.run, in `python -m harness batch`): what an op's guard, killed outright,
   left.
Group kills: SIGTERM, then SIGKILL, to an op's process group. Their leftover is a helper in the group that
ignores SIGTERM, and that no sweep ends.
7. A batch's, on --op-timeout or stop() (Batch._watched, Batch.stop).
8. An op's guard's, once its batch is gone, however it died (opguard._end_group).

Each test but the last runs twice: with its layer switched off the leftover must live on (nothing else reaches
it), so with it on, that layer alone ended it. The last layer acts on its own clock: switched off, its leftover
would only outlive a deadline.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from batch_fakes import ADD, options
from conftest import alive, group_pids, wait_for

from harness import __main__ as harness_main
from harness import cli, worker
from harness.child import runner as pytest_child
from harness.core import forkserver, launch, opguard
from harness.core.batchdir import StatusRow
from harness.sessions import batch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a subreaper (PR_SET_CHILD_SUBREAPER) and /proc")

# Leaves a `sleep` as a daemon is left: forked twice, in a session of its own, the process between them gone. No
# group kill reaches it, and its parent is the nearest subreaper above the process that ran this (init where there
# is none): only a sweep ends it. Its pid is in argv[1] once this script has ended.
LEAVES_A_DAEMON = """
import os, sys
middle = os.fork()
if middle == 0:
    os.setsid()
    daemon = os.fork()
    if daemon == 0:
        os.execvp("sleep", ["sleep", "60"])
    with open(sys.argv[1], "w") as f:
        f.write(str(daemon))
    os._exit(0)
os.waitpid(middle, 0)
"""

# A helper that ignores SIGTERM, its pid in $0 once it does.
DEAF_HELPER = 'trap "" TERM; echo $$ > "$0.part"; mv "$0.part" "$0"; exec sleep 60'


def op_with_a_deaf_helper(helper_file: Path) -> list[str]:
    """An op that ends on SIGTERM, and its DEAF_HELPER in its group: once a SIGTERM to the group took the op,
    only a SIGKILL to the group ends the helper."""
    return ["sh", "-c", 'sh -c "$1" "$0" & exec sleep 60', str(helper_file), DEAF_HELPER]


def leave_a_daemon(daemon_file: Path) -> int:
    """What a run that leaves a daemon does, in the process that calls it; 0, the exit code of a run that passed."""
    subprocess.run([sys.executable, "-c", LEAVES_A_DAEMON, str(daemon_file)], check=True)
    return 0


def daemon_ended(daemon_file: Path) -> bool:
    return not alive(int(daemon_file.read_text()))


def finished(child: launch.Child) -> int:
    """Its exit code; a layer that hangs is killed and fails the test instead of holding it."""
    code = child.wait(10)
    if code is None:
        child.kill()
        code = child.wait()
    return code


def end_ours(pid: int) -> None:
    """SIGKILL and reap `pid` if it was reparented to this process (conftest makes it the subreaper of what the
    tests leave): what a switched-off layer left. A pid that is not ours may be another process's by now."""
    if pid in launch.children():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def end_group(pgid: int) -> None:
    """SIGKILL what is left of process group `pgid` and, once it is gone, reap its members: they came to this
    process, the subreaper of all of theirs that died."""
    launch.signal_group(pgid, signal.SIGKILL)
    wait_for(lambda: not group_pids(pgid), 5, interval=0.02)
    for pid in launch.children():
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            if os.getpgid(pid) == pgid:
                os.waitpid(pid, 0)


def sigkilled_already(pid: int) -> bool:
    """Whether `pid`, a child of this process, got a SIGKILL before now (a SIGUSR1 ends it otherwise); reaped."""
    os.kill(pid, signal.SIGUSR1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == -signal.SIGKILL


@pytest.fixture
def daemon_file(tmp_path):
    """Where the daemon's pid is written; a daemon that no layer ended is ended after the test."""
    path = tmp_path / "daemon.pid"
    yield path
    if path.exists():
        end_ours(int(path.read_text()))


@pytest.fixture(params=[True, False], ids=["layer-on", "layer-off"])
def layer_on(request, monkeypatch) -> bool:
    """A sweep as it is, or switched off: end_orphans a no-op in the processes the test forks."""
    if not request.param:
        monkeypatch.setattr(launch, "end_orphans", lambda: 0)
    return request.param


# --- sweeps -------------------------------------------------------------------------------------------------
def test_the_pytest_child_ends_what_its_run_left(daemon_file, layer_on, monkeypatch):
    monkeypatch.setattr(pytest_child, "main", lambda argv: leave_a_daemon(daemon_file))
    assert finished(launch.start(["(the pytest child)"], call=lambda: pytest_child.entry([]))) == 0
    assert daemon_ended(daemon_file) is layer_on


def test_a_step_ends_what_its_child_left(daemon_file, layer_on, monkeypatch):
    def record() -> int:  # its child has no sweep of its own, as one killed outright
        code, _ = launch.run(["(the pytest child)"], grace_s=5, call=lambda: leave_a_daemon(daemon_file))
        return code

    monkeypatch.setattr(harness_main, "_run", record)
    assert finished(launch.start(["python -m harness record"], call=harness_main.main)) == 0
    assert daemon_ended(daemon_file) is layer_on


def test_a_forked_step_ends_what_it_left_itself(daemon_file, layer_on, monkeypatch):
    monkeypatch.setattr(cli, "main", lambda argv: leave_a_daemon(daemon_file))
    assert finished(launch.start(["(a forked step)"], call=lambda: worker._step(["record"]))) == 0
    assert daemon_ended(daemon_file) is layer_on


def test_a_warm_worker_ends_what_each_step_left(daemon_file, layer_on):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def warm_worker() -> int:
        ours.close()  # its end closes when the test's does
        launch.adopt_orphans()  # as harness.worker.main does
        return forkserver.serve(theirs, lambda argv: leave_a_daemon(daemon_file))  # a step without sweeps

    child = launch.start(["(a warm worker)"], call=warm_worker)
    theirs.close()
    try:
        assert forkserver.recv(ours)[0] == {"ready": child.pid}
        with open(os.devnull, "w") as null:
            forkserver.send(ours, {"argv": []}, (null.fileno(), null.fileno()))
        assert "pid" in forkserver.recv(ours)[0]
        assert forkserver.recv(ours)[0] == {"exit": 0}  # sent once the step's leftovers were swept
        assert daemon_ended(daemon_file) is layer_on
    finally:
        ours.close()  # the worker then ends
        finished(child)


def test_an_ops_guard_ends_what_its_op_left(tmp_path, daemon_file, layer_on):
    batch_pid = os.getpid()  # the guard's parent, as its batch is
    op = [sys.executable, "-c", LEAVES_A_DAEMON, str(daemon_file)]  # an op without sweeps
    guard = launch.start(["(an op's guard)"],
                         call=lambda: opguard.main([str(batch_pid), str(tmp_path / opguard.RUNNING), "--", *op]))
    assert finished(guard) == 0
    assert daemon_ended(daemon_file) is layer_on


def test_a_batch_ends_what_its_ops_left_once_they_are_done(tmp_path, daemon_file, layer_on, monkeypatch):
    runner = batch.Batch(tmp_path, options(op_start="fresh"), {})

    def run_op(entry, device) -> StatusRow:  # an op that left a daemon, as a guard killed outright would
        leave_a_daemon(daemon_file)
        return StatusRow(entry.op, entry.repo, status="PASS")

    monkeypatch.setattr(runner, "run_op", run_op)

    def the_batch() -> int:
        launch.adopt_orphans()  # as `python -m harness batch` does (harness.__main__)
        runner.run([ADD], on_done=lambda row: None)
        return 0

    assert finished(launch.start(["python -m harness batch"], call=the_batch)) == 0
    assert daemon_ended(daemon_file) is layer_on


# --- group kills --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_kill_on", [True, False], ids=["layer-on", "layer-off"])
@pytest.mark.parametrize("ended_by", ["op-timeout", "stop"])
def test_a_batch_kills_the_whole_group_of_an_op_it_ends(tmp_path, monkeypatch, ended_by, group_kill_on):
    if not group_kill_on:
        monkeypatch.setattr(launch.Child, "kill", lambda self: None)  # the SIGKILL that follows the SIGTERM
    runner = batch.Batch(tmp_path, options(op_timeout=0.1 if ended_by == "op-timeout" else 60), {})
    helper_file = tmp_path / "helper.pid"
    started = []

    def start_op(log, running, gate) -> launch.Child:  # no guard (its sweep would end the helper too), no gate
        started.append(launch.start(op_with_a_deaf_helper(helper_file), log=log, with_parent=False))
        assert wait_for(helper_file.exists, 10, interval=0.02)  # the op's timeout counts from here
        return started[0]

    def stop_once_watched() -> None:  # a Ctrl-C's, from the main thread while the op's device thread waits on it
        if wait_for(lambda: runner.children, 10, interval=0.02):
            runner.stop()

    stopper = threading.Thread(target=stop_once_watched)
    if ended_by == "stop":
        stopper.start()
    try:
        runner._watched(start_op, tmp_path / "batch.log")
        if ended_by == "stop":
            stopper.join()  # until its stop() is done
        assert sigkilled_already(int(helper_file.read_text())) is group_kill_on
    finally:
        if started:
            end_group(started[0].pid)


def test_an_ops_guard_kills_its_group_once_its_batch_is_gone(tmp_path, monkeypatch):
    # The guard's sweep off: it would end the helper too, reparented to the guard once the op is gone.
    monkeypatch.setattr(launch, "end_orphans", lambda: 0)
    helper_file = tmp_path / "helper.pid"

    def the_batch() -> int:
        batch_pid = os.getpid()
        # As Batch._attempt starts it: no parent-death signal, the guard's own watch ties the op to the batch.
        launch.start(["(an op's guard)"], with_parent=False, call=lambda: opguard.main(
            [str(batch_pid), str(tmp_path / opguard.RUNNING), "--", *op_with_a_deaf_helper(helper_file)]))
        time.sleep(60)
        return 0

    batch_process = launch.start(["python -m harness batch"], call=the_batch)
    try:
        assert wait_for(helper_file.exists, 10, interval=0.02)
        pgid = os.getpgid(int(helper_file.read_text()))  # the guard's, the op's and its helper's
    finally:
        batch_process.kill()  # outright: the guard's watch needs nothing from it
        batch_process.wait()
    try:
        assert wait_for(lambda: not group_pids(pgid), 5, interval=0.02), group_pids(pgid)
    finally:
        end_group(pgid)
