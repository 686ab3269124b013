import collections
import dataclasses
import json
import math
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import standin_cuda
import torch
from conftest import load, run_dir_of
from result_rows import result_row

import backends
from harness import cli
from harness.child.plugins.flaggems import FlagGemsPlugin
from harness.child.plugins.timing import TimingPlugin, record_rows, recorded_sizes
from harness.core import paths, rundir
from harness.core import spec as spec_mod
from harness.core.errors import UsageError
from harness.core.results import RESULTS_FORMAT
from harness.core.spec import FlagGemsOptions
from harness.measure import profile, timers
from harness.measure.timers import TOKEN_BUDGET_MS, Measurement, Timer, _CaptureFailed
from harness.sessions import resolve


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
        self.l2, self.windows = "warm", 1
        self.attribute = True
        self.error, self.alive, self.graph_calls = error, alive, 0
        self.max_noise = 0.0
        self._refused = {}
        self.host_clock, self.seconds = time.perf_counter, collections.Counter()

    def _profile(self, fn, calls):  # the attribution pass's profile: one kernel per call
        return profile.per_call(events([("k", 0.001)]) * calls, calls)

    def _graph(self, fn, warmup_ms=None, rep_ms=None, sizes=None):
        self.graph_calls += 1
        if self.error is not None and self.graph_calls == 2:  # the candidate refuses capture
            raise _CaptureFailed("capture", RuntimeError(self.error))
        return Measurement([1.0, 1.0], "graph")

    def _direct(self, fn, warmup_ms=None, rep_ms=None):
        return Measurement([2.0, 2.0], "direct")

    def _check_alive(self):
        if not self.alive:
            raise timers.CapturePoisoned("dead")


FNS = {"baseline": lambda: None, "candidate": lambda: None}


def test_graph_when_capture_works():
    t = FakeGraphTimer()
    timed = t.measure_pair("softmax", FNS)
    assert timed.timer == "graph" and t.marks == []


def test_each_side_is_attributed_after_timing_unless_the_run_times_only():
    t = FakeGraphTimer()
    assert all(m.kernels for m in t.measure_pair("softmax", FNS).measurements.values())
    t.attribute = False  # a timing-only run (an A/B's repeat): no profiler pass
    assert all(m.kernels is None for m in t.measure_pair("softmax", FNS).measurements.values())


def test_recoverable_failure_times_both_sides_direct_with_marker():
    t = FakeGraphTimer("CUDA error: operation not permitted when stream is capturing")
    timed = t.measure_pair("softmax", FNS)
    assert timed.timer == "direct"
    assert {m.timer for m in timed.measurements.values()} == {"direct"}  # one caliber per row
    assert len(t.marks) == 1 and t.marks[0].startswith("TIMER_FALLBACK phase=capture reason=recoverable")


def test_a_refused_capture_is_not_tried_again_on_the_tests_later_rows_with_those_sides():
    error = "CUDA error: operation not permitted when stream is capturing"
    t = FakeGraphTimer(error)
    assert t.measure_pair("bincount", FNS).timer == "direct"
    tried = t.graph_calls
    later = t.measure_pair("bincount", FNS)
    assert later.timer == "direct" and t.graph_calls == tried  # no capture, no warmup spent on one
    assert t.marks[-1] == f"TIMER_FALLBACK phase=earlier_row reason=recoverable detail={error!r}"
    # Another test, or the same test's other side alone (FlagGems times each side in a call of its own),
    # tries its own capture.
    assert t.measure_pair("gelu", FNS).timer == "graph" and t.graph_calls == tried + 2
    assert t.measure_pair("bincount", {"candidate": FNS["candidate"]}).timer == "graph"


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


class WindowRecorder(FakeGraphTimer):
    """Four windows a side (--windows 4); records each window's side and budgets; side k's window w
    reads `level[k][w]` ms."""

    def __init__(self, levels):
        super().__init__()
        self.warmup_ms, self.rep_ms, self.windows = 40.0, 100.0, 4
        self.levels, self.calls = levels, []

    def _graph(self, fn, warmup_ms=None, rep_ms=None, sizes=None):
        side = fn()
        window = sum(1 for s, *_ in self.calls if s == side)
        self.calls.append((side, warmup_ms, rep_ms))
        return Measurement([self.levels[side][window]] * 3, "graph")


def test_windows_alternate_the_sides_share_the_rep_budget_and_average_the_states():
    # Two states 8% apart, drawn per window: the row's latency is their geometric mean, not the
    # median of the pooled samples (which would take whichever state holds more windows).
    levels = {"baseline": [1.0, 1.0, 1.0, 1.0], "candidate": [2.0, 2.16, 2.0, 2.0]}
    t = WindowRecorder(levels)
    timed = t.measure_pair("op", {"baseline": lambda: "baseline", "candidate": lambda: "candidate"})
    assert [s for s, *_ in t.calls] == ["baseline", "candidate"] * 4
    assert [w for _, w, _ in t.calls] == [40.0, 40.0] + [40.0 / 4] * 2 * 3
    assert {r for *_, r in t.calls} == {100.0 / 4}
    cand = timed.measurements["candidate"]
    assert cand.windows_ms == [2.0, 2.16, 2.0, 2.0] and cand.median_ms == 2.0
    assert cand.latency_ms == pytest.approx((2.0 ** 3 * 2.16) ** 0.25)
    assert cand.summary()["latency"] == cand.latency_ms and len(cand.samples_ms) == 3 * 4
    assert cand.summary()["windows_ms"] == [2.0, 2.16, 2.0, 2.0]  # on the row, each window's median
    # One window (the default): no windows on the measurement or its row.
    t = WindowRecorder({"baseline": [1.0], "candidate": [2.0]})
    t.windows = 1
    one = t.measure_pair("op", {"baseline": lambda: "baseline", "candidate": lambda: "candidate"})
    assert one.measurements["candidate"].windows_ms is None and "windows_ms" not in one.measurements[
        "candidate"].summary()
    t = WindowRecorder({"baseline": [1.0, 1.0], "candidate": [2.0, 2.16]})
    t.windows = 2
    two = t.measure_pair("op", {"baseline": lambda: "baseline", "candidate": lambda: "candidate"})
    assert two.measurements["candidate"].windows_ms == [2.0, 2.16]


def test_each_later_window_times_relocated_inputs():
    t = WindowRecorder({"baseline": [1.0] * 4, "candidate": [1.0] * 4})
    t.calls, moves = [], []
    t.measure_pair("op", {"baseline": lambda: "baseline", "candidate": lambda: "candidate"},
                   relocate=lambda: moves.append(len(t.calls)))
    # Before windows 2..N, each time after both sides' previous window: never between the sides.
    assert moves == [2 * w for w in range(1, 4)]


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


def flaggems_row(timers_by_side, handed=None):
    """The row FlagGemsPlugin writes for one upstream input whose two `get_latency` calls (torch,
    then the FlagGems op) our timer measured with the given timers (None: a side left untimed, as a
    baseline off the control rows). `handed`: a list to put what upstream's calls were handed back."""
    sides = iter(timers_by_side)
    markers = []
    ctx = types.SimpleNamespace(
        spec=types.SimpleNamespace(flaggems=FlagGemsOptions("flaggems", "/x", "benchmark/test_mm.py", "test_mm"),
                                   op="flaggems:mm", seed=0),
        markers=markers, configs={}, mark=markers.append, begin_case=lambda *a: markers.clear(),
        backend=types.SimpleNamespace(measures_performance=True))
    results = FakeResults()
    timed_sides = []

    def measure(name, fns, carried):
        (side,) = fns
        timed_sides.append((side, carried))
        timer = next(sides)
        return timers.Timed({side: Measurement([1.0], timer)} if timer else {}, "unused")

    plugin = FlagGemsPlugin(ctx, results, measure=measure, autotune=None)
    bench = types.SimpleNamespace(to_bench_metrics=["latency_base", "latency"])
    item = (torch.ones(2, 3),)
    plugin._begin_case(bench, torch.float32, item, *plugin._case_id(torch.float32, item))
    for _ in timers_by_side:
        latency = plugin._latency(bench, lambda x: x, (torch.ones(2, 3),), {})
        if handed is not None:
            handed.append(latency)
    (row,) = results.rows
    # Named as upstream times them (its markers say which); the row carries the candidate's kernels alone.
    assert timed_sides == [("baseline", False), ("candidate", True)]
    return row


def test_a_flaggems_row_timed_on_two_calibers_is_marked_mixed():
    row = flaggems_row(["graph", "direct"])
    assert row["timer"] == "mixed"
    assert row["markers"] == ["TIMER_MIXED baseline=graph candidate=direct"]
    same = flaggems_row(["graph", "graph"])
    assert same["timer"] == "graph" and same["markers"] == []


def test_a_flaggems_baseline_left_untimed_hands_upstream_nan_and_its_row_the_candidate_alone():
    handed = []
    row = flaggems_row([None, "graph"], handed)
    assert math.isnan(handed[0]) and handed[1] == 1.0  # upstream's speedup is NaN, never a made-up number
    assert (row["baseline_ms"], row["candidate_ms"], row["speedup"]) == (None, 1.0, None)
    assert set(row["samples"]) == {"candidate"} and row["timer"] == "graph" and row["markers"] == []


def test_a_flaggems_run_collects_only_its_benchmark_file_and_the_directories_to_it(tmp_path):
    root = tmp_path / "FlagGems"
    (root / "benchmark").mkdir(parents=True)
    for name in ("test_mm.py", "test_exp.py", "conftest.py"):
        (root / "benchmark" / name).write_text("")
    alias = tmp_path / "gems"
    alias.symlink_to(root)  # the checkout named through a link: its paths resolve to ours
    ctx = types.SimpleNamespace(spec=types.SimpleNamespace(
        flaggems=FlagGemsOptions("flaggems", str(alias), "benchmark/test_mm.py", "test_mm"), op="flaggems:mm", seed=0))
    plugin = FlagGemsPlugin(ctx, FakeResults(), measure=None, autotune=None)
    plugin.pytest_configure(types.SimpleNamespace(hook=None))
    ignored = {p: plugin.pytest_ignore_collect(p, None) for p in (
        alias, alias / "benchmark", alias / "benchmark" / "test_mm.py", root / "benchmark" / "test_mm.py",
        alias / "benchmark" / "test_exp.py", alias / "benchmark" / "conftest.py", tmp_path / "other" / "test_mm.py")}
    assert ignored == {alias: None, alias / "benchmark": None, alias / "benchmark" / "test_mm.py": None,
                       root / "benchmark" / "test_mm.py": None, alias / "benchmark" / "test_exp.py": True,
                       alias / "benchmark" / "conftest.py": True, tmp_path / "other" / "test_mm.py": True}


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


# --- attribution, the profiler timer, the L2 flush ------------------------------------------------
def events(*calls):
    """Device events of consecutive calls, each call given as (name, duration_ms) pairs."""
    out, t = [], 0.0
    for call in calls:
        for name, ms in call:
            out.append(profile.KernelEvent(name, t, ms))
            t += ms * 1e3 + 1
    return out


def test_attribution_per_kernel_launches_time_per_call_and_share_largest_first():
    # A norm-like op: a reduction launched twice per call and one elementwise kernel.
    call = [("reduce", 0.002), ("scale", 0.004), ("reduce", 0.002)]
    kernels = profile.attribute(profile.per_call(events(call, call), 2))
    assert kernels == [
        {"name": "reduce", "launches_per_call": 2.0, "time_ms": pytest.approx(0.004), "share": pytest.approx(0.5)},
        {"name": "scale", "launches_per_call": 1.0, "time_ms": pytest.approx(0.004), "share": pytest.approx(0.5)},
    ]
    uneven = profile.attribute(profile.per_call(events([("a", 0.001), ("b", 0.003)]), 1))
    assert [(k["name"], k["share"]) for k in uneven] == [("b", 0.75), ("a", 0.25)]


def test_a_profile_that_does_not_split_into_equal_calls_is_refused():
    with pytest.raises(profile.ProfileError, match="3 device events over 2 calls"):
        profile.per_call(events([("a", 1.0), ("b", 1.0)], [("a", 1.0)]), 2)


def test_the_flush_is_dropped_from_the_head_of_each_call_and_checked_by_name():
    calls = profile.per_call(events([("flush", 9.0), ("k", 1.0)], [("flush", 9.0), ("k", 2.0)]), 2)
    assert [[e.name for e in c] for c in profile.drop_leading(calls, ("flush",))] == [["k"], ["k"]]
    shifted = profile.per_call(events([("k", 1.0), ("flush", 9.0)], [("k", 1.0), ("flush", 9.0)]), 2)
    with pytest.raises(profile.ProfileError, match="do not lead every call"):
        profile.drop_leading(shifted, ("flush",))


def test_profiler_samples_are_device_time_per_call_averaged_over_consecutive_calls():
    calls = profile.per_call(events(*[[("k", ms), ("j", 1.0)] for ms in (1.0, 3.0, 5.0, 7.0, 100.0)]), 5)
    # Two samples of two calls each; the fifth call fills no sample.
    assert profile.sample_means(calls, 2) == [pytest.approx(3.0), pytest.approx(7.0)]


def cpu_op_calls():
    a, b = torch.ones(64, 64), torch.ones(64, 64)

    def op():  # an op of two "kernels", one of them launched twice
        torch.add(a, b)
        torch.mul(a, b)
        torch.mul(a, b)

    return op


def test_attribution_from_a_real_profiler_event_list():
    # torch.profiler records CPU ops as the device profiler records kernels: same event list, same parsing.
    calls = profile.profile_calls(cpu_op_calls(), 3, "CPU", lambda: None)
    by_name = {k["name"]: k for k in profile.attribute(calls)}
    assert set(by_name) == {"aten::add", "aten::mul"}
    assert by_name["aten::add"]["launches_per_call"] == 1 and by_name["aten::mul"]["launches_per_call"] == 2
    assert sum(k["share"] for k in by_name.values()) == pytest.approx(1.0)
    buf = torch.empty(1 << 16)
    flush = buf.zero_
    names = profile.flush_signature(flush, "CPU", lambda: None)
    assert names == ("aten::zero_",)
    flushed = profile.profile_calls(cpu_op_calls(), 3, "CPU", lambda: None, flush, names)
    assert [[e.name for e in c] for c in flushed] == [["aten::add", "aten::mul", "aten::mul"]] * 3


def test_profiling_does_not_import_inductor():
    # torch.profiler.profile's start probes torch._inductor, which imports Inductor, Dynamo and
    # sympy: ~4.7 s of every replay step on an H200 host. A fresh interpreter, as each step is.
    code = ("import sys, torch\n"
            "from harness.measure import profile\n"
            "calls = profile.profile_calls(lambda: torch.ones(4).add_(1), 2, 'CPU', lambda: None)\n"
            "assert [[e.name for e in c] for c in calls] == [['aten::ones', 'aten::add_']] * 2, calls\n"
            "print(sorted(m for m in ('torch._inductor', 'torch._dynamo', 'sympy') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_a_device_profile_asks_kineto_for_the_device_activity_alone(monkeypatch):
    # No device here: the arguments torch's profiler gets are the contract (device-only events
    # exist only under Kineto; torch.profiler.profile passes the same three).
    seen = {}

    class Stop(Exception):
        pass

    def fake_profile(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(torch.autograd.profiler, "profile", fake_profile)
    with pytest.raises(Stop):
        profile.record(lambda: None, 1, "CUDA", lambda: None)
    assert seen == {"use_cpu": False, "use_device": "cuda", "use_kineto": True}


def cpu_profiler_timer(l2="warm") -> Timer:
    """The profiler timer on a backend whose "device" is the CPU: everything real but the estimate
    of one call, which needs device events."""
    backend = dataclasses.replace(backends.get("interpreter"), profiler_activity="CPU")
    t = Timer(backend, "profiler", 0, 0, lambda m: None, l2=l2)
    t._prepare = lambda fn: (0.01, 0.0)  # (device, host) ms a call
    return t


def test_the_profiler_timer_times_every_side_from_the_profile_and_attributes_from_the_same_events():
    timed = cpu_profiler_timer().measure_pair("op", {"baseline": cpu_op_calls(), "candidate": cpu_op_calls()})
    assert timed.timer == "profiler"
    for m in timed.measurements.values():
        assert m.timer == "profiler" and len(m.samples_ms) == timers.PROFILER_SAMPLES_RANGE[0]
        # Every sample is the per-call device time of whole calls: their mean is the attributed total.
        assert np.mean(m.samples_ms) == pytest.approx(sum(k["time_ms"] for k in m.kernels))
        assert {k["name"] for k in m.kernels} == {"aten::add", "aten::mul"}


class CountedBuffer:
    """A flush buffer that counts its flushes."""

    def __init__(self, tensor):
        self.tensor, self.zeroed = tensor, 0

    def zero_(self):
        self.zeroed += 1
        return self.tensor.zero_()


def test_the_profiler_timer_sizes_its_samples_from_the_device_estimate_of_one_call(monkeypatch):
    # The estimate from the stand-in device's events, the samples from the CPU profiler's events.
    accel = standin_cuda.install(monkeypatch, standin_cuda.StandInCuda())
    backend = dataclasses.replace(backends.get("cuda"), profiler_activity="CPU")
    a, b = torch.ones(8), torch.ones(8)

    def op():
        accel.launch(CALL_MS)
        torch.add(a, b)

    m = Timer(backend, "profiler", 0.0, 2.0, lambda m: None).measure_pair("op", {"x": op}).measurements["x"]
    # 0.1 ms a sample is 13 calls of 2**-7 ms; 2 ms of such samples is 20 of them.
    assert m.timer == "profiler" and len(m.samples_ms) == 20
    assert [k["name"] for k in m.kernels] == ["aten::add"]


def test_cold_l2_profiler_timer_leaves_the_flush_out_of_the_samples():
    t = cpu_profiler_timer("cold")
    t._flush_buffer = flush = CountedBuffer(torch.empty(1 << 22))  # a flush that costs far more than the op
    cold = t.measure_pair("op", {"x": cpu_op_calls()}).measurements["x"]
    assert {k["name"] for k in cold.kernels} == {"aten::add", "aten::mul"}
    # Before every profiled call (10 samples of 10 calls), after the flush's own 3-call signature.
    assert flush.zeroed >= 3 + timers.PROFILER_SAMPLES_RANGE[0] * 10
    assert np.mean(cold.samples_ms) == pytest.approx(sum(k["time_ms"] for k in cold.kernels))


def test_flush_subtraction_takes_the_flush_graphs_median_per_call_off_every_sample():
    samples, flush_ms = timers.subtract_flush([10.5, 11.0, 10.8], [10.0, 9.0, 10.2])
    assert flush_ms == 10.0 and samples == pytest.approx([0.5, 1.0, 0.8])


class ScriptedReplays(Timer):
    """The cold graph path with captures and replays scripted: each replay of the op graph and of
    the flush-only graph returns the next of its times (ms for the whole replay)."""

    def __init__(self, op_ms, flush_ms):
        self.marks, self.mark = [], None
        self.mark = self.marks.append
        self.replays = {"op": iter(op_ms), "flush": iter(flush_ms)}
        self.order = []
        self.max_noise = 0.0
        self.host_clock, self.seconds = time.perf_counter, collections.Counter()

    def _capture(self, fn, calls):
        return types.SimpleNamespace(name="flush" if fn == self._flush else "op", replay=lambda: None)

    def _sync(self):
        pass

    def _replay_ms(self, graph, replays=1):
        self.order.append((graph.name, replays))
        return next(self.replays[graph.name])


def test_cold_graph_samples_interleave_op_and_flush_chains_and_subtract_the_flush():
    t = ScriptedReplays(op_ms=[110, 112, 111], flush_ms=[100, 101, 99])
    # Each sample is a chain of 2 replays of a 5-call graph: its time is over 10 calls.
    samples, flush_ms = t._cold_graph_samples(t._capture(None, 5), unroll=5, chain=2, reps=3)
    assert t.order == [("op", 2), ("flush", 2)] * 3
    assert flush_ms == pytest.approx(10.0) and samples == pytest.approx([1.0, 1.2, 1.1])
    assert t.marks == []


def test_cold_graph_samples_within_the_flush_noise_are_marked():
    t = ScriptedReplays(op_ms=[100, 99, 101], flush_ms=[100, 100, 100])
    t._cold_graph_samples(t._capture(None, 10), unroll=10, chain=1, reps=3)
    assert t.marks == ["L2_FLUSH_DOMINATES flush_ms=10 detail='the op takes less than the flush's own variation: its "
                       "cold time is not resolved by the graph timer; use --timer profiler'"]


def test_only_the_sides_asked_for_are_attributed_and_marked():
    t = FakeGraphTimer()
    t._profile = lambda fn, calls: [[] for _ in range(calls)]  # a view op: profiled calls, no kernels
    timed = t.measure_pair("alias", FNS, attributed=("candidate",))
    assert timed.measurements["baseline"].kernels is None and timed.measurements["candidate"].kernels == []
    assert [m.split()[1] for m in t.marks] == ["side=candidate"]


def test_the_timing_plugin_attributes_the_side_whose_kernels_its_row_carries_alone():
    asked = []

    class Recording:
        def measure_pair(self, name, fns, relocate, attributed, sizes):
            asked.append(tuple(attributed))
            return timers.Timed({side: Measurement([1.0], "graph") for side in fns}, "graph")

    plugin = TimingPlugin(ctx=None)
    plugin.timer = Recording()
    fn = lambda: None  # noqa: E731
    plugin.measure("add", {"baseline": fn, "candidate": fn})  # a built-in op's pair: the candidate's
    plugin.measure("flaggems:mm", {"baseline": fn}, carried=False)  # upstream's torch call, before FlagGems'
    plugin.measure("flaggems:mm", {"candidate": fn}, carried=True)
    plugin.measure("flaggems:x", {"baseline": fn})  # a benchmark timing one side: that side's
    assert asked == [("candidate",), (), ("candidate",), ("baseline",)]


def test_every_side_is_attributed_after_timing_whatever_the_timer():
    t = FakeGraphTimer()
    timed = t.measure_pair("softmax", FNS)
    for m in timed.measurements.values():
        (kernel,) = m.kernels
        assert kernel == {"name": "k", "launches_per_call": 1.0, "time_ms": pytest.approx(0.001), "share": 1.0}


def test_a_side_whose_profile_does_not_split_is_marked_and_carries_no_kernels():
    t = FakeGraphTimer()

    def broken(fn, calls):
        raise profile.ProfileError("7 device events over 3 calls: the op does not launch the same kernels")

    t._profile = broken
    timed = t.measure_pair("softmax", FNS)
    assert all(m.kernels is None for m in timed.measurements.values())
    assert t.marks[0].startswith("KERNELS_UNATTRIBUTED side=baseline detail='7 device events")


def test_a_side_that_launches_no_kernel_is_marked_no_device_work():
    t = FakeGraphTimer()
    t._profile = lambda fn, calls: [[] for _ in range(calls)]  # a view op: profiled calls, no kernels
    timed = t.measure_pair("alias", FNS)
    assert all(m.kernels == [] for m in timed.measurements.values())
    detail = "detail='the profiled calls launched no device kernel: the time measured is host or replay overhead'"
    assert t.marks == [f"NO_DEVICE_WORK side=baseline {detail}", f"NO_DEVICE_WORK side=candidate {detail}"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--timer", "profiler"], "error: backend 'interpreter' has no device profiler for --timer profiler; "
                              "use --timer auto or host"),
    (["--timer", "graph"], "error: backend 'interpreter' has no device timer; use --timer auto or host"),
    (["--l2", "cold"], "error: --l2 cold: backend 'interpreter' has no device cache zl_bench knows how to flush "
                       "(cold means a flushed device L2); use --l2 warm"),
])
def test_profiler_timer_and_cold_l2_are_refused_in_one_line_where_the_backend_lacks_them(argv, message, capsys):
    assert cli.main(["record", "softmax", "--backend", "interpreter", *argv]) == 2
    assert capsys.readouterr().err == message + "\n"


@pytest.mark.parametrize("name", backends.NAMES)
def test_a_refused_timer_suggests_only_timers_the_backend_takes(name):
    backend = backends.get(name)
    for timer in spec_mod.TIMERS:
        try:
            resolve.resolve_timer(backend, timer)
        except UsageError as exc:
            suggested = str(exc).rpartition("use --timer ")[2].split(" or ")
            assert suggested == list(backend.timers), (timer, str(exc))
            for other in suggested:
                resolve.resolve_timer(backend, other)


@pytest.mark.parametrize("command", [["batch", "--ops", "add"], ["ab", "--ops", "add"],
                                     ["ab", "--ops", "add", "--all"]])
@pytest.mark.parametrize("argv", [["--timer", "profiler"], ["--l2", "cold"]])
def test_ab_and_batch_refuse_what_the_backend_lacks_once_before_anything_runs(command, argv, tmp_path, capsys):
    assert cli.main([*command, "--backend", "interpreter", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and ("profiler" in err or "--l2 cold" in err)
    assert list(tmp_path.iterdir()) == []  # no batch or A/B dir


def test_cuda_has_both_and_resolves_them():
    cuda = backends.get("cuda")
    assert resolve.resolve_timer(cuda, "profiler") == "profiler" and resolve.resolve_l2(cuda, "cold") == "cold"


def timing_plugin(tmp_path, backend, only=None, windows=1, timer="auto", max_noise=0.0):
    said = []
    spec = spec_mod.RunSpec("add", backend, "record", 0, ["fp32"], "default", warmup_ms=25.0, rep_ms=100.0,
                            windows=windows, only=only, timer=timer, max_noise=max_noise)
    ctx = types.SimpleNamespace(spec=spec,
                                backend=backends.get(backend), mark=lambda m: None, say=said.append,
                                run_dir=tmp_path)
    plugin = TimingPlugin(ctx)
    plugin.pytest_configure(None)
    return plugin, said


def test_a_timing_only_run_profiles_nothing_and_says_so_in_run_json(tmp_path):
    plugin, said = timing_plugin(tmp_path, "cuda", only="timing")
    assert plugin.timer.attribute is False and (plugin.timer.warmup_ms, plugin.timer.rep_ms) == (25.0, 100.0)
    observed = load(tmp_path / rundir.RUN_JSON)["observed"]
    assert observed["kernel_attribution"] == {"recorded": False, "reason": "a timing-only run (--timing-only)"}
    assert "timing" not in observed


def test_a_configs_only_record_profiles_nothing_and_times_at_the_token_budget(tmp_path):
    """An A/B's record: its autotune picks are all that is read, so its rows neither profile nor time at
    the full budget, and run.json says why."""
    plugin, said = timing_plugin(tmp_path, "cuda", only="configs")
    assert plugin.timer.attribute is False and (plugin.timer.warmup_ms, plugin.timer.rep_ms) == TOKEN_BUDGET_MS
    assert plugin.timer.sample_ms == timers.TOKEN_SAMPLE_MS  # one replay a graph sample
    observed = load(tmp_path / rundir.RUN_JSON)["observed"]
    assert observed["kernel_attribution"] == {"recorded": False, "reason": "a configs-only run (--configs-only)"}
    assert observed["timing"] == {"warmup_ms": 0.0, "rep_ms": 0.0, "reason": "a configs-only run (--configs-only): "
                                  "its timings are for no comparison"}


def test_a_passes_only_run_profiles_after_timing_at_the_token_budget_and_says_so(tmp_path):
    (tmp_path / "full").mkdir()
    full = timing_plugin(tmp_path / "full", "cuda")[0].timer
    assert (full.warmup_ms, full.rep_ms) == (25.0, 100.0) and "timing" not in load(
        tmp_path / "full" / rundir.RUN_JSON)["observed"]
    assert full.sample_ms == timers.GRAPH_SAMPLE_MS
    plugin, said = timing_plugin(tmp_path, "cuda", only="passes")
    assert plugin.timer.attribute is True and (plugin.timer.warmup_ms, plugin.timer.rep_ms) == TOKEN_BUDGET_MS
    assert plugin.timer.sample_ms == timers.TOKEN_SAMPLE_MS
    observed = load(tmp_path / rundir.RUN_JSON)["observed"]
    assert observed["kernel_attribution"]["recorded"] is True
    assert observed["timing"] == {"warmup_ms": 0.0, "rep_ms": 0.0, "reason": "a passes-only run (--passes-only): "
                                  "its timings are for no comparison"}
    # (Each timer still takes its fewest calls on it: test_the_graph_timers_replays_are_clamped.)


def test_the_timer_times_as_many_windows_as_the_run_spec_says(tmp_path):
    assert timing_plugin(tmp_path, "cuda", windows=3)[0].timer.windows == 3


def test_the_candidates_kernels_go_on_its_row_and_on_no_other(tmp_path):
    plugin, said = timing_plugin(tmp_path, "cuda")
    assert said == [] and load(tmp_path / rundir.RUN_JSON)["observed"]["kernel_attribution"]["recorded"]
    plugin.timer = FakeGraphTimer()
    plugin.timer._profile = lambda fn, calls: profile.per_call(events([(fn.__name__, 0.001)]) * calls, calls)
    plugin.pytest_zl_case_started("fp16-4x16", "4x16")
    plugin.measure("softmax", {"baseline": torch.add, "candidate": torch.mul})
    row = {"status": "SUCCESS"}
    plugin.pytest_zl_row_ready(row)
    assert [k["name"] for k in row["kernels"]] == ["mul"]
    # A row that failed after its measurement (computing its metrics, say) carries none.
    plugin.measure("softmax", {"baseline": torch.add, "candidate": torch.mul})
    failed = {"status": "FAILED"}
    plugin.pytest_zl_row_ready(failed)
    assert "kernels" not in failed
    # A case measured but never reported leaves nothing to the next case's row.
    plugin.measure("softmax", {"baseline": torch.add, "candidate": torch.mul})
    plugin.pytest_zl_case_started("fp16-8x16", "8x16")
    later = {"status": "SUCCESS"}
    plugin.pytest_zl_row_ready(later)
    assert "kernels" not in later


def test_without_a_device_profiler_rows_carry_no_kernels_and_one_line_says_why(tmp_path):
    plugin, said = timing_plugin(tmp_path, "interpreter")
    assert said == ["per-kernel attribution not recorded: backend 'interpreter' has no device profiler; "
                    "rows carry no 'kernels'"]
    assert load(tmp_path / rundir.RUN_JSON)["observed"]["kernel_attribution"] == {
        "recorded": False, "reason": "backend 'interpreter' has no device profiler"}
    for case in ("fp32-4", "fp32-8"):
        plugin.pytest_zl_case_started(case, case)
        plugin.measure("softmax", {"baseline": lambda: None, "candidate": lambda: None})
        row = {"status": "SUCCESS"}
        plugin.pytest_zl_row_ready(row)
        assert "kernels" not in row
    assert len(said) == 1  # once per run, not per row


@pytest.mark.e2e
def test_an_interpreter_run_says_once_that_its_rows_carry_no_kernels(tmp_path, harness):
    proc = harness("record", "softmax", "--backend", "interpreter", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("per-kernel attribution not recorded: backend 'interpreter'") == 1
    rows = load(run_dir_of(proc) / rundir.RESULTS_JSON)["rows"]
    assert len(rows) > 1 and all(r["status"] == "SUCCESS" and "kernels" not in r for r in rows)
    # Where the rows' timing went, by phase: the host timer warms up and samples, nothing else.
    seconds = load(run_dir_of(proc) / rundir.RUN_JSON)["observed"]["timer_seconds"]
    assert seconds.keys() == {"warmup", "samples"} and seconds["samples"] > 0


# --- the graph and direct timers on a stand-in device (tests/standin_cuda.py) -------------------------
# Times are powers of two, so the device clock's sums are exact.
CALL_MS = 2 ** -7  # one call of the op, ms
REPLAY_MS = 2 ** -6  # a graph replay's own overhead, ms


def standin_timer(monkeypatch, warmup_ms=4.0, rep_ms=100.0, **device):
    """The real Timer on cuda, torch.cuda replaced by the stand-in (no profiler: attribution has its
    own tests)."""
    accel = standin_cuda.install(monkeypatch, standin_cuda.StandInCuda(replay_overhead_ms=REPLAY_MS, **device))
    marks = []
    backend = dataclasses.replace(backends.get("cuda"), profiler_activity=None)
    timer = Timer(backend, "auto", warmup_ms, rep_ms, marks.append)
    timer.host_clock = lambda: accel.host_s  # the host's clock: what the stand-in's calls cost it, not the test's
    return timer, accel, marks


def graph_captures(accel):
    return [(calls, state) for (_, _, state), (_, _, calls) in
            zip(accel.steps("capture"), accel.steps("captured"), strict=True)]


@pytest.mark.parametrize(("warmup_ms", "warmups"), [(4.0, 512), (0.001, timers.WARMUP_RANGE[0]),
                                                    (100.0, timers.WARMUP_RANGE[1])])
def test_the_graph_timer_discards_one_call_estimates_from_three_and_warms_up_before_capture(
        monkeypatch, warmup_ms, warmups):
    t, accel, marks = standin_timer(monkeypatch, warmup_ms=warmup_ms)
    timed = t.measure_pair("op", {"x": accel.op(CALL_MS, first_call_ms=50.0)})
    assert timed.timer == "graph" and marks == []
    # The first call (its autotune sweep's 50 ms) runs alone between syncs and is not in the
    # estimate: the warmup is the budget over one call's time (4 / 2**-7 = 512), within its range.
    assert accel.log[:4] == [("synchronize",), ("launch", "first call"), ("launch", "kernel"), ("synchronize",)]
    assert accel.launches_before_first_capture() == 1 + 3 + warmups
    first_capture = accel.log.index(accel.steps("capture")[0])
    assert accel.log[first_capture - 1] == ("synchronize",)  # the warmup has finished when capture starts


@pytest.mark.parametrize(("host_ms", "warmups"), [(0.5, 8), (0.3, 14), (10.0, timers.WARMUP_RANGE[0])])
def test_a_call_slower_on_the_host_than_on_the_device_is_warmed_up_for_the_budget_of_host_time(
        monkeypatch, host_ms, warmups):
    # 4 ms of warmup at 2**-7 ms of device a call would be 512 calls: 256 ms of host at 0.5 ms a call. The
    # host's clock stops it once the budget is spent (ceil(4 / host_ms)), never before the range's least.
    t, accel, _ = standin_timer(monkeypatch, warmup_ms=4.0)
    t.measure_pair("op", {"x": accel.op(CALL_MS, host_ms=host_ms)})
    assert accel.launches_before_first_capture() == 1 + 3 + warmups


def test_the_graph_timer_unrolls_a_short_graph_from_a_probe_and_chains_its_replays_into_samples(monkeypatch):
    # The device's 2nd replay (the probe's first timed one) is disturbed: the probe takes the fastest of three.
    t, accel, marks = standin_timer(monkeypatch, disturbed={1: 0.5})
    m = t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"]
    (probe_calls, probe_state), (unroll, state) = graph_captures(accel)
    assert probe_calls == timers.GRAPH_PROBE_CALLS
    per_call = (probe_calls * CALL_MS + REPLAY_MS) / probe_calls  # the probe's replay, per call
    # The graph: the fewest calls whose replay reaches GRAPH_UNROLL_MS, 54 calls of 0.009375 ms.
    assert unroll * per_call >= timers.GRAPH_UNROLL_MS > (unroll - 1) * per_call
    assert probe_state == state == "copy of real" and accel.default_generators[0].state == "real"
    # A sample: the fewest back-to-back replays of it that reach GRAPH_SAMPLE_MS (4 of 0.50625 ms), per call.
    chain = 4
    assert chain * unroll * per_call >= timers.GRAPH_SAMPLE_MS > (chain - 1) * unroll * per_call
    per_replay = unroll * CALL_MS + REPLAY_MS
    assert m.timer == "graph" and m.samples_ms == [pytest.approx(per_replay / unroll)] * len(m.samples_ms)
    assert len(m.samples_ms) == 50  # the 100 ms budget over the probe's 2.025 ms per sample
    replays = accel.steps("replay")
    # The probe's 4, the timed graph's upload and one replay timed (its call time, for its replays' sizes:
    # m.graph_sizes), then `chain` replays a sample and none beyond.
    assert [n for _, _, n in replays] == [probe_calls] * 4 + [unroll] * (2 + chain * len(m.samples_ms))
    assert m.graph_sizes == timers.GraphSizes(CALL_MS, per_replay / unroll, unroll)
    assert m.l2_flush_ms is None and marks == []


@pytest.mark.parametrize(("kernel_ms", "overhead_ms", "captures", "chain"), [
    # A call past the sample's target: the probe is sized by the direct estimate, one call, timed as it is.
    (4.0, REPLAY_MS, [1], 1),
    (1.5, REPLAY_MS, [1], 2),  # FlagGems' 1G-element rows: one call a graph, two replays a sample
    (0.2, REPLAY_MS, [3], 4),  # the 3 calls that reach GRAPH_UNROLL_MS
    # A tiny kernel: the unroll capped, the sample 142 replays of 0.014 ms.
    (2 ** -20, 2 ** -14, [timers.GRAPH_PROBE_CALLS, timers.GRAPH_MAX_UNROLL], 142),
    # A replay that reads zero divides by nothing, and its chain stops at GRAPH_MAX_CHAIN replays a sample.
    (0.0, 0.0, [timers.GRAPH_PROBE_CALLS, timers.GRAPH_MAX_UNROLL], timers.GRAPH_MAX_CHAIN),
])
def test_the_unroll_and_the_chain_are_clamped_at_both_ends(monkeypatch, kernel_ms, overhead_ms, captures, chain):
    accel = standin_cuda.install(monkeypatch, standin_cuda.StandInCuda(replay_overhead_ms=overhead_ms))
    backend = dataclasses.replace(backends.get("cuda"), profiler_activity=None)
    m = Timer(backend, "graph", 4.0, 100.0, lambda m: None).measure_pair("op", {"x": accel.op(kernel_ms)})
    assert [calls for calls, _ in graph_captures(accel)] == captures
    unroll = captures[-1]
    sample = (unroll * kernel_ms + overhead_ms) / unroll
    samples = m.measurements["x"].samples_ms
    assert samples == [pytest.approx(sample)] * len(samples)
    # The probe's 4 replays, the second graph's upload and timed replay where there is one, then `chain`
    # replays a sample.
    replays = [n for _, _, n in accel.steps("replay")]
    assert len(replays) == 4 + 2 * (len(captures) - 1) + chain * len(samples)
    assert replays[-chain * len(samples):] == [unroll] * (chain * len(samples))


@pytest.mark.parametrize(("host_ms", "unroll"), [
    (0.01, 54),  # cheap Python: the unroll the device time asks for (0.54 ms of capture)
    (125 / 16, 32),  # 32 calls are what 250 ms of capture affords
    (32.0, timers.GRAPH_PROBE_CALLS),  # fewer than the probe's: the probe graph is timed, not captured again
])
def test_the_unroll_is_capped_by_what_capturing_a_call_costs_the_host(monkeypatch, host_ms, unroll):
    t, accel, marks = standin_timer(monkeypatch)
    t.host_clock = lambda: accel.host_s
    m = t.measure_pair("op", {"x": accel.op(CALL_MS, host_ms=host_ms)}).measurements["x"]
    captures = [calls for calls, _ in graph_captures(accel)]
    assert captures == [timers.GRAPH_PROBE_CALLS] + ([unroll] if unroll != timers.GRAPH_PROBE_CALLS else [])
    assert m.samples_ms == [pytest.approx((unroll * CALL_MS + REPLAY_MS) / unroll)] * len(m.samples_ms)
    if unroll == 54:
        assert marks == []
    else:
        assert marks == [f"GRAPH_UNROLL_CAPPED unroll={unroll} wanted=54 host_ms_per_call={host_ms:.3g} "
                         f"device_ms_per_call={(10 * CALL_MS + REPLAY_MS) / 10:.3g}"]


def test_a_probe_graph_of_the_right_size_is_timed_as_is(monkeypatch):
    # 13/64 ms a call: the probe is the 3 calls that reach GRAPH_UNROLL_MS at the direct estimate, its
    # replay 0.625 ms; 3 is the unroll, no second capture.
    t, accel, _ = standin_timer(monkeypatch)
    m = t.measure_pair("op", {"x": accel.op(13 / 64)}).measurements["x"]
    assert graph_captures(accel) == [(3, "copy of real")]
    assert m.samples_ms == [pytest.approx((3 * 13 / 64 + REPLAY_MS) / 3)] * len(m.samples_ms)
    assert len(accel.steps("replay")) == 4 + 4 * len(m.samples_ms)  # the probe timed as is: 4 replays a sample


@pytest.mark.parametrize(("rep_ms", "reps"), [(0.0, timers.REPS_RANGE[0]), (1e6, timers.REPS_RANGE[1])])
def test_the_graph_timers_replays_are_clamped(monkeypatch, rep_ms, reps):
    t, accel, _ = standin_timer(monkeypatch, rep_ms=rep_ms)
    assert len(t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"].samples_ms) == reps


def test_a_token_timed_graph_sample_is_one_replay(monkeypatch):
    accel = standin_cuda.install(monkeypatch, standin_cuda.StandInCuda(replay_overhead_ms=REPLAY_MS))
    backend = dataclasses.replace(backends.get("cuda"), profiler_activity=None)
    timer = Timer(backend, "graph", *timers.TOKEN_BUDGET_MS, lambda m: None, sample_ms=timers.TOKEN_SAMPLE_MS)
    samples = timer.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"].samples_ms
    assert len(samples) == timers.REPS_RANGE[0]
    # The probe's 4 replays, the 54-call graph's upload and timed replay, then one replay a sample.
    assert [n for _, _, n in accel.steps("replay")] == [timers.GRAPH_PROBE_CALLS] * 4 + [54] * (2 + len(samples))


def test_cold_l2_graph_samples_are_the_op_alone_and_the_flush_is_its_own_graph(monkeypatch):
    t, accel, marks = standin_timer(monkeypatch)
    t.l2, t._flush_buffer = "cold", standin_cuda.Buffer(accel, 0.25)  # as __init__ allocates it on a device
    m = t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"]
    (probe, _), (both, _), (flush_only, _) = graph_captures(accel)
    # The probe and the timed graph each hold flush + op per call; the flush-only graph as many flushes.
    assert probe == 2 * timers.GRAPH_PROBE_CALLS and both == 2 * flush_only
    unroll = flush_only
    assert m.samples_ms == [pytest.approx(CALL_MS)] * len(m.samples_ms)  # replay overheads cancel out
    assert m.l2_flush_ms == pytest.approx((unroll * 0.25 + REPLAY_MS) / unroll) and marks == []
    assert m.summary()["l2_flush_ms"] == m.l2_flush_ms


def refusing_op(accel, ms):
    """An op that cannot be captured (a host sync inside), as CUDA refuses it."""
    def fn():
        if accel.capturing is not None:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        accel.launch(ms)
    return fn


def test_a_refused_capture_times_every_side_directly_on_events(monkeypatch):
    t, accel, marks = standin_timer(monkeypatch, warmup_ms=1.0, rep_ms=0.5)
    checked = []
    monkeypatch.setattr(t, "_check_alive", lambda: checked.append(True))
    timed = t.measure_pair("op", {"a": accel.op(CALL_MS), "b": refusing_op(accel, 2 * CALL_MS)})
    assert timed.timer == "direct" and checked == [True]
    assert marks == ["TIMER_FALLBACK phase=capture reason=recoverable "
                     "detail='CUDA error: operation not permitted when stream is capturing'"]
    a, b = timed.measurements["a"], timed.measurements["b"]
    # One event pair per call, read after one sync: each sample is one call; 0.5 ms of 2**-7 is 64.
    assert a.timer == b.timer == "direct"
    assert a.samples_ms == [CALL_MS] * 64 and b.samples_ms == [2 * CALL_MS] * 32


def test_the_direct_timer_warms_up_and_leaves_the_cold_flush_untimed(monkeypatch):
    t, accel, marks = standin_timer(monkeypatch, warmup_ms=1.0, rep_ms=0.25)
    t.timer, t.l2, t._flush_buffer = "direct", "cold", standin_cuda.Buffer(accel, 1.0)
    timed = t.measure_pair("op", {"x": accel.op(CALL_MS, first_call_ms=50.0)})
    m = timed.measurements["x"]
    assert timed.timer == "direct"
    # 0.25 ms of 2**-7 is 32 calls, each after a flush that its events leave out.
    assert m.timer == "direct" and m.samples_ms == [CALL_MS] * 32 and marks == []
    launches = [name for kind, *rest in accel.log if kind == "launch" for name in rest]
    # The discarded first call, the 3-call estimate and 1 / 2**-7 = 128 warmups, then flush + call.
    assert launches == ["first call"] + ["kernel"] * (1 + 3 + 128) + ["flush", "kernel"] * 32
    assert accel.steps("capture") == []


@pytest.mark.parametrize(("rep_ms", "reps"), [(0.0, timers.DIRECT_REPS_RANGE[0]), (1e6, 250), (1.0, 128)])
def test_the_direct_timers_calls_are_clamped(monkeypatch, rep_ms, reps):
    # At most 250 single-call samples, whatever the budget (past that they narrowed nothing between processes);
    # within it, the budget's worth: 1 ms of 2**-7 ms calls is 128.
    t, accel, _ = standin_timer(monkeypatch, warmup_ms=0.0, rep_ms=rep_ms)
    t.timer = "direct"
    assert len(t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"].samples_ms) == reps


@pytest.mark.parametrize(("host_ms", "reps"), [(0.0, 128), (CALL_MS / 2, 128), (4 * CALL_MS, 32)])
def test_the_direct_timer_counts_its_calls_at_the_slower_of_the_device_and_the_host(monkeypatch, host_ms, reps):
    # 1 ms of budget: an op that waits on the host (4 device-calls' worth of host time a call) gets 1 ms of
    # host time, not 4; one the device paces, the device's 1 ms.
    t, accel, _ = standin_timer(monkeypatch, warmup_ms=0.0, rep_ms=1.0)
    t.timer = "direct"
    m = t.measure_pair("op", {"x": accel.op(CALL_MS, host_ms=host_ms)}).measurements["x"]
    assert abs(len(m.samples_ms) - reps) <= 1  # the host's clock in decimal seconds: a ceil may round up


@pytest.mark.parametrize("timer", ["graph", "direct"])
def test_a_windows_own_budgets_replace_the_timers(monkeypatch, timer):
    # A later window (--windows) warms up and samples on its share: 1/128 ms and no rep budget here, against
    # the timer's own 4 ms (512 warmups) and 100 ms: one warmup call and each timer's fewest samples.
    t, accel, _ = standin_timer(monkeypatch, warmup_ms=4.0, rep_ms=100.0)
    m = getattr(t, f"_{timer}")(accel.op(CALL_MS), CALL_MS, 0.0)
    assert len(m.samples_ms) == {"graph": timers.REPS_RANGE, "direct": timers.DIRECT_REPS_RANGE}[timer][0]
    warmups = timers.WARMUP_RANGE[0]
    if timer == "graph":
        assert accel.launches_before_first_capture() == 1 + 3 + warmups
    else:
        assert sum(1 for step in accel.log if step == ("launch", "kernel")) == 1 + 3 + warmups + timers.REPS_RANGE[0]


def test_the_host_timer_estimates_from_one_call_warms_up_and_samples_within_its_range(monkeypatch):
    clock = [1024.0]  # seconds, far from zero as perf_counter's are; steps of 2**-9 s keep the sums exact
    calls = []
    call_ms = 2 ** -9 * 1e3

    def op():
        calls.append(1)
        clock[0] += 2 ** -9

    monkeypatch.setattr(timers.time, "perf_counter", lambda: clock[0])
    m = Timer(backends.get("interpreter"), "auto", 4 * call_ms, 8 * call_ms, lambda m: None)._host(op)
    # One call estimates, 4 warm up, 8 are timed.
    assert m.timer == "host" and m.samples_ms == [pytest.approx(call_ms)] * 8 and len(calls) == 1 + 4 + 8
    calls.clear()
    bare = Timer(backends.get("interpreter"), "auto", 0.0, 0.0, lambda m: None)._host(op)
    assert len(bare.samples_ms) == timers.HOST_REPS_RANGE[0] and len(calls) == 1 + timers.HOST_REPS_RANGE[0]
    calls.clear()
    long = Timer(backends.get("interpreter"), "auto", 1e6, 1e6, lambda m: None)._host(op)
    assert len(long.samples_ms) == timers.HOST_REPS_RANGE[1]
    assert len(calls) == 1 + timers.WARMUP_RANGE[1] + timers.HOST_REPS_RANGE[1]


def test_measurement_summary_has_every_statistic():
    s = Measurement([1.0, 2.0, 3.0, 4.0, 10.0], "graph").summary()
    assert s == {"n": 5, "median": 3.0, "mean": 4.0, "std": pytest.approx(np.std([1, 2, 3, 4, 10], ddof=1)),
                 "min": 1.0, "max": 10.0, "p20": pytest.approx(1.8), "p80": pytest.approx(5.2), "latency": 3.0}
    assert Measurement([1.0, 3.0], "graph").summary()["std"] == pytest.approx(2 ** 0.5)
    one = Measurement([2.0], "direct", l2_flush_ms=0.5)
    assert one.summary()["std"] == 0.0 and one.summary()["l2_flush_ms"] == 0.5 and one.median_ms == 2.0


def test_a_markers_detail_is_the_errors_first_line_cut_or_its_type():
    assert timers._first_line(RuntimeError("  first\nsecond")) == "first"
    assert timers._first_line(RuntimeError("x" * 300)) == "x" * 200
    assert timers._first_line(RuntimeError("")) == "RuntimeError"


def test_a_failed_replay_is_classified_with_its_phase(monkeypatch):
    t, accel, marks = standin_timer(monkeypatch, replay_error="CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        t.measure_pair("op", {"x": accel.op(CALL_MS)})
    t, accel, marks = standin_timer(monkeypatch, replay_error="CUDA error: unknown error")
    with pytest.raises(timers.CapturePoisoned, match="^CUDA error: unknown error$"):
        t.measure_pair("op", {"x": accel.op(CALL_MS)})
    assert marks == ["CAPTURE_POISONED phase=replay detail='CUDA error: unknown error'"]


def test_a_fallback_whose_liveness_probe_fails_is_poisoned():
    # On this CPU-only torch a tensor on cuda:0 fails as a dead context would.
    marks = []
    t = Timer(backends.get("interpreter"), "auto", 0, 0, marks.append)
    t.backend = backends.get("cuda")
    with pytest.raises(timers.CapturePoisoned, match="Torch not compiled with CUDA enabled"):
        t._check_alive()
    assert marks == ["CAPTURE_POISONED phase=after_fallback detail='Torch not compiled with CUDA enabled'"]


def test_a_cold_timer_allocates_its_flush_buffer_once_on_the_device_at_twice_the_l2(monkeypatch):
    standin_cuda.install(monkeypatch, standin_cuda.StandInCuda())
    allocated = []
    monkeypatch.setattr(torch, "empty", lambda *shape, **kw: allocated.append((shape, kw)) or "buffer")
    backend = dataclasses.replace(backends.get("cuda"), l2_cache_bytes=lambda: 50 << 20)
    cold = Timer(backend, "graph", 1, 1, lambda m: None, l2="cold")
    assert cold._flush_buffer == "buffer" and cold._accel is torch.cuda
    assert allocated == [((timers.L2_FLUSH_FACTOR * (50 << 20),), {"dtype": torch.int8, "device": "cuda:0"})]
    allocated.clear()
    warm = Timer(backend, "graph", 1, 1, lambda m: None)
    assert warm._flush_buffer is None and allocated == []


def test_an_op_on_the_deny_list_is_timed_directly_without_a_capture(monkeypatch):
    t, accel, marks = standin_timer(monkeypatch, warmup_ms=0.0, rep_ms=0.125)
    t.backend = dataclasses.replace(t.backend, capture_deny=frozenset({"op"}))
    timed = t.measure_pair("op", {"a": accel.op(CALL_MS), "b": accel.op(2 * CALL_MS)})
    assert timed.timer == "direct" and accel.steps("capture") == []
    # 0.125 ms of 2**-7 is 16 calls; of 2**-6, 8, clamped to 10.
    assert timed.measurements["a"].samples_ms == [CALL_MS] * 16
    assert timed.measurements["b"].samples_ms == [2 * CALL_MS] * timers.REPS_RANGE[0]
    assert marks == ["TIMER_FALLBACK phase=deny reason=capture_denied detail='op is on the cuda capture deny list'"]


# --- within-process stopping (--max-noise) -------------------------------------------------------
def test_relative_error_is_the_medians_robust_standard_error_over_the_median():
    # median 3, absolute deviations 2 1 0 1 2: MAD 1, sd 1.4826, se sqrt(pi/2) * 1.4826 / sqrt(5)
    assert timers.relative_error([1, 2, 3, 4, 5]) == pytest.approx(0.27700, abs=1e-5)
    # One preempted sample among quiet ones does not make the estimate noisy.
    assert timers.relative_error([1.0] * 9 + [40.0]) == 0.0
    assert timers.relative_error([1.0]) == timers.relative_error([0.0, 0.0]) == float("inf")


def sampled_calls(samples, reps, max_noise):
    """What Timer._sampled takes from a sequence of samples: (the samples it kept, the sizes of its takes)."""
    t = Timer(backends.get("interpreter"), "auto", 0, 0, lambda m: None, max_noise=max_noise)
    source, takes = iter(samples), []

    def take(k):
        takes.append(k)
        return [next(source) for _ in range(k)]

    return t._sampled(take, reps), takes


def test_sampling_stops_once_the_median_is_known_within_max_noise_and_never_before_the_minimum():
    quiet = [1.0] * 100
    kept, takes = sampled_calls(quiet, 50, 0.001)
    assert len(kept) == timers.STOP_MIN_SAMPLES and takes == [timers.STOP_MIN_SAMPLES]
    # Off (0): the whole budget in one take, however quiet.
    assert sampled_calls(quiet, 50, 0.0) == ([1.0] * 50, [50])
    # Noisy until sample 20: sampled on, STOP_CHECK_EVERY at a time, to the first check it is known at.
    rng = np.random.default_rng(7)
    noisy = list(1 + 0.05 * rng.standard_normal(20)) + [1.0] * 100
    kept, takes = sampled_calls(noisy, 50, 0.002)
    assert takes[0] == timers.STOP_MIN_SAMPLES and set(takes[1:]) == {timers.STOP_CHECK_EVERY}
    assert timers.relative_error(kept) <= 0.002 < timers.relative_error(kept[:-timers.STOP_CHECK_EVERY])
    # Never known within it: the budget is the most it takes.
    kept, takes = sampled_calls(list(1 + 0.05 * rng.standard_normal(100)), 48, 0.0001)
    assert len(kept) == 48 and takes[-1] == 48 - timers.STOP_MIN_SAMPLES - timers.STOP_CHECK_EVERY * 7


def test_the_graph_timer_stops_replaying_once_the_row_is_known_within_max_noise(monkeypatch):
    t, accel, _ = standin_timer(monkeypatch)
    t.max_noise = 0.001
    m = t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"]
    # A graph sample is a chain of replays: its first check comes after 5 (a direct timer's after 10).
    assert len(m.samples_ms) == timers.GRAPH_STOP_MIN_SAMPLES == 5  # 50 without (the 100 ms budget)
    # The first 12 timed samples (after the probe's 4 replays and the timed graph's upload and timed replay;
    # 4 replays a sample) are disturbed by a different amount each: it samples on past them, and no further
    # than the first check that is within.
    t, accel, _ = standin_timer(monkeypatch, disturbed={6 + 4 * i: 0.04 * (i % 4) for i in range(12)})
    t.max_noise = 0.001
    m = t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"]
    assert timers.GRAPH_STOP_MIN_SAMPLES < len(m.samples_ms) < 50
    assert timers.relative_error(m.samples_ms) <= 0.001
    assert timers.relative_error(m.samples_ms[:-timers.STOP_CHECK_EVERY]) > 0.001
    assert len(accel.steps("replay")) == 4 + 2 + 4 * len(m.samples_ms)  # no replay beyond the samples kept


def test_the_cold_graph_timer_stops_its_paired_replays_together(monkeypatch):
    t, accel, _ = standin_timer(monkeypatch)
    t.l2, t._flush_buffer, t.max_noise = "cold", standin_cuda.Buffer(accel, 0.25), 0.001
    m = t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"]
    assert m.samples_ms == [pytest.approx(CALL_MS)] * timers.GRAPH_STOP_MIN_SAMPLES
    # probe 4, the timed graph's upload and timed replay 2, the flush graph's 1, then a chain of op replays
    # and one of flush replays a sample (4 each: the graph unrolls 2 calls of 0.26 ms)
    assert len(accel.steps("replay")) == 4 + 2 + 1 + 2 * 4 * timers.GRAPH_STOP_MIN_SAMPLES


def test_the_direct_timer_stops_at_a_check_and_synchronizes_once_a_check(monkeypatch):
    t, accel, _ = standin_timer(monkeypatch, warmup_ms=1.0, rep_ms=0.5)
    t.timer, t.max_noise = "direct", 0.001
    syncs_before = accel.log.count(("synchronize",))
    m = t.measure_pair("op", {"x": accel.op(CALL_MS)}).measurements["x"]
    assert m.samples_ms == [CALL_MS] * timers.STOP_MIN_SAMPLES  # 64 without (0.5 ms of 2**-7)
    # prepare's two, the warmup's, and one for the 10 samples
    assert accel.log.count(("synchronize",)) - syncs_before == 4


def test_the_host_timer_stops_once_known_within_max_noise(monkeypatch):
    clock = iter(range(10 ** 6))
    monkeypatch.setattr(timers.time, "perf_counter", lambda: next(clock) / 1000)  # each call 1 ms
    t = Timer(backends.get("interpreter"), "auto", 0, 100, lambda m: None, max_noise=0.01)
    m = t.measure_pair("op", {"x": lambda: None}).measurements["x"]
    assert m.samples_ms == [pytest.approx(1.0)] * timers.STOP_MIN_SAMPLES  # the budget would take 50
    t.max_noise = 0.0
    assert len(t.measure_pair("op", {"x": lambda: None}).measurements["x"].samples_ms) == 50


def test_the_run_specs_max_noise_reaches_the_timer_but_not_a_token_budget_or_the_profiler(tmp_path):
    (tmp_path / "full").mkdir()
    assert timing_plugin(tmp_path / "full", "cuda", max_noise=0.002)[0].timer.max_noise == 0.002
    (tmp_path / "passes").mkdir()
    assert timing_plugin(tmp_path / "passes", "cuda", only="passes", max_noise=0.002)[0].timer.max_noise == 0.0
    plugin, said = timing_plugin(tmp_path, "cuda", timer="profiler", max_noise=0.002)
    assert said[-1] == ("--max-noise not applied: the profiler timer samples in one profile; each side times its "
                        "whole --rep-ms budget")
    assert load(tmp_path / rundir.RUN_JSON)["observed"]["max_noise"]["applied"] is False


@pytest.mark.parametrize("text", ["20%", "nan%", "-1%", "0.5"])
def test_max_noise_out_of_range_is_refused_at_the_door(text, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["record", "add", "--backend", "interpreter", "--max-noise", text])
    assert stopped.value.code == 2 and "--max-noise" in capsys.readouterr().err


def test_a_stored_spec_with_max_noise_out_of_range_is_refused(tmp_path):
    spec = spec_mod.RunSpec("add", "interpreter", "record", 0, ["fp32"], "default", max_noise=0.5)
    spec_mod.write(tmp_path, spec)
    with pytest.raises(spec_mod.SpecError, match="max_noise 0.5 is not a fraction from 0 to 0.1"):
        spec_mod.read(tmp_path)


def test_the_timer_adds_up_the_host_seconds_of_each_phase(monkeypatch):
    # 1/64 ms of Python a call: the 4 ms of warmup (256 calls, half the device's count: the host is the slower),
    # the 3-call estimate and its discarded first call, the probe's 10 captured calls and the unroll's 54 are
    # what each phase cost the host, over two sides.
    host_ms = 2 ** -6
    t, accel, _ = standin_timer(monkeypatch)
    t.measure_pair("op", {"a": accel.op(CALL_MS, host_ms=host_ms), "b": accel.op(CALL_MS, host_ms=host_ms)})
    assert dict(t.seconds).keys() == {"estimate", "warmup", "capture", "probe", "samples"}
    assert t.seconds["estimate"] == pytest.approx(2 * 4 * host_ms / 1000)
    assert t.seconds["warmup"] == pytest.approx(2 * 256 * host_ms / 1000)
    assert t.seconds["capture"] == pytest.approx(2 * (timers.GRAPH_PROBE_CALLS + 54) * host_ms / 1000)
    assert t.seconds["probe"] == t.seconds["samples"] == 0.0  # replays cost the stand-in's host nothing


# --- a replay's graphs sized by its record's -------------------------------------------------------
def recorded(monkeypatch, kernel_ms=CALL_MS, **op) -> timers.GraphSizes:
    """The graph sizes a record's side carries, from the real timer on a stand-in device of its own."""
    t, accel, _ = standin_timer(monkeypatch)
    m = t.measure_pair("op", {"x": accel.op(kernel_ms, **op)}).measurements["x"]
    assert t.sized == {"probed": 1} and m.summary()["graph_sizes"] == m.graph_sizes.to_json()
    return m.graph_sizes


def test_a_replay_captures_its_graph_once_at_the_records_unroll_and_estimates_nothing(monkeypatch):
    sizes = recorded(monkeypatch)
    assert (sizes.unroll, sizes.capped) == (54, None) and sizes.estimate_ms == CALL_MS
    t, accel, marks = standin_timer(monkeypatch)
    m = t.measure_pair("op", {"x": accel.op(CALL_MS, first_call_ms=50.0)}, sizes={"x": sizes}).measurements["x"]
    # No estimate: the warmup (the budget over the record's estimate, 512 calls) takes the first call.
    assert accel.launches_before_first_capture() == 512 and accel.log[0] == ("launch", "first call")
    assert graph_captures(accel) == [(54, "copy of real")] and t.sized == {"record": 1}
    # The upload, the two replays that check the record's call time, then 5 replays a sample: the chain
    # reaches GRAPH_SAMPLE_MS at the 54-call graph's own call time (the record's probe of 10 calls read
    # its replay overhead as a larger share of each call, and chained 4).
    assert [n for _, _, n in accel.steps("replay")] == [54] * (1 + 2 + 5 * len(m.samples_ms))
    assert m.samples_ms == [pytest.approx((54 * CALL_MS + REPLAY_MS) / 54)] * len(m.samples_ms)
    assert m.graph_sizes.unroll == 54 and marks == [] and "estimate" not in t.seconds


@pytest.mark.parametrize("factor", [4.0, 0.25])
def test_a_replay_whose_call_is_far_from_the_records_sizes_its_graph_afresh(monkeypatch, factor):
    sizes = recorded(monkeypatch)
    t, accel, _ = standin_timer(monkeypatch)
    m = t.measure_pair("op", {"x": accel.op(CALL_MS * factor)}, sizes={"x": sizes}).measurements["x"]
    per_call = (54 * CALL_MS * factor + REPLAY_MS) / 54
    unroll = math.ceil(timers.GRAPH_UNROLL_MS / per_call)
    assert graph_captures(accel) == [(54, "copy of real"), (unroll, "copy of real")] and t.sized == {"resized": 1}
    assert m.samples_ms == [pytest.approx((unroll * CALL_MS * factor + REPLAY_MS) / unroll)] * len(m.samples_ms)
    assert m.graph_sizes.unroll == unroll


def test_a_call_within_the_resize_factor_keeps_the_records_unroll(monkeypatch):
    sizes = recorded(monkeypatch)
    t, accel, _ = standin_timer(monkeypatch)
    t.measure_pair("op", {"x": accel.op(CALL_MS * 1.5)}, sizes={"x": sizes})
    assert graph_captures(accel) == [(54, "copy of real")] and t.sized == {"record": 1}


def test_a_tiny_kernels_replay_compares_its_graphs_call_time_with_the_records_graph_not_its_probe(monkeypatch):
    # ~1 us a call: the record's 10-call probe read 2.5 us a call (its replay's overhead over 10 calls), its
    # 197-call graph 1.06 us. The same kernel replayed keeps the record's graph.
    sizes = recorded(monkeypatch, kernel_ms=2 ** -10)
    assert sizes.unroll == 197 and sizes.call_ms == pytest.approx((197 * 2 ** -10 + REPLAY_MS) / 197)
    t, accel, _ = standin_timer(monkeypatch)
    t.measure_pair("op", {"x": accel.op(2 ** -10)}, sizes={"x": sizes})
    assert graph_captures(accel) == [(197, "copy of real")] and t.sized == {"record": 1}


def test_a_records_capped_unroll_is_kept_and_said_again_on_the_replays_row(monkeypatch):
    sizes = recorded(monkeypatch, host_ms=125 / 16)
    assert sizes.unroll == 32 and sizes.capped.startswith("GRAPH_UNROLL_CAPPED unroll=32 wanted=54")
    t, accel, marks = standin_timer(monkeypatch)
    t.measure_pair("op", {"x": accel.op(CALL_MS, host_ms=125 / 16)}, sizes={"x": sizes})
    assert graph_captures(accel) == [(32, "copy of real")] and marks == [sizes.capped]


def test_only_the_sides_with_sizes_skip_their_probe(monkeypatch):
    sizes = recorded(monkeypatch)
    t, accel, _ = standin_timer(monkeypatch)
    t.measure_pair("op", {"baseline": accel.op(CALL_MS), "candidate": accel.op(CALL_MS)}, sizes={"candidate": sizes})
    assert [calls for calls, _ in graph_captures(accel)] == [timers.GRAPH_PROBE_CALLS, 54, 54]
    assert t.sized == {"probed": 1, "record": 1}


@pytest.mark.parametrize("data", [
    None, [], {}, {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": 5},  # a field missing
    {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": 5, "capped": None, "more": 1},
    {"estimate_ms": "0.1", "call_ms": 0.1, "unroll": 5, "capped": None},
    {"estimate_ms": 0.1, "call_ms": float("nan"), "unroll": 5, "capped": None},
    {"estimate_ms": 0.1, "call_ms": -1.0, "unroll": 5, "capped": None},
    {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": 0, "capped": None},
    {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": 5.0, "capped": None},
    {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": True, "capped": None},
    {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": timers.GRAPH_MAX_UNROLL + 1, "capped": None},
    {"estimate_ms": 0.1, "call_ms": 0.1, "unroll": 5, "capped": 3},
])
def test_stored_graph_sizes_that_are_not_what_the_timer_writes_are_not_used(data):
    assert timers.GraphSizes.from_json(data) is None


def test_graph_sizes_round_trip_through_json():
    sizes = timers.GraphSizes(0.01, 0.009, 54, "GRAPH_UNROLL_CAPPED unroll=54")
    assert timers.GraphSizes.from_json(json.loads(json.dumps(sizes.to_json()))) == sizes


def sized_row(case, **sides):
    return result_row(case=case, samples={side: {"n": 10, **({"graph_sizes": s.to_json()} if s else {})}
                                          for side, s in sides.items()})


def replay_plugin(tmp_path, rows: list[dict], only=None) -> tuple[TimingPlugin, Path]:
    """A replay's timing plugin (configured) over a record of `rows`, and the replay's run dir."""
    record, replay = tmp_path / "record", tmp_path / "replay"
    record.mkdir()
    replay.mkdir()
    (record / rundir.RESULTS_JSON).write_text(json.dumps({"format": RESULTS_FORMAT, "rows": rows}))
    spec = spec_mod.RunSpec("add", "cuda", "replay", 0, ["fp16"], "default", replay_from=str(record), only=only)
    ctx = types.SimpleNamespace(spec=spec, backend=backends.get("cuda"), mark=lambda m: None, say=print, run_dir=replay)
    plugin = TimingPlugin(ctx)
    plugin.pytest_configure(None)
    return plugin, replay


def test_a_replays_timing_plugin_hands_each_case_its_records_sizes_and_says_how_it_sized(tmp_path, monkeypatch):
    one, two = timers.GraphSizes(CALL_MS, CALL_MS, 54), timers.GraphSizes(0.5, 0.5, 1)
    rows = [sized_row("fp16-8", baseline=one, candidate=two), sized_row("fp16-16", baseline=None, candidate=two),
            sized_row("twice", candidate=one), sized_row("twice", candidate=one), sized_row("none", candidate=None)]
    plugin, replay = replay_plugin(tmp_path, rows)
    # A case on two rows would not say which row's sizes are whose: neither is used.
    assert plugin.sizes == {"fp16-8": {"baseline": one, "candidate": two}, "fp16-16": {"candidate": two}}
    asked = []

    def measure_pair(name, fns, relocate, attributed, sizes):
        asked.append(sizes)
        return timers.Timed({k: Measurement([1.0], "graph") for k in fns}, "graph")

    plugin.timer.measure_pair = measure_pair
    for case in ("fp16-8", "twice", "fp16-16"):
        plugin.pytest_zl_case_started(case, case)
        plugin.measure("add", {"baseline": None, "candidate": None})
    assert asked == [{"baseline": one, "candidate": two}, None, {"candidate": two}]
    plugin.timer.sized.update(record=3, probed=1)
    plugin.pytest_sessionfinish(None)
    assert load(replay / rundir.RUN_JSON)["observed"]["graph_sizes"] == {"probed": 1, "record": 3}


@pytest.mark.parametrize(("content", "reason"), [
    (None, "its record's rows could not be read: "),
    ([1, 2], "its record's rows could not be read: "),
    ({"format": RESULTS_FORMAT, "rows": 5}, "its record's rows could not be read: "),
    ({"format": RESULTS_FORMAT, "rows": [{"case": "a"}]}, "its record's rows could not be read: "),
    ({"format": RESULTS_FORMAT, "rows": [result_row(case="a", samples={"candidate": {"n": 3}})]},
     "its record's rows carry no graph sizes"),
])
def test_a_replay_without_sizes_to_go_by_probes_and_says_why(tmp_path, content, reason):
    if content is not None:
        (tmp_path / rundir.RESULTS_JSON).write_text(json.dumps(content))
    sizes, why = recorded_sizes(*record_rows(tmp_path))
    assert sizes == {} and why.startswith(reason)


def test_a_record_and_a_run_of_another_timer_read_no_sizes(tmp_path):
    plugin, _ = timing_plugin(tmp_path, "cuda")
    assert plugin.sizes == {} and plugin.sizes_missing is None


# --- a timing-only replay times the baseline only where a process factor reads it -----------------------
def controlled_replay(tmp_path, only="timing"):
    """A replay's timing plugin over a record of 18 rows: 16 of 2-3.5 us (one band, 16 rows: 12 are its
    controls), one of 40 us alone in its band, one of 9.5 us (5% under the 10 us edge)."""
    latencies = {f"fp16-{i}": 0.002 + i * 0.0001 for i in range(16)} | {"alone": 0.040, "edge": 0.0095}
    plugin, replay = replay_plugin(
        tmp_path, [result_row(case=case, baseline_ms=ms, candidate_ms=ms) for case, ms in latencies.items()], only)
    timed = []

    def measure_pair(name, fns, relocate, attributed, sizes):
        timed.append(sorted(fns))
        return timers.Timed({k: Measurement([1.0], "graph") for k in fns}, "graph")

    plugin.timer.measure_pair = measure_pair
    return plugin, replay, timed


def test_a_timing_only_replay_times_the_baseline_only_of_the_rows_a_process_factor_reads(tmp_path):
    plugin, replay, timed = controlled_replay(tmp_path)
    controls = {f"fp16-{i}" for i in (0, 1, 3, 4, 5, 7, 8, 10, 11, 12, 14, 15)} | {"edge"}
    assert plugin.controls == controls  # 12 of the band's 16, spread; 'alone' feeds no factor; 'edge' may move
    got = {}
    for case in ("fp16-0", "fp16-2", "alone", "edge"):
        plugin.pytest_zl_case_started(case, case)
        got[case] = sorted(plugin.measure("add", {"baseline": None, "candidate": None}).measurements)
    assert got == {"fp16-0": ["baseline", "candidate"], "fp16-2": ["candidate"], "alone": ["candidate"],
                   "edge": ["baseline", "candidate"]}
    assert timed == list(got.values())  # nothing timed for a baseline left out
    # FlagGems times one side a call: its baseline before its candidate (not carried) is left out, and
    # timed where the benchmark times nothing else (carried: the row's one side).
    plugin.pytest_zl_case_started("alone", "alone")
    assert plugin.measure("exp", {"baseline": None}, carried=False).measurements == {}
    assert list(plugin.measure("exp", {"baseline": None}, carried=True).measurements) == ["baseline"]
    plugin.pytest_sessionfinish(None)
    assert load(replay / rundir.RUN_JSON)["observed"]["controls"] == {"cases": 13, "of": 18, "baselines_left": 3}


@pytest.mark.parametrize("only", [None, "passes"])
def test_a_replay_that_is_not_timing_only_times_every_baseline(tmp_path, only):
    plugin, replay, timed = controlled_replay(tmp_path, only=only)
    plugin.pytest_zl_case_started("alone", "alone")
    timed_sides = plugin.measure("add", {"baseline": None, "candidate": None}).measurements
    assert sorted(timed_sides) == ["baseline", "candidate"]
    assert plugin.controls is None and "controls" not in load(replay / rundir.RUN_JSON)["observed"]
