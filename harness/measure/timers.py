"""Timers: CUDA-graph replay, direct event timing, and a host clock for the interpreter.

Small kernels timed directly measure mostly Python launch overhead, so the graph timer is the
default wherever the backend can capture. A capture failure is classified from its error text
by the backend: recoverable failures fall back to direct timing for that measurement with a
marker, fatal ones re-raise, and a poisoned context stops the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

import backends

WARMUP_RANGE = (1, 1000)
REPS_RANGE = (10, 1000)
HOST_REPS_RANGE = (3, 50)
# One graph replay unrolls enough calls to last about this long, so the replay's own launch cost
# (~10 us) vanishes against the kernels being timed: a 1.6 us kernel replayed one call at a time
# reads 10x slow. The per-call estimate comes from a probe graph, never from host-side timing,
# which for small kernels measures the Python launch path.
GRAPH_REPLAY_TARGET_MS = 2.0
GRAPH_PROBE_CALLS = 10
GRAPH_MAX_UNROLL = 2000


def clamp_count(budget_ms: float, per_call_ms: float, bounds: tuple[int, int]) -> int:
    lo, hi = bounds
    if per_call_ms <= 0:
        return hi
    return max(lo, min(hi, math.ceil(budget_ms / per_call_ms)))


@dataclasses.dataclass
class Measurement:
    samples_ms: list[float]
    timer: str

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    def summary(self) -> dict:
        a = np.asarray(self.samples_ms)
        return {"n": int(a.size), "median": float(np.median(a)), "mean": float(a.mean()),
                "std": float(a.std(ddof=1)) if a.size > 1 else 0.0, "min": float(a.min()),
                "max": float(a.max()), "p20": float(np.percentile(a, 20)),
                "p80": float(np.percentile(a, 80))}


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
                 mark: Callable[[str], None]):
        self.backend = backend
        self.timer = backend.default_timer if timer == "auto" else timer
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.mark = mark
        self._accel = None
        if backend.triton_driver:
            import torch

            self._accel = getattr(torch, backend.torch_device_type)

    # --- public ------------------------------------------------------------------------------
    def measure_pair(self, test_name: str, fns: dict[str, Callable[[], object]]) -> Timed:
        """Time every fn on one caliber: if any side cannot be captured, all sides are timed
        directly, so a row never compares a graph number with a direct one."""
        if self.timer == "host":
            return Timed({k: self._host(fn) for k, fn in fns.items()}, "host")
        if self.timer == "direct":
            return Timed({k: self._direct(fn) for k, fn in fns.items()}, "direct")
        if test_name in self.backend.capture_deny:
            self.mark(f"TIMER_FALLBACK phase=deny reason=capture_denied "
                      f"detail='{test_name} is on the {self.backend.name} capture deny list'")
            return Timed({k: self._direct(fn) for k, fn in fns.items()}, "direct")
        try:
            return Timed({k: self._graph(fn) for k, fn in fns.items()}, "graph")
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
            return Timed({k: self._direct(fn) for k, fn in fns.items()}, "direct")

    # --- timers ------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self._accel is not None:
            self._accel.synchronize()

    def _event_pair_ms(self, fn: Callable[[], object], calls: int = 1) -> float:
        start, end = self._accel.Event(enable_timing=True), self._accel.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls

    def _prepare(self, fn) -> float:
        """Run once and discard (absorbs JIT and autotune), then estimate one call's time."""
        self._sync()
        fn()
        self._sync()
        return self._event_pair_ms(fn, calls=3)

    def _direct(self, fn) -> Measurement:
        est = self._prepare(fn)
        for _ in range(clamp_count(self.warmup_ms, est, WARMUP_RANGE)):
            fn()
        self._sync()
        reps = clamp_count(self.rep_ms, est, REPS_RANGE)
        # Queue every call with its events and synchronize once: a sync per sample would start
        # each call on an idle device and add the host's launch latency to every sample.
        starts = [self._accel.Event(enable_timing=True) for _ in range(reps)]
        ends = [self._accel.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends, strict=False):
            start.record()
            fn()
            end.record()
        self._sync()
        return Measurement([s.elapsed_time(e) for s, e in zip(starts, ends, strict=False)], "direct")

    def _capture(self, fn, calls: int):
        accel = self._accel
        graph = getattr(accel, self.backend.graph_class)()
        try:
            with scratch_rng(accel), accel.graph(graph, stream=accel.Stream()):
                for _ in range(calls):
                    fn()
        except Exception as exc:  # classified by the caller from the backend's markers
            raise _CaptureFailed("capture", exc) from exc
        return graph

    def _replay_ms(self, graph) -> float:
        start, end = self._accel.Event(enable_timing=True), self._accel.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def _graph(self, fn) -> Measurement:
        est = self._prepare(fn)
        for _ in range(clamp_count(self.warmup_ms, est, WARMUP_RANGE)):
            fn()
        self._sync()
        graph = self._capture(fn, GRAPH_PROBE_CALLS)
        try:
            graph.replay()
            self._sync()
            per_call = min(self._replay_ms(graph) for _ in range(3)) / GRAPH_PROBE_CALLS
            unroll = max(1, min(GRAPH_MAX_UNROLL, math.ceil(GRAPH_REPLAY_TARGET_MS / max(per_call, 1e-6))))
            if unroll != GRAPH_PROBE_CALLS:
                graph = None
                graph = self._capture(fn, unroll)
                graph.replay()
                self._sync()
            reps = clamp_count(self.rep_ms, per_call * unroll, REPS_RANGE)
            samples = [self._replay_ms(graph) / unroll for _ in range(reps)]
        except _CaptureFailed:
            raise
        except Exception as exc:
            raise _CaptureFailed("replay", exc) from exc
        finally:
            graph = None  # release the graph's memory pool before the next measurement
        return Measurement(samples, "graph")

    def _host(self, fn) -> Measurement:
        start = time.perf_counter()
        fn()
        est = (time.perf_counter() - start) * 1e3
        for _ in range(clamp_count(self.warmup_ms, est, (0, WARMUP_RANGE[1]))):
            fn()
        samples = []
        for _ in range(clamp_count(self.rep_ms, est, HOST_REPS_RANGE)):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return Measurement(samples, "host")

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
