import types

import pytest
import torch

import backends
from harness.child.plugins.flaggems import FlagGemsPlugin
from harness.core.spec import FlagGemsOptions
from harness.measure import timers
from harness.measure.timers import Measurement, Timer, _CaptureFailed


def test_clamp_count():
    assert timers.clamp_count(25, 0.001, (1, 1000)) == 1000
    assert timers.clamp_count(25, 100, (1, 1000)) == 1
    assert timers.clamp_count(25, 1, (1, 1000)) == 25
    assert timers.clamp_count(0, 5, (0, 1000)) == 0


def test_host_timer_measures_every_side():
    marks = []
    t = Timer(backends.get("interpreter"), "auto", 0, 0, marks.append)
    timed = t.measure_pair("softmax", {"baseline": lambda: sum(range(100)), "candidate": lambda: None})
    assert timed.timer == "host" and set(timed.measurements) == {"baseline", "candidate"}
    assert all(m.timer == "host" and len(m.samples_ms) >= timers.HOST_REPS_RANGE[0]
               for m in timed.measurements.values())
    assert marks == []


class FakeGraphTimer(Timer):
    """A graph-capable timer whose graph path fails the way a test asks, without a GPU."""

    def __init__(self, error=None, alive=True):
        self.backend = backends.get("cuda")
        self.timer, self.warmup_ms, self.rep_ms = "graph", 1, 1
        self.marks, self.mark = [], None
        self.mark = self.marks.append
        self._accel = None
        self.error, self.alive, self.graph_calls = error, alive, 0

    def _graph(self, fn):
        self.graph_calls += 1
        if self.error is not None and self.graph_calls == 2:  # the candidate refuses capture
            raise _CaptureFailed("capture", RuntimeError(self.error))
        return Measurement([1.0, 1.0], "graph")

    def _direct(self, fn):
        return Measurement([2.0, 2.0], "direct")

    def _check_alive(self):
        if not self.alive:
            raise timers.CapturePoisoned("dead")


FNS = {"baseline": lambda: None, "candidate": lambda: None}


def test_graph_when_capture_works():
    t = FakeGraphTimer()
    timed = t.measure_pair("softmax", FNS)
    assert timed.timer == "graph" and t.marks == []


def test_recoverable_failure_times_both_sides_direct_with_marker():
    t = FakeGraphTimer("CUDA error: operation not permitted when stream is capturing")
    timed = t.measure_pair("softmax", FNS)
    assert timed.timer == "direct"
    assert {m.timer for m in timed.measurements.values()} == {"direct"}  # one caliber per row
    assert len(t.marks) == 1 and t.marks[0].startswith("TIMER_FALLBACK phase=capture reason=recoverable")


def test_fatal_failure_reraises_and_reports_no_number():
    t = FakeGraphTimer("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        t.measure_pair("softmax", FNS)


def test_poisoned_failure_stops_with_its_own_marker():
    t = FakeGraphTimer("CUDA error: unknown error")
    with pytest.raises(timers.CapturePoisoned):
        t.measure_pair("softmax", FNS)
    assert t.marks[0].startswith("CAPTURE_POISONED")


def test_denied_op_is_timed_directly_up_front(monkeypatch):
    t = FakeGraphTimer()
    monkeypatch.setattr(t, "backend", backends.get("musa"))
    timed = t.measure_pair("unique2", FNS)
    assert timed.timer == "direct" and t.graph_calls == 0
    assert "reason=capture_denied" in t.marks[0]


def test_measurement_summary():
    s = Measurement([1.0, 2.0, 3.0, 4.0], "graph").summary()
    assert s["n"] == 4 and s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0


class FakeResults:
    def __init__(self):
        self.rows = []

    def add_row(self, row):
        self.rows.append(row)

    def write_lines(self, lines):
        pass


def flaggems_row(timers_by_side):
    """The row FlagGemsPlugin writes for one upstream input whose two `get_latency` calls (torch,
    then the FlagGems op) our timer measured with the given timers."""
    sides = iter(timers_by_side)
    markers = []
    ctx = types.SimpleNamespace(
        spec=types.SimpleNamespace(flaggems=FlagGemsOptions("flaggems", "/x", "benchmark/test_mm.py", "test_mm"),
                                   op="flaggems:mm", seed=0),
        markers=markers, configs={}, mark=markers.append, begin_case=lambda *a: markers.clear())
    results = FakeResults()
    plugin = FlagGemsPlugin(ctx, results, measure=lambda name, fns: timers.Timed({"x": Measurement([1.0], next(sides))},
                                                                                 "unused"), autotune=None)
    bench = types.SimpleNamespace(to_bench_metrics=["latency_base", "latency"])
    plugin._begin_case(bench, torch.float32, (torch.ones(2, 3),))
    for _ in timers_by_side:
        plugin._latency(bench, lambda x: x, (torch.ones(2, 3),), {})
    (row,) = results.rows
    return row


def test_a_flaggems_row_timed_on_two_calibers_is_marked_mixed():
    row = flaggems_row(["graph", "direct"])
    assert row["timer"] == "mixed"
    assert row["markers"] == ["TIMER_MIXED baseline=graph candidate=direct"]
    same = flaggems_row(["graph", "graph"])
    assert same["timer"] == "graph" and same["markers"] == []


class FakeGenerator:
    """A device's default generator as the capture path sees it (graph-safe state API)."""

    def __init__(self):
        self.state = "real"

    def graphsafe_get_state(self):
        return self.state

    def clone_state(self):
        return f"copy of {self.state}"

    def graphsafe_set_state(self, state):
        self.state = state


class FakeCaptureAccel:
    """torch.cuda as far as Timer._capture uses it; the capture fails the way `fail` says."""

    def __init__(self, fail):
        self.default_generators = [FakeGenerator()]
        self.fail = fail
        self.captured_against = None

    def current_device(self):
        return 0

    def Stream(self):  # noqa: N802 (torch's name)
        return None

    def CUDAGraph(self):  # noqa: N802
        return object()

    def graph(self, graph, stream=None):
        accel = self

        class Capture:
            def __enter__(self):
                accel.captured_against = accel.default_generators[0].state

            def __exit__(self, *exc):
                if accel.fail == "at_end":
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                return False

        return Capture()


@pytest.mark.parametrize("fail", ["in_body", "at_end", None])
def test_capture_runs_against_a_scratch_generator_state_and_restores_the_real_one(fail):
    t = Timer(backends.get("interpreter"), "auto", 0, 0, lambda m: None)
    t.backend = backends.get("cuda")
    t._accel = accel = FakeCaptureAccel(fail)

    def fn():
        if fail == "in_body":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    if fail is None:
        t._capture(fn, 2)
    else:
        with pytest.raises(_CaptureFailed):
            t._capture(fn, 2)
    assert accel.captured_against == "copy of real"  # the real state never took part
    assert accel.default_generators[0].state == "real"  # and is back, whatever happened


def test_the_liveness_probe_after_a_fallback_does_not_use_the_default_generator(monkeypatch):
    def poisoned_randn(*args, **kwargs):
        raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")

    monkeypatch.setattr(torch, "randn", poisoned_randn)
    t = Timer(backends.get("interpreter"), "auto", 0, 0, lambda m: None)
    t._check_alive()  # a probe through torch.randn would read a generator a capture may have left behind
