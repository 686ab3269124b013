"""Device kernel time from the accelerator's profiler (torch's autograd profiler: Kineto over CUPTI on CUDA).

Two uses: `--timer profiler`, whose samples are the summed device time of an op's kernels per
call (no launch gaps, no host time), and the per-kernel attribution every row carries whatever its
timer. Both launch the op's calls directly, not from a graph: the profiler reads each kernel's own
start and end on the device, so the host's launch gaps between calls do not enter the number, and
an op that cannot be captured is profiled like any other.

The parsing is pure functions over `KernelEvent`s, so it is tested without a device.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence


class ProfileError(RuntimeError):
    """The profile does not split into calls: the number would not be the op's per-call time."""


@dataclasses.dataclass(frozen=True)
class KernelEvent:
    name: str
    start_us: float
    duration_ms: float


def device_events(events, device_type: str) -> list[KernelEvent]:
    """The device activities of a profiler's event list (a profile's `function_events`), in
    start order: events of `device_type` (a DeviceType name: CUDA) not nested in another event.
    Kernels, copies and memsets never nest; on the CPU, where the tests run it, these are the
    top-level ops."""
    picked = [KernelEvent(e.name, e.time_range.start, e.time_range.elapsed_us() / 1e3)
              for e in events if e.device_type.name == device_type and e.cpu_parent is None]
    return sorted(picked, key=lambda k: k.start_us)


def per_call(events: Sequence[KernelEvent], calls: int) -> list[list[KernelEvent]]:
    """`events` as `calls` consecutive equal runs, one per call: an op launches the same kernels
    on every call, in one stream's order."""
    if calls <= 0 or len(events) % calls:
        raise ProfileError(f"{len(events)} device events over {calls} calls: the op does not launch the "
                           "same kernels on every call")
    k = len(events) // calls
    return [list(events[i * k:(i + 1) * k]) for i in range(calls)]


def drop_leading(calls: list[list[KernelEvent]], names: tuple[str, ...]) -> list[list[KernelEvent]]:
    """Each call's events less the leading `names` (the L2 flush launched before it), checked by
    name: a call whose events do not start with them was not split where the flush is."""
    n = len(names)
    for call in calls:
        if tuple(e.name for e in call[:n]) != names:
            raise ProfileError(f"the L2 flush's kernels {list(names)} do not lead every call's device events "
                               f"(one call starts {[e.name for e in call[:n]]}): its kernels run out of order")
    return [call[n:] for call in calls]


def sample_means(calls: list[list[KernelEvent]], calls_per_sample: int) -> list[float]:
    """One sample per `calls_per_sample` consecutive calls: their device time per call (ms).
    Averaging a few calls per sample smooths the device clock's tick (tens of ns), which would
    otherwise make the median of a 1 us kernel jump between ticks from run to run."""
    groups = len(calls) // calls_per_sample
    return [sum(e.duration_ms for call in calls[g * calls_per_sample:(g + 1) * calls_per_sample] for e in call)
            / calls_per_sample for g in range(groups)]


def attribute(calls: list[list[KernelEvent]]) -> list[dict]:
    """Where a call's device time goes, per kernel name: launches per call, time per call (ms) and
    share of the call's device time, largest share first (the results row's `kernels`)."""
    n = len(calls)
    time_ms: dict[str, float] = collections.defaultdict(float)
    launches: collections.Counter = collections.Counter()
    for call in calls:
        for e in call:
            time_ms[e.name] += e.duration_ms
            launches[e.name] += 1
    total = sum(time_ms.values())
    rows = [{"name": name, "launches_per_call": launches[name] / n, "time_ms": time_ms[name] / n,
             "share": time_ms[name] / total if total > 0 else 0.0} for name in time_ms]
    return sorted(rows, key=lambda r: (-r["share"], r["name"]))


def record(fn: Callable[[], object], calls: int, activity: str, sync: Callable[[], None],
           flush: Callable[[], object] | None = None) -> list[KernelEvent]:
    """Profile `calls` direct calls of `fn` (each after `flush`, when given) on the device
    activity `activity` (a torch.profiler ProfilerActivity name: CPU, or the device type's name in
    capitals); the device events, in order.

    Through the autograd profiler that torch.profiler.profile wraps, not the wrapper: the wrapper's
    start probes `torch._inductor`, and that probe imports Inductor, Dynamo and sympy, about 4.7 s
    of every process's first profile on an H200 host (a replay step's largest fixed cost)."""
    from torch.autograd import profiler

    device = None if activity == "CPU" else activity.lower()
    with profiler.profile(use_cpu=device is None, use_device=device, use_kineto=True) as prof:
        for _ in range(calls):
            if flush is not None:
                flush()
            fn()
        sync()
    return device_events(prof.function_events, activity)


def profile_calls(fn: Callable[[], object], calls: int, activity: str, sync: Callable[[], None],
                  flush: Callable[[], object] | None = None,
                  flush_names: tuple[str, ...] = ()) -> list[list[KernelEvent]]:
    """The device events of each of `calls` calls of `fn`, the flush's own (`flush_names`, see
    `flush_signature`) removed."""
    calls_events = per_call(record(fn, calls, activity, sync, flush), calls)
    return drop_leading(calls_events, flush_names) if flush is not None else calls_events


def flush_signature(flush: Callable[[], object], activity: str, sync: Callable[[], None],
                    calls: int = 3) -> tuple[str, ...]:
    """The names of the device events one call of `flush` launches, in order."""
    calls_events = per_call(record(flush, calls, activity, sync), calls)
    names = {tuple(e.name for e in call) for call in calls_events}
    if len(names) != 1 or not next(iter(names)):
        raise ProfileError(f"the L2 flush does not launch the same device work on every call: {sorted(names)}")
    return names.pop()
