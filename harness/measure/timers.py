"""Timers: CUDA-graph replay, direct event timing, the device profiler's kernel time, and a host
clock for the interpreter.

Small kernels timed directly measure mostly Python launch overhead, so the graph timer is the
default wherever the backend can capture. A capture failure is classified from its error text
by the backend: recoverable failures fall back to direct timing for that measurement with a
marker, fatal ones re-raise, and a poisoned context stops the run.

The graph timer's per-call time still holds the launch gap between consecutive kernels inside the
graph (a few hundred ns), which is most of a 1 us kernel; the profiler timer (harness.measure.profile)
sums the kernels' own device time instead. Whatever the timer, each measured side is then profiled
once more for its per-kernel attribution, where the backend has a profiler.

L2: warm (the default) replays the same buffers, so inputs smaller than the L2 stay in it. Cold
writes a buffer of twice the L2 before every call: the direct and profiler timers leave the write
outside what they time; the graph timer, which can only time a whole replay, subtracts the time
of a flush-only graph of as many calls.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Collection

import numpy as np

import backends
from harness.core import bounded
from harness.measure import profile

WARMUP_RANGE = (1, 1000)
REPS_RANGE = (10, 1000)
# The direct timer's samples are single calls, each as noisy as the call (a host-synced op's: ~10% sd), so
# its --max-noise is seldom met and it took its whole budget: FlagGems' bincount, 1,000 samples a side, a
# repeat step 21 s for 72 rows on an H100. Across that op's repeats a side, the sd between processes of
# the candidate/baseline median was 1.54% at 250 samples, 1.47% at 1,000 and 1.69% at 100
# (docs/performance.md, "The direct timer's samples"): past 250 the samples narrow little the verdict reads.
DIRECT_REPS_RANGE = (10, 250)
HOST_REPS_RANGE = (3, 50)
# One sample replays the captured graph back to back until it lasts about GRAPH_SAMPLE_MS, so the
# replay's own launch cost (~10 us) vanishes against the kernels being timed: a 1.6 us kernel replayed
# one call at a time reads 10x slow. The graph itself unrolls calls for about GRAPH_UNROLL_MS only: its
# capture pays each call's Python (FlagGems: 72-123 us a call, 80-90 ms to capture 2 ms of a 1-2 us
# kernel), and a chain of 0.5 ms graphs read within 0.55% of one 2 ms graph on an H200, its samples' spread
# no wider, at a quarter to a third of the capture (docs/performance.md, "A chain of short graph replays").
# The per-call estimate comes from a probe graph, never from host-side timing, which for small kernels
# measures the Python launch path.
GRAPH_SAMPLE_MS = 2.0
GRAPH_UNROLL_MS = 0.5
GRAPH_PROBE_CALLS = 10
GRAPH_MAX_CHAIN = 200  # a graph whose replay reads near zero (no device work) is not replayed without end
GRAPH_MAX_UNROLL = 2000
# The host time one capture of the unrolled graph may take. The unroll is sized by device time, and a
# call whose Python costs far more than its kernel multiplied it: FlagGems' weight_int4pack benchmark
# enters use_gems() in every call (~10 ms of op registration for a 4 us kernel), and its 500-call captures
# made a row cost ~6 s on an H200. Capped, the unroll is at least the probe's (reused, no second capture)
# and the row is marked: the replay's own launch cost is then a larger share of each call.
GRAPH_CAPTURE_BUDGET_MS = 250.0
# Profiler timer: each sample averages enough calls to last about PROFILER_SAMPLE_MS (see
# profile.sample_means), within these bounds; the attribution pass profiles a few calls.
PROFILER_SAMPLE_MS = 0.1
PROFILER_CALLS_PER_SAMPLE = (1, 20)
PROFILER_SAMPLES_RANGE = (10, 100)
ATTRIBUTION_MS = 5.0
ATTRIBUTION_CALLS = (3, 20)
# The (warmup, rep) budget of a run whose timings are for no comparison (spec.RunSpec.token_timing: an
# A/B's record and passes steps): the fewest calls each timer takes (its ranges' lower bounds), enough
# to size the profiler pass. In an A/B's passes steps the full budget was ~0.25 s a row on an H200 for
# numbers no verdict reads. Its graph samples are one replay each (TOKEN_SAMPLE_MS): the 10 chained 2 ms
# samples were 0.4-2.2 s of a FlagGems record or passes step on an H100.
TOKEN_BUDGET_MS = (0.0, 0.0)
TOKEN_SAMPLE_MS = 0.0
# Twice the L2: its replacement policy is not strict LRU, and a buffer of exactly its size leaves
# some of the op's lines in place.
L2_FLUSH_FACTOR = 2
# With more than one timing window a side (`windows`, the run's --windows; why the default is one:
# harness.core.spec.DEFAULT_WINDOWS), the graph and direct timers spread each row over that many
# windows per side, the sides alternating, each captured afresh; the row's latency is the geometric
# mean of its windows' medians; the first window warms up for the whole warmup budget, the later ones
# for a share of it, the windows share the rep budget, and where the caller can, each window after the
# first times fresh copies of the inputs (`relocate`).
# The timers that take windows; the profiler and host timers time each side in one go.
WINDOWED_TIMERS = ("graph", "direct")
# Within-process stopping (--max-noise, the run's max_noise; NVBench's `stdrel` criterion, applied to the
# estimate rather than to the samples' spread): a timer stops sampling once its samples' median is known
# to within max_noise (relative_error), after at least STOP_MIN_SAMPLES samples, and checks again every
# STOP_CHECK_EVERY (a direct timer synchronizes at each check). The rep budget stays the upper bound, so a
# row that stays noisy costs what it did without it. The profiler timer samples in one profile: it takes
# no stopping rule.
STOP_MIN_SAMPLES = 10
STOP_CHECK_EVERY = 5
# A graph sample is a 2 ms chain of replays, not one call: its first check comes after 5. From an H100 corpus
# A/B's repeats (docs/performance.md, "Graph samples a side"), the median of a side's first 5 samples spread
# between processes 4% more than of its first 10 on rows under 10 us and ~20% more above (0.18-0.20% ->
# 0.22-0.24%: a ~0.3% interval at 5 repeats, well inside 1%), for ~20% less of a FlagGems repeat step (its
# samples were ~45% of it): where the noise lies between processes (small kernels), a device-second buys more.
GRAPH_STOP_MIN_SAMPLES = 5
STOPPING_TIMERS = ("graph", "direct", "host")
# A replay sizes each row's graph from its record's (GraphSizes): one capture, at the record's unroll, instead
# of the estimate (4 calls, 2 syncs) and the probe (a capture, 4 replays): ~30% of the timer's work outside the
# samples, 3-8% of a FlagGems repeat step on an H100 (docs/performance.md, "At chunk 8"). Two timed replays of
# that graph check the record's call time still holds; a call RESIZE_FACTOR times slower or faster (the other
# side's compiler) re-sizes the graph as a probe would, so the replay's launch cost stays as small a share of
# each call as the record's.
RESIZE_FACTOR = 2.0
SIZE_CHECK_REPLAYS = 2


def relative_error(samples_ms: list[float]) -> float:
    """The relative standard error of the samples' median: sqrt(pi/2) x a robust sd (1.4826 x the
    median absolute deviation) / sqrt(n), over the median. Robust, so one preempted sample does not
    keep a row sampling to its budget."""
    a = np.asarray(samples_ms, dtype=float)
    median = float(np.median(a))
    if a.size < 2 or median <= 0:
        return math.inf
    sd = 1.4826 * float(np.median(np.abs(a - median)))
    return math.sqrt(math.pi / 2) * sd / math.sqrt(a.size) / median


def clamp_count(budget_ms: float, per_call_ms: float, bounds: tuple[int, int]) -> int:
    lo, hi = bounds
    if per_call_ms <= 0:
        return hi
    return max(lo, min(hi, math.ceil(budget_ms / per_call_ms)))


# What a row's stored graph sizes must be (GraphSizes.from_json): anything else is sized by its own probe.
GRAPH_SIZES_FIELDS: bounded.Fields = {
    "estimate_ms": (lambda v: bounded.finite_number(v) and v >= 0, "a number of ms >= 0"),
    "call_ms": (lambda v: bounded.finite_number(v) and v >= 0, "a number of ms >= 0"),
    "unroll": (lambda v: type(v) is int and 1 <= v <= GRAPH_MAX_UNROLL,
               f"a whole number of calls from 1 to {GRAPH_MAX_UNROLL}"),
    "capped": (lambda v: v is None or isinstance(v, str), "a marker or null"),
}


@dataclasses.dataclass(frozen=True)
class GraphSizes:
    """How the graph timer sized a side's graph: one call's device time at the first calls' estimate (what
    its warmup counts by), one call's device time in the graph as captured (its replay over its calls: what a
    replay's own check compares), the calls the graph unrolls, and the marker its unroll cap left
    (GRAPH_UNROLL_CAPPED), if any. On the row's samples (`graph_sizes`), for the replays of its record."""
    estimate_ms: float
    call_ms: float
    unroll: int
    capped: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data) -> GraphSizes | None:
        """The sizes a stored row carries, or None where they are missing or not what this writes (an
        older record's row, a hand-edited file): that row's graph is then sized by its own probe."""
        problem = bounded.field_problem("graph_sizes", data, GRAPH_SIZES_FIELDS)
        if problem is not None or set(data) != set(GRAPH_SIZES_FIELDS):  # a field it does not write: not its
            return None
        return cls(float(data["estimate_ms"]), float(data["call_ms"]), data["unroll"], data["capped"])



@dataclasses.dataclass
class Measurement:
    samples_ms: list[float]
    timer: str
    # Per-kernel attribution (profile.attribute), None where the backend has no profiler.
    kernels: list[dict] | None = None
    # Cold L2 under the graph timer: the flush's own time per call, subtracted from every sample.
    l2_flush_ms: float | None = None
    # Each measurement window's median, where the timer spread the measurement over windows.
    windows_ms: list[float] | None = None
    # How the graph timer sized its graph (its first window's): what a replay of this record sizes by.
    graph_sizes: GraphSizes | None = None

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def latency_ms(self) -> float:
        """The row's latency: the geometric mean of its windows' medians (the median of its
        samples where it had one window)."""
        if not self.windows_ms:
            return self.median_ms
        return float(np.exp(np.mean(np.log(np.maximum(self.windows_ms, 1e-12)))))

    @classmethod
    def of_windows(cls, parts: list[Measurement]) -> Measurement:
        flush = [m.l2_flush_ms for m in parts if m.l2_flush_ms is not None]
        return cls([s for m in parts for s in m.samples_ms], parts[0].timer,
                   l2_flush_ms=float(np.mean(flush)) if flush else None,
                   windows_ms=[m.median_ms for m in parts] if len(parts) > 1 else None,
                   graph_sizes=parts[0].graph_sizes)

    def summary(self) -> dict:
        a = np.asarray(self.samples_ms)
        return {"n": int(a.size), "median": float(np.median(a)), "mean": float(a.mean()),
                "std": float(a.std(ddof=1)) if a.size > 1 else 0.0, "min": float(a.min()),
                "max": float(a.max()), "p20": float(np.percentile(a, 20)),
                "p80": float(np.percentile(a, 80)), "latency": self.latency_ms,
                **({"windows_ms": self.windows_ms} if self.windows_ms else {}),
                **({"l2_flush_ms": self.l2_flush_ms} if self.l2_flush_ms is not None else {}),
                **({"graph_sizes": self.graph_sizes.to_json()} if self.graph_sizes is not None else {})}


@dataclasses.dataclass
class Timed:
    measurements: dict[str, Measurement]
    timer: str


@contextlib.contextmanager
def scratch_rng(accel):
    """Run a graph capture against a throwaway copy of the device's default generator state.

    A capture registers the default generator's state with the graph and marks it capturing; an
    aborted capture never unmarks it, and every later RNG call in the process (torch.randn, the
    next case's inputs) then fails with "Offset increment outside graph capture". With a copy
    swapped in, the real state never takes part in a capture, whatever its outcome, and is put
    back as it was. A device module without default generators has no such state to protect."""
    generators = getattr(accel, "default_generators", None)
    if not generators:
        yield
        return
    generator = generators[accel.current_device()]
    real = generator.graphsafe_get_state()
    generator.graphsafe_set_state(generator.clone_state())
    try:
        yield
    finally:
        generator.graphsafe_set_state(real)


def subtract_flush(samples_ms: list[float], flush_samples_ms: list[float]) -> tuple[list[float], float]:
    """Cold L2 under the graph timer: each per-call sample of (flush + op) less the flush's own
    per-call time, the median of the flush-only graph's samples (a median, not each paired sample:
    one constant offset adds no noise of its own to the samples). Returns (samples, flush_ms)."""
    flush_ms = float(np.median(flush_samples_ms))
    return [s - flush_ms for s in samples_ms], flush_ms


class CapturePoisoned(RuntimeError):
    """The capture attempt killed the accelerator context: nothing after it can be trusted."""


class _CaptureFailed(Exception):
    def __init__(self, phase: str, error: BaseException):
        super().__init__(phase)
        self.phase = phase
        self.error = error


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


class Timer:
    def __init__(self, backend: backends.Backend, timer: str, warmup_ms: float, rep_ms: float,
                 mark: Callable[[str], None], l2: str = "warm", windows: int = 1, attribute: bool = True,
                 max_noise: float = 0.0, sample_ms: float = GRAPH_SAMPLE_MS):
        self.backend = backend
        self.sample_ms = sample_ms  # a graph sample's length: the replays of its chain
        self.max_noise = max_noise  # 0: every timer samples its whole rep budget
        self.attribute = attribute  # the profiler pass after timing (off: a timing-only run)
        self.timer = backend.default_timer if timer == "auto" else timer
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.windows = windows
        self.mark = mark
        self.l2 = l2
        self._flush_buffer = None
        self._flush_names: tuple[str, ...] | None = None
        self._accel = None
        self.host_clock = time.perf_counter  # what a capture costs the host (tests give their own clock)
        self._captured_call_ms = 0.0  # the host time of one call in the last capture
        # (test, its sides) -> the first line of the recoverable error its capture raised in this run: its
        # later rows are timed directly without trying again (a failed capture cost a warmup and a check).
        self._refused: dict[tuple[str, frozenset], str] = {}
        # Host seconds spent in each phase of the timer over the run (run.json observed.timer_seconds):
        # where a step's time goes beyond the samples a verdict reads.
        self.seconds: collections.Counter[str] = collections.Counter()
        # Graph sides by how their graph was sized (run.json observed.graph_sizes): by a probe, by the
        # record this run replays, or afresh where the record's call time no longer held.
        self.sized: collections.Counter[str] = collections.Counter()
        if backend.triton_driver:
            import torch

            self._accel = getattr(torch, backend.torch_device_type)
            if l2 == "cold":
                # Allocated once, here: never inside a capture, whose memory pool would own it.
                size = L2_FLUSH_FACTOR * backend.l2_cache_bytes()
                self._flush_buffer = torch.empty(size, dtype=torch.int8, device=backend.torch_device())

    @contextlib.contextmanager
    def _phase(self, name: str):
        started = self.host_clock()
        try:
            yield
        finally:
            self.seconds[name] += self.host_clock() - started

    # --- public ------------------------------------------------------------------------------
    def measure_pair(self, test_name: str, fns: dict[str, Callable[[], object]],
                     relocate: Callable[[], None] | None = None, attributed: Collection[str] | None = None,
                     sizes: dict[str, GraphSizes] | None = None) -> Timed:
        """Time every fn on one caliber, then attribute the device time of each side in `attributed`
        (default: every side) to its kernels. `relocate`, where given, moves the fns' inputs to fresh
        buffers before each later window. `sizes`: a side's graph sizes from the record this run replays
        (the graph timer's alone)."""
        self._relocate = relocate
        timed = self._time_pair(test_name, fns, sizes or {})
        if self.attribute and self.backend.profiler_activity:
            for side, measurement in timed.measurements.items():
                if measurement.kernels is None and (attributed is None or side in attributed):
                    with self._phase("attribution"):
                        self._attribute(side, fns[side], measurement)
        return timed

    def _time_pair(self, test_name: str, fns: dict[str, Callable[[], object]], sizes: dict[str, GraphSizes]) -> Timed:
        """If any side cannot be captured, all sides are timed directly, so a row never compares a
        graph number with a direct one."""
        if self.timer == "profiler":
            return Timed({k: self._profiled(fn) for k, fn in fns.items()}, "profiler")
        if self.timer == "host":
            return Timed({k: self._host(fn) for k, fn in fns.items()}, "host")
        if self.timer == "direct":
            return Timed(self._windows(fns, self._direct_side), "direct")
        if test_name in self.backend.capture_deny:
            self.mark(f"TIMER_FALLBACK phase=deny reason=capture_denied "
                      f"detail='{test_name} is on the {self.backend.name} capture deny list'")
            return Timed(self._windows(fns, self._direct_side), "direct")
        refused = (test_name, frozenset(fns))
        if refused in self._refused:
            self.mark(f"TIMER_FALLBACK phase=earlier_row reason=recoverable detail={self._refused[refused]!r}")
            return Timed(self._windows(fns, self._direct_side), "direct")
        def graph(side, fn, warmup_ms, rep_ms):
            return self._graph(fn, warmup_ms, rep_ms, sizes.get(side))

        try:
            return Timed(self._windows(fns, graph), "graph")
        except _CaptureFailed as failed:
            verdict = self.backend.classify_capture_error(failed.error)
            detail = _first_line(failed.error)
            if verdict == backends.POISONED:
                self.mark(f"CAPTURE_POISONED phase={failed.phase} detail={detail!r}")
                raise CapturePoisoned(detail) from failed.error
            if verdict == backends.FATAL:
                raise failed.error from None
            self.mark(f"TIMER_FALLBACK phase={failed.phase} reason=recoverable detail={detail!r}")
            self._check_alive()
            self._refused[refused] = detail
            return Timed(self._windows(fns, self._direct_side), "direct")

    def _direct_side(self, side: str, fn, warmup_ms: float, rep_ms: float) -> Measurement:
        return self._direct(fn, warmup_ms, rep_ms)

    def _windows(self, fns: dict[str, Callable[[], object]], timer) -> dict[str, Measurement]:
        """Each side timed in `self.windows` windows, the sides alternating window by window; `timer(side,
        fn, warmup_ms, rep_ms)` times one."""
        parts: dict[str, list[Measurement]] = {k: [] for k in fns}
        relocate = getattr(self, "_relocate", None)
        for window in range(self.windows):
            if window and relocate is not None:
                relocate()
            warmup = self.warmup_ms if window == 0 else self.warmup_ms / self.windows
            for k, fn in fns.items():
                parts[k].append(timer(k, fn, warmup, self.rep_ms / self.windows))
        return {k: Measurement.of_windows(ms) for k, ms in parts.items()}

    # --- timers ------------------------------------------------------------------------------
    def _sampled(self, take: Callable[[int], list[float]], reps: int, first: int = STOP_MIN_SAMPLES) -> list[float]:
        """`reps` samples, `take(k)` giving k more at a time; fewer where max_noise is set and the
        samples' median is known within it (relative_error) first, checked after `first`."""
        with self._phase("samples"):
            if not self.max_noise:
                return take(reps)
            samples = take(min(reps, first))
            while len(samples) < reps and relative_error(samples) > self.max_noise:
                samples += take(min(STOP_CHECK_EVERY, reps - len(samples)))
            return samples

    def _sync(self) -> None:
        if self._accel is not None:
            self._accel.synchronize()

    def _event_pair_ms(self, fn: Callable[[], object], calls: int) -> float:
        start, end = self._accel.Event(enable_timing=True), self._accel.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls

    def _prepare(self, fn) -> tuple[float, float]:
        """Run once and discard (absorbs JIT and autotune), then estimate one call's time: (on the device,
        on the host's clock), ms."""
        with self._phase("estimate"):
            self._sync()
            fn()
            self._sync()
            started = self.host_clock()
            est = self._event_pair_ms(fn, calls=3)
            return est, (self.host_clock() - started) * 1000 / 3

    def _warm_up(self, fn, budget_ms: float, per_call_ms: float, bounds: tuple[int, int] = WARMUP_RANGE) -> None:
        """Calls for `budget_ms` at the slower of the device's pace (`per_call_ms`: the count) and the host's (its
        clock, read as it goes): a 2 us FlagGems kernel whose Python takes 70 us a call was warmed by its
        1,000-call cap, 70 ms of host for 5 ms of budget, while the device idled between its calls."""
        with self._phase("warmup"):
            started = self.host_clock()
            for i in range(clamp_count(budget_ms, per_call_ms, bounds)):
                if i >= bounds[0] and (self.host_clock() - started) * 1000 >= budget_ms:
                    break
                fn()
            self._sync()

    def _direct(self, fn, warmup_ms: float | None = None, rep_ms: float | None = None) -> Measurement:
        # Its calls are counted at the slower of the device's pace and the host's. An op that waits on
        # the host (a size read back, a copy to unpinned memory: what refuses a capture) takes longer a
        # call on the host than on the device: counted at the device's pace, FlagGems' bincount took 1,000
        # samples of 0.09 ms a side, 0.26 s of wall a row on an H100, 2.5x its budgets.
        est = max(self._prepare(fn))
        self._warm_up(fn, self.warmup_ms if warmup_ms is None else warmup_ms, est)
        reps = clamp_count(self.rep_ms if rep_ms is None else rep_ms, est, DIRECT_REPS_RANGE)
        flush = self._flush if self.l2 == "cold" else None

        def take(calls: int) -> list[float]:
            # Queue the calls with their events and synchronize once: a sync per sample would start
            # each call on an idle device and add the host's launch latency to every sample.
            starts = [self._accel.Event(enable_timing=True) for _ in range(calls)]
            ends = [self._accel.Event(enable_timing=True) for _ in range(calls)]
            for start, end in zip(starts, ends, strict=False):
                if flush is not None:
                    flush()  # before the start event: the write is not timed
                start.record()
                fn()
                end.record()
            self._sync()
            return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=False)]

        return Measurement(self._sampled(take, reps), "direct")

    def _capture(self, fn, calls: int):
        accel = self._accel
        graph = getattr(accel, self.backend.graph_class)()
        try:
            with self._phase("capture"), scratch_rng(accel), accel.graph(graph, stream=accel.Stream()):
                started = self.host_clock()  # the calls alone: not the capture's own begin and end
                for _ in range(calls):
                    fn()
                self._captured_call_ms = (self.host_clock() - started) * 1000 / max(calls, 1)
        except Exception as exc:  # classified by the caller from the backend's markers
            raise _CaptureFailed("capture", exc) from exc
        return graph

    def _replay_ms(self, graph, replays: int = 1) -> float:
        """The device time of `replays` back-to-back replays of `graph`."""
        start, end = self._accel.Event(enable_timing=True), self._accel.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def _graph(self, fn, warmup_ms: float | None = None, rep_ms: float | None = None,
               sizes: GraphSizes | None = None) -> Measurement:
        est = self._prepare(fn)[0] if sizes is None else sizes.estimate_ms
        self._warm_up(fn, self.warmup_ms if warmup_ms is None else warmup_ms, est)
        body = fn if self.l2 == "warm" else self._flushed(fn)
        flush_ms = None
        graph = None
        try:
            if sizes is None:
                graph, per_call, unroll, capped, call_ms = self._probed_graph(body, est)
            else:
                graph, per_call, unroll, capped, call_ms = self._sized_graph(body, sizes)
            chain = max(1, min(GRAPH_MAX_CHAIN, math.ceil(self.sample_ms / max(per_call * unroll, 1e-9))))
            reps = clamp_count(self.rep_ms if rep_ms is None else rep_ms, per_call * unroll * chain, REPS_RANGE)
            if self.l2 == "warm":
                calls = unroll * chain
                samples = self._sampled(lambda k: [self._replay_ms(graph, chain) / calls for _ in range(k)], reps,
                                        GRAPH_STOP_MIN_SAMPLES)
            else:
                samples, flush_ms = self._cold_graph_samples(graph, unroll, chain, reps)
        except _CaptureFailed:
            raise
        except Exception as exc:
            raise _CaptureFailed("replay", exc) from exc
        finally:
            graph = None  # release the graph's memory pool before the next measurement
        return Measurement(samples, "graph", l2_flush_ms=flush_ms,
                           graph_sizes=GraphSizes(est, call_ms, unroll, capped))

    def _uploaded(self, graph, calls: int, timed: int = 0) -> float | None:
        """Replay a new graph of `calls` calls once (its upload), then `timed` times: one call's device time
        in it, the fastest of them (None where none is timed)."""
        with self._phase("probe"):
            graph.replay()
            self._sync()
            return min(self._replay_ms(graph) for _ in range(timed)) / calls if timed else None

    def _probed_graph(self, body, est: float):
        """(graph, one call's device time to size its chain by, its unroll, its cap marker or None, one call's
        device time in it): a probe graph of a few calls timed for the unroll, captured again at that unroll
        where it differs (and replayed once more, timed, for the last figure)."""
        # The probe unrolls no more calls than the graph's target needs at the direct estimate (an upper
        # bound: it holds the launch gaps). A 1.5 ms call's 10-call probe, replayed 3 times, cost 45 ms of
        # device time a side, then a second capture at 2 calls (FlagGems' 1G-element rows, 6 of acosh_'s 15).
        probe = GRAPH_PROBE_CALLS if est <= 0 else max(1, min(GRAPH_PROBE_CALLS,
                                                             math.ceil(GRAPH_UNROLL_MS / est)))
        graph = self._capture(body, probe)
        per_call = self._uploaded(graph, probe, 3)
        unroll, capped = self._unroll(per_call, self._captured_call_ms, probe)
        call_ms = per_call
        if unroll != probe:
            graph = None
            graph = self._capture(body, unroll)
            call_ms = self._uploaded(graph, unroll, 1)
        self.sized["probed"] += 1
        return graph, per_call, unroll, capped, call_ms

    def _sized_graph(self, body, sizes: GraphSizes):
        """The same, the graph captured once at the record's unroll (its cap marker said again) and its call
        time checked by SIZE_CHECK_REPLAYS replays against the record's: sized afresh, as from a probe, where
        it is RESIZE_FACTOR times slower or faster."""
        graph = self._capture(body, sizes.unroll)
        host_ms = self._captured_call_ms
        per_call = self._uploaded(graph, sizes.unroll, SIZE_CHECK_REPLAYS)
        if sizes.call_ms / RESIZE_FACTOR <= per_call <= sizes.call_ms * RESIZE_FACTOR:
            if sizes.capped is not None:
                self.mark(sizes.capped)
            self.sized["record"] += 1
            return graph, per_call, sizes.unroll, sizes.capped, per_call
        unroll, capped = self._unroll(per_call, host_ms, sizes.unroll)
        call_ms = per_call
        if unroll != sizes.unroll:
            graph = None
            graph = self._capture(body, unroll)
            call_ms = self._uploaded(graph, unroll, 1)
        self.sized["resized"] += 1
        return graph, per_call, unroll, capped, call_ms

    def _unroll(self, per_call_ms: float, host_ms: float, probe: int = GRAPH_PROBE_CALLS) -> tuple[int, str | None]:
        """(calls the graph unrolls, the cap's marker or None): enough to reach GRAPH_UNROLL_MS of device
        time, no more than GRAPH_CAPTURE_BUDGET_MS of host time to capture (never fewer than the probe's
        `probe`, already paid)."""
        unroll = max(1, min(GRAPH_MAX_UNROLL, math.ceil(GRAPH_UNROLL_MS / max(per_call_ms, 1e-6))))
        affordable = max(probe, math.floor(GRAPH_CAPTURE_BUDGET_MS / max(host_ms, 1e-9)))
        if unroll <= affordable:
            return unroll, None
        capped = (f"GRAPH_UNROLL_CAPPED unroll={affordable} wanted={unroll} host_ms_per_call={host_ms:.3g} "
                  f"device_ms_per_call={per_call_ms:.3g}")
        self.mark(capped)
        return affordable, capped

    def _cold_graph_samples(self, graph, unroll: int, chain: int, reps: int) -> tuple[list[float], float]:
        """(flush + op) samples interleaved with samples of a flush-only graph of as many calls, each a
        chain of `chain` replays, so both see the same clocks; the flush's per-call time is subtracted
        (subtract_flush)."""
        flush_graph = self._capture(self._flush, unroll)
        try:
            flush_graph.replay()
            self._sync()
            alone = []

            def take(k: int) -> list[float]:
                both = []
                for _ in range(k):
                    both.append(self._replay_ms(graph, chain) / (unroll * chain))
                    alone.append(self._replay_ms(flush_graph, chain) / (unroll * chain))
                return both

            both = self._sampled(take, reps, GRAPH_STOP_MIN_SAMPLES)
        finally:
            flush_graph = None
        samples, flush_ms = subtract_flush(both, alone)
        if np.median(samples) <= 0:
            self.mark(f"L2_FLUSH_DOMINATES flush_ms={flush_ms:.4g} detail='the op takes less than the flush's own "
                      "variation: its cold time is not resolved by the graph timer; use --timer profiler'")
        return samples, flush_ms

    def _profiled(self, fn) -> Measurement:
        """The summed device time of fn's kernels per call (profile.sample_means), and the
        attribution from the same events."""
        est, _ = self._prepare(fn)
        self._warm_up(fn, self.warmup_ms, est)
        per_sample = clamp_count(PROFILER_SAMPLE_MS, est, PROFILER_CALLS_PER_SAMPLE)
        reps = clamp_count(self.rep_ms, est * per_sample, PROFILER_SAMPLES_RANGE)
        with self._phase("samples"):
            calls = self._profile(fn, reps * per_sample)
        return Measurement(profile.sample_means(calls, per_sample), "profiler", kernels=profile.attribute(calls))

    # --- attribution and the L2 flush ----------------------------------------------------------
    def _profile(self, fn, calls: int) -> list[list[profile.KernelEvent]]:
        """Each call's device events, the cold flush's own removed."""
        activity = self.backend.profiler_activity
        if self.l2 == "warm":
            return profile.profile_calls(fn, calls, activity, self._sync)
        if self._flush_names is None:
            self._flush_names = profile.flush_signature(self._flush, activity, self._sync)
        return profile.profile_calls(fn, calls, activity, self._sync, self._flush, self._flush_names)

    def _attribute(self, side: str, fn, measurement: Measurement) -> None:
        """One profiled pass of a few calls after timing: where the side's device time goes."""
        calls = clamp_count(ATTRIBUTION_MS, measurement.median_ms, ATTRIBUTION_CALLS)
        try:
            measurement.kernels = profile.attribute(self._profile(fn, calls))
        except profile.ProfileError as exc:
            self.mark(f"KERNELS_UNATTRIBUTED side={side} detail={_first_line(exc)!r}")
            return
        if not measurement.kernels:
            # A view or metadata op (FlagGems' alias, a reshape): its time is launch and replay
            # overhead, near zero under a graph, so its ratios are noise, not compiler output.
            self.mark(f"NO_DEVICE_WORK side={side} detail='the profiled calls launched no device kernel: "
                      "the time measured is host or replay overhead'")

    def _flush(self) -> None:
        """Write a buffer of twice the device's L2, evicting whatever the last call left there."""
        self._flush_buffer.zero_()

    def _flushed(self, fn):
        def body():
            self._flush()
            fn()

        return body

    def _host(self, fn) -> Measurement:
        start = time.perf_counter()
        fn()
        est = (time.perf_counter() - start) * 1e3
        self._warm_up(fn, self.warmup_ms, est, (0, WARMUP_RANGE[1]))

        def take(calls: int) -> list[float]:
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - start) * 1e3)
            return samples

        return Measurement(self._sampled(take, clamp_count(self.rep_ms, est, HOST_REPS_RANGE)), "host")

    def _check_alive(self) -> None:
        """After a recoverable capture failure the context and the default generator must still
        work; if they do not, the failure was a poisoning one after all."""
        import torch

        try:
            # Not torch.randn: the probe must not depend on the generator a capture may have touched.
            self._sync()
            torch.ones(1, device=self.backend.torch_device()).add_(1).cpu()
            self._sync()
        except Exception as exc:
            self.mark(f"CAPTURE_POISONED phase=after_fallback detail={_first_line(exc)!r}")
            raise CapturePoisoned(_first_line(exc)) from exc
