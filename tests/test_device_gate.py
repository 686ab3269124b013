"""The device gate (harness.measure.device_gate): one holder at a time across processes (each open of the
lock file is a holder of its own, as another process's is), a section let go inside a held one, and
Triton's compile hooks letting it go for the length of a compile, in front of the hooks that were there."""

import threading
import time

import pytest

from harness.measure import device_gate


def _taken_by_another(path) -> bool:
    """Whether another holder could take the gate now (without waiting)."""
    import fcntl
    import os

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
