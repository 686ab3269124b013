"""The device gate (harness.measure.device_gate): one holder at a time across processes (each open of the
lock file is a holder of its own, as another process's is), a section let go inside a held one, and
Triton's compile hooks letting it go for the length of a compile, in front of the hooks that were there;
the role of its holder, which a corpus A/B charges a wait to."""

import contextlib
import os
import threading
import time

import pytest

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

        about_to_take = threading.Event()

        def time_a_row():
            about_to_take.set()
            with timed.held():
                order.append("timed")

        thread = threading.Thread(target=time_a_row)
        thread.start()
        assert about_to_take.wait(10)  # a loaded machine may start the thread late: held until it asks
        time.sleep(0.3)
        order.append("beside lets go")
    thread.join(10)
    assert order == ["beside lets go", "timed"]
    assert timed.facts()["waits"] == 1 and timed.facts()["waited_s"] > 0 and beside.facts()["held"] == 1
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


def test_the_gate_names_the_role_of_its_holder_while_it_holds_it_and_none_after(tmp_path, monkeypatch):
    path = tmp_path / "device.gate"
    timed, beside = device_gate.DeviceGate(path, role=device_gate.TIMED), device_gate.DeviceGate(path)
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
    for text in (f"{device_gate.TIMED} 999999999", f"{device_gate.TIMED} 0", f"{device_gate.TIMED} -1",
                 f"{device_gate.TIMED} {10 ** 30}", "", "x" * 10_000):
        path.write_text(text)
        assert device_gate.held_by(path) is None, text
    os.mkfifo(tmp_path / "fifo")
    opened: list[str] = []
    monkeypatch.setattr(device_gate.os, "open", lambda p, *a, real=os.open: opened.append(str(p)) or real(p, *a))
    paths = (tmp_path / "fifo", tmp_path, tmp_path / "none", "/dev/zero", None)
    assert [device_gate.held_by(p) for p in paths] == [None] * 5
    assert opened == []  # no device, FIFO or dir opened: only a regular file is read


@pytest.mark.parametrize("holder, charged", [(None, "beside_op"), ("beside", "beside_op"), ("timed", "timed_op")])
def test_a_corpus_chunk_charges_the_op_holding_the_device_when_its_repeat_and_a_step_beside_both_run(
        tmp_path, monkeypatch, holder, charged):
    # A record hung in a case makes the repeat wait, a repeat hung timing a row the step beside: the time is the
    # holder's op's, and the step beside's where neither holds the device (it compiles).
    import json
    import types

    from harness.sessions import corpus_ab

    gate = tmp_path / "device.gate"
    held = device_gate.DeviceGate(gate, role=holder) if holder else None
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


def test_a_name_the_gate_cannot_write_never_keeps_the_device_held(tmp_path, monkeypatch):
    path = tmp_path / "device.gate"
    gate = device_gate.DeviceGate(path, role=device_gate.TIMED)

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(device_gate.os, "pwrite", full)
    monkeypatch.setattr(device_gate.os, "ftruncate", full)
    with gate.held():
        assert not _taken_by_another(path)
    assert _taken_by_another(path) and gate.facts()["held"] == 1
    gate.close()


def test_a_run_beside_gets_the_settle_it_is_given_and_a_timed_one_its_role(tmp_path, monkeypatch):
    monkeypatch.setattr(device_gate.os, "nice", lambda n: None)
    monkeypatch.setattr(device_gate.os, "sched_setaffinity", lambda pid, cpus: None)
    settle = object()
    beside = device_gate.open_gate(str(tmp_path / "g"), beside=True, settle=settle)
    timed = device_gate.open_gate(str(tmp_path / "g"), beside=False, settle=settle)
    assert (beside.role, beside.settle, timed.role, timed.settle) == (device_gate.BESIDE, settle, device_gate.TIMED,
                                                                      None)
    beside.close()
    timed.close()


@pytest.mark.parametrize("device_type, touched, freed", [("cuda", True, True), ("cuda", False, False),
                                                          ("cpu", True, False)])
def test_a_run_beside_gives_its_cached_device_memory_back_after_each_case_while_it_holds_the_gate(
        tmp_path, monkeypatch, device_type, touched, freed):
    # Several records at once (--record-jobs): a case's inputs cached by its allocator would be held from the
    # next record's cases. A stand-in device module records what the plugin asks of it, and whether the gate
    # was still held then.
    import types

    import torch

    from harness.child.plugins.device_gate import DeviceGatePlugin

    monkeypatch.setattr(device_gate.os, "nice", lambda n: None)
    monkeypatch.setattr(device_gate.os, "sched_setaffinity", lambda pid, cpus: None)
    path = tmp_path / "device.gate"
    asked: list[tuple[str, bool]] = []
    stand_in = types.SimpleNamespace(synchronize=lambda: asked.append(("synchronize", not _taken_by_another(path))),
                                     empty_cache=lambda: asked.append(("empty_cache", not _taken_by_another(path))))
    monkeypatch.setattr(torch, "cuda", stand_in)
    backend = types.SimpleNamespace(torch_device_type=device_type, device_touched=lambda: touched,
                                    compiles_kernels=False)
    ctx = types.SimpleNamespace(spec=types.SimpleNamespace(token_timing=True, device_gate=str(path)), backend=backend,
                                run_dir=tmp_path)
    plugin = DeviceGatePlugin(ctx)
    for _ in range(2):  # each case
        case = plugin.pytest_runtest_call(item=None)
        next(case)
        assert not _taken_by_another(path)  # held while the case runs
        with pytest.raises(StopIteration):
            case.send(None)
        assert _taken_by_another(path)
    plugin.pytest_unconfigure(config=None)
    assert asked == ([("synchronize", True), ("empty_cache", True)] * 2 if freed else [])
