"""The device gate (harness.measure.device_gate): one holder at a time across processes (each open of the
lock file is a holder of its own, as another process's is), a section let go inside a held one, and
Triton's compile hooks letting it go for the length of a compile, in front of the hooks that were there;
the runs beside paused while a row is timed (real processes), and resumed where the timed run died."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, group_pids, wait_for

from harness.measure import device_gate


def _taken_by_another(path) -> bool:
    """Whether another holder could take the gate now (without waiting)."""
    import fcntl
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def test_a_holder_keeps_the_device_until_it_lets_go_and_the_other_waits_for_it(tmp_path):
    path = tmp_path / "device.gate"
    timed, beside = device_gate.DeviceGate(path), device_gate.DeviceGate(path)
    order: list[str] = []
    with beside.held():
        with beside.held():  # nested: still one hold
            pass
        assert not _taken_by_another(path)

        def time_a_row():
            with timed.held():
                order.append("timed")

        thread = threading.Thread(target=time_a_row)
        thread.start()
        time.sleep(0.3)
        order.append("beside lets go")
    thread.join(10)
    assert order == ["beside lets go", "timed"]
    assert timed.facts()["waits"] == 1 and timed.facts()["waited_s"] > 0.1 and beside.facts()["held"] == 1
    assert _taken_by_another(path)
    timed.close()
    beside.close()


def test_a_released_section_lets_another_in_and_takes_the_device_back_after(tmp_path):
    path = tmp_path / "device.gate"
    gate = device_gate.DeviceGate(path)
    with gate.held():
        with gate.released():
            assert _taken_by_another(path) and not gate.holding
        assert gate.holding and not _taken_by_another(path)
    assert _taken_by_another(path)
    with gate.released():  # outside a held section: nothing to let go
        assert not gate.holding
    assert gate.facts()["released"] == 1 and gate.facts()["held"] == 2
    with gate.held():
        gate.release()  # a compile that raised: its post-compile hook never comes
    with gate.held():
        assert gate.holding and not _taken_by_another(path)
        gate.release()  # the next compile lets it go as any other
        assert _taken_by_another(path)
    gate.close()


@pytest.fixture
def hooks():
    knobs = pytest.importorskip("triton").knobs
    before = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
    yield knobs.runtime
    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before


@pytest.mark.parametrize("handled", [False, True])
def test_a_compile_lets_the_gate_go_before_the_hooks_there_run_and_takes_it_back_after(tmp_path, hooks, handled):
    path = tmp_path / "device.gate"
    gate = device_gate.DeviceGate(path)
    seen: list[tuple[str, bool]] = []

    def earlier(**kw):  # a hook installed before (Ahead waiting on its pool): runs with the gate let go
        seen.append(("cache", _taken_by_another(path)))
        return handled

    hooks.jit_cache_hook = earlier
    hooks.jit_post_compile_hook = lambda **kw: seen.append(("post", _taken_by_another(path)))
    release = device_gate.CompileRelease(gate)
    with gate.held():
        release.install()
        assert hooks.jit_cache_hook(key="k") is handled
        if not handled:  # the JIT compiled: its post-compile hook ends the compile
            assert _taken_by_another(path)
            hooks.jit_post_compile_hook(key="k")
        assert not _taken_by_another(path)  # held again for the launch that follows
        release.uninstall()
    assert hooks.jit_cache_hook is earlier
    assert seen == [("cache", True)] + ([] if handled else [("post", False)])
    gate.close()


@pytest.mark.parametrize("cores, left", [(16, 14), (4, 4)])
def test_a_run_beside_the_timing_lowers_its_cpu_priority_and_leaves_cores_to_the_timed_one(tmp_path, monkeypatch,
                                                                                          cores, left):
    niced: list[int] = []
    pinned: list[set] = []
    monkeypatch.setattr(device_gate.os, "nice", niced.append)
    monkeypatch.setattr(device_gate.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(device_gate.os, "sched_setaffinity", lambda pid, cpus: pinned.append(set(cpus)))
    assert device_gate.open_gate(None, beside=True) is None and niced == [] and pinned == []
    device_gate.open_gate(str(tmp_path / "g"), beside=False).close()
    assert niced == [] and pinned == []
    device_gate.open_gate(str(tmp_path / "g"), beside=True).close()
    assert niced == [device_gate.BESIDE_NICENESS]
    assert pinned == ([set(range(left))] if left < cores else [])  # a small host: nothing to leave


# --- the runs beside paused while a row is timed --------------------------------------------------------
BESIDE = """
import os, sys, time
from harness.measure import device_gate
if os.fork() == 0:  # the step's run (its pytest child), in the step's group: it opens the gate
    gate = device_gate.open_gate(sys.argv[1], beside=True)
    pool = os.fork()
    if pool == 0:  # its compile pool
        while True:
            time.sleep(0.01)
    print(int(gate.registered is not None), os.getpid(), pool, flush=True)
while True:
    time.sleep(0.01)
"""
TIMED = """
import sys, time
from harness.measure import device_gate
gate = device_gate.open_gate(sys.argv[1], beside=False)
with gate.held():
    print("timing", flush=True)
    time.sleep(600)
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _stopped(pids) -> list[bool]:
    return [_state(p) == "T" for p in pids]


def _python(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)


def _end(*procs) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
        assert wait_for(lambda pgid=proc.pid: not group_pids(pgid), 30)


@pytest.fixture
def linux_proc():
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("pausing the runs beside reads /proc (Linux)")


def test_a_timed_row_pauses_the_runs_beside_and_their_pools_while_it_holds_the_device_and_nothing_else(
        tmp_path, linux_proc):
    path = tmp_path / "device.gate"
    beside, other = _python(BESIDE, path), _python("import time; print(1, flush=True); time.sleep(600)")
    try:
        registered, run, pool = map(int, beside.stdout.readline().split())
        assert registered == 1 and other.stdout.readline() == "1\n"
        # A file left by a run beside that is gone, whose pid another process took: never paused.
        (tmp_path / "device.gate.beside" / str(other.pid)).write_text("1")
        assert device_gate.beside_groups(path) == [beside.pid]
        timed = device_gate.open_gate(str(path), beside=False)
        with timed.held():
            assert wait_for(lambda: _stopped([beside.pid, run, pool]) == [True] * 3, 10, 0.05)
            assert _state(other.pid) != "T"
            with timed.held():  # nested: still the one pause
                time.sleep(0.05)
            assert _stopped([beside.pid, run, pool]) == [True] * 3
        assert wait_for(lambda: _stopped([beside.pid, run, pool]) == [False] * 3, 10, 0.05)
        facts = timed.facts()
        assert facts["paused"] == 1 and facts["paused_s"] > 0 and facts["held"] == 1
        timed.close()
    finally:
        _end(beside, other)


def test_a_run_beside_registers_its_group_and_ends_its_registration_as_it_closes(tmp_path, linux_proc):
    path = tmp_path / "device.gate"
    gate = device_gate.DeviceGate(path)
    gate.registered = device_gate.register_beside(path)
    assert gate.registered.name == str(os.getpgrp())
    assert device_gate.beside_groups(path) == []  # never this process's own group
    gate.close()
    assert not any((tmp_path / "device.gate.beside").glob("*"))


def test_a_timed_run_killed_mid_row_leaves_the_runs_beside_paused_until_its_ab_resumes_them(tmp_path, linux_proc):
    path = tmp_path / "device.gate"
    beside = _python(BESIDE, path)
    timed = None
    try:
        _, run, pool = map(int, beside.stdout.readline().split())
        timed = _python(TIMED, path)
        assert timed.stdout.readline() == "timing\n"
        assert wait_for(lambda: _stopped([beside.pid, run, pool]) == [True] * 3, 10, 0.05)
        timed.kill()
        timed.wait(30)
        assert _stopped([beside.pid, run, pool]) == [True] * 3  # nothing resumed them
        assert device_gate.resume_beside(path) == 1
        assert wait_for(lambda: _stopped([beside.pid, run, pool]) == [False] * 3, 10, 0.05)
    finally:
        _end(beside, *([timed] if timed else []))


def test_a_run_beside_settles_its_device_work_each_time_it_lets_the_gate_go_and_only_then(tmp_path):
    settled: list[bool] = []
    path = tmp_path / "device.gate"
    gate = device_gate.DeviceGate(path, settle=lambda: settled.append(_taken_by_another(path)))
    gate.release()  # not held: nothing to let go
    with gate.held():
        gate.release()
        gate.release()  # nested: let go once
        gate.reacquire()
        gate.reacquire()
    assert settled == [False]  # once, before another could take it
    gate.close()


def test_an_ab_resumes_the_runs_beside_after_each_timed_step_however_it_ended(tmp_path, monkeypatch, linux_proc):
    # The timed step's process was killed while it timed a row (the runs beside paused): its A/B's step ends by
    # resuming them, so nothing it started stays stopped.
    from harness.core.options import RunOptions
    from harness.core.request import RunRequest
    from harness.sessions import ab

    path = tmp_path / "device.gate"
    beside = _python(BESIDE, path)
    plan = ab.Plan(name="t", ops=["add"], a=ab.Side("A", ""), b=ab.Side("B", ""), repeats=2,
                   options=RunOptions(backend="interpreter"))
    runner = ab.Runner(plan, tmp_path)
    runner.gate = path

    def killed_mid_row(side, request, host=None):
        timed = _python(TIMED, path)
        assert timed.stdout.readline() == "timing\n"
        assert wait_for(lambda: _stopped([beside.pid, run, pool]) == [True] * 3, 10, 0.05)
        timed.kill()
        timed.stdout.close()
        return timed.wait(30), None

    monkeypatch.setattr(runner, "_launch", killed_mid_row)
    try:
        _, run, pool = map(int, beside.stdout.readline().split())
        request = RunRequest("replay", str(tmp_path / "record"), run_dir=tmp_path / "add" / "A-1" / "run")
        assert runner.step(plan.a, request, "[1/1 add] repeat 1/2: A replays A") is None
        assert _stopped([beside.pid, run, pool]) == [False] * 3
        assert runner.state["steps"][-1]["exit"] == -signal.SIGKILL
    finally:
        runner.close()
        _end(beside)


def test_the_gate_names_the_role_of_its_holder_while_it_holds_it_and_none_after(tmp_path):
    path = tmp_path / "device.gate"
    timed, beside = device_gate.DeviceGate(path, pauses=True), device_gate.DeviceGate(path)
    assert device_gate.held_by(path) is None
    with timed.held():
        assert device_gate.held_by(path) == device_gate.TIMED
    with beside.held():
        assert device_gate.held_by(path) == device_gate.BESIDE
        with beside.released():  # compiling: no one holds it
            assert device_gate.held_by(path) is None
    assert device_gate.held_by(path) is None
    timed.close()
    beside.close()
    # A holder killed with the gate left its name; what an ab.json names may be anything.
    path.write_text(f"{device_gate.TIMED} 999999999")
    assert device_gate.held_by(path) is None
    os.mkfifo(tmp_path / "fifo")
    assert [device_gate.held_by(p) for p in (tmp_path / "fifo", tmp_path, tmp_path / "none", None)] == [None] * 4


@pytest.mark.parametrize("holder, charged", [(None, "beside_op"), ("beside", "beside_op"), ("timed", "timed_op")])
def test_a_corpus_chunk_charges_the_op_holding_the_device_when_its_repeat_and_a_step_beside_both_run(
        tmp_path, monkeypatch, holder, charged):
    # A repeat hung timing a row pauses the step beside (and a record hung in a case makes the repeat wait): the
    # time is the holder's op's, and the step beside's where neither holds the device (it compiles).
    import json
    import types

    from harness.sessions import corpus_ab

    gate = tmp_path / "device.gate"
    held = device_gate.DeviceGate(gate, pauses=holder == "timed") if holder else None
    now = time.time()
    step = {"side": "A", "args": ["replay"], "started": now - 100}
    ab_json = tmp_path / "ab.json"
    ab_json.write_text(json.dumps({
        "plan": {"backend": "interpreter", "repeats": 2}, "steps": [], "device_gate": str(gate),
        "running": {**step, "what": "timed_op repeat", "run_dir": str(tmp_path / "timed_op" / "A-1" / "r")},
        "running_beside": {**step, "what": "beside_op record",
                           "run_dir": str(tmp_path / "beside_op" / "A-record" / "r")}}))
    names = {"timed_op": "timed entry", "beside_op": "beside entry"}
    runner = types.SimpleNamespace(opts=types.SimpleNamespace(op_timeout=60))
    with held.held() if held else contextlib.nullcontext():
        assert corpus_ab.CorpusAB._overdue(runner, ab_json, names) == [names[charged]]
    if held:
        held.close()
