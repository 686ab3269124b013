"""A stand-in for torch.cuda as the timers use it (events, graphs, graph capture, streams,
synchronize, the default generators), on a simulated device clock, so the real graph and direct
timers run on the CPU and every step they take is recorded.

The device runs one kernel at a time: an eager launch advances the clock by the kernel's time; under
capture the launch is added to the graph instead; a replay runs the graph's kernels plus a fixed
replay overhead, and the first replay of a graph also pays its upload, as a CUDA graph's does. An
event records the clock where it is queued, and like CUDA's it can be read only once the host has
waited for it and only if it was made with timing enabled. `log` holds what the code did, in order.
"""

from __future__ import annotations

import contextlib

# What the timers reach on torch's device module; `install` replaces exactly these.
API = ("Event", "CUDAGraph", "graph", "Stream", "synchronize", "current_device", "default_generators")


class Generator:
    """A default generator with the graph-safe state API the capture path uses."""

    def __init__(self):
        self.state = "real"

    def graphsafe_get_state(self):
        return self.state

    def clone_state(self):
        return f"copy of {self.state}"

    def graphsafe_set_state(self, state):
        self.state = state


class Stream:
    pass


class Event:
    def __init__(self, device: StandInCuda, enable_timing: bool = False):
        self.device, self.enable_timing = device, enable_timing
        self.at: float | None = None
        self.waited = False

    def record(self, stream=None):
        if self.device.capturing is not None:
            raise RuntimeError("the timers never record an event inside a capture")
        self.at, self.waited = self.device.clock, False
        self.device.pending.append(self)

    def synchronize(self):
        self.waited = True

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not end.waited:
            raise RuntimeError("CUDA error: device not ready")
        return end.at - self.at


class Graph:
    def __init__(self, device: StandInCuda):
        self.device = device
        self.kernels: list[float] = []
        self.replays = 0

    def replay(self):
        d = self.device
        if d.replay_error is not None:
            raise RuntimeError(d.replay_error)
        ms = sum(self.kernels) + d.replay_overhead_ms + (d.upload_ms if self.replays == 0 else 0.0)
        ms += d.disturbed.get(d.replays, 0.0)
        self.replays += 1
        d.replays += 1
        d.clock += ms
        d.log.append(("replay", self, len(self.kernels)))


class StandInCuda:
    def __init__(self, replay_overhead_ms: float = 2 ** -6, upload_ms: float = 5.0,
                 disturbed: dict[int, float] | None = None, replay_error: str | None = None):
        self.replay_overhead_ms = replay_overhead_ms
        self.upload_ms = upload_ms
        # Extra ms for the device's n-th replay (counted from 0 over all graphs): the host
        # interrupted it. And the error every replay raises, if any.
        self.disturbed = disturbed or {}
        self.replay_error = replay_error
        self.replays = 0
        self.clock = 0.0
        self.host_s = 0.0  # the host's clock (seconds): what the op's Python costs (`op(host_ms=...)`)
        self.capturing: Graph | None = None
        self.pending: list[Event] = []
        self.log: list[tuple] = []
        self.default_generators = (Generator(),)

    # --- torch.cuda's API ----------------------------------------------------------------------
    def Event(self, enable_timing: bool = False) -> Event:  # noqa: N802 (torch's names)
        return Event(self, enable_timing)

    def CUDAGraph(self) -> Graph:  # noqa: N802
        return Graph(self)

    def Stream(self) -> Stream:  # noqa: N802
        return Stream()

    def current_device(self) -> int:
        return 0

    def synchronize(self) -> None:
        for event in self.pending:
            event.waited = True
        self.pending.clear()
        self.log.append(("synchronize",))

    @contextlib.contextmanager
    def graph(self, graph: Graph, pool=None, stream=None):
        # Without a stream torch captures on the graph's own side stream: either is a capture.
        if not (stream is None or isinstance(stream, Stream)):
            raise TypeError(f"stream must be a Stream, not {type(stream).__name__}")
        if self.capturing is not None:
            raise RuntimeError("a capture is already under way")
        self.log.append(("capture", graph, self.default_generators[0].state))
        self.capturing = graph
        try:
            yield graph
        finally:
            self.capturing = None
        self.log.append(("captured", graph, len(graph.kernels)))

    # --- the op's side ---------------------------------------------------------------------------
    def launch(self, ms: float, name: str = "kernel") -> None:
        if self.capturing is not None:
            self.capturing.kernels.append(ms)
        else:
            self.clock += ms
            self.log.append(("launch", name))

    def op(self, ms: float, first_call_ms: float = 0.0, host_ms: float = 0.0):
        """An op of one kernel of `ms`; its first call also runs `first_call_ms` of device work (an
        autotune sweep's candidates), which no measurement may see; each call costs the host `host_ms`."""
        calls = []

        def fn():
            if not calls and first_call_ms:
                self.launch(first_call_ms, "first call")
            calls.append(1)
            self.host_s += host_ms / 1000
            self.launch(ms)

        return fn

    # --- reading the log ---------------------------------------------------------------------------
    def steps(self, *kinds: str) -> list[tuple]:
        return [step for step in self.log if step[0] in kinds]

    def launches_before_first_capture(self) -> int:
        first = next(i for i, step in enumerate(self.log) if step[0] == "capture")
        return sum(1 for step in self.log[:first] if step == ("launch", "kernel"))


class Buffer:
    """The cold-L2 flush buffer: zeroing it is one kernel of `ms` on the stand-in device."""

    def __init__(self, device: StandInCuda, ms: float):
        self.device, self.ms = device, ms

    def zero_(self):
        self.device.launch(self.ms, "flush")


def install(monkeypatch, device: StandInCuda) -> StandInCuda:
    """Put the stand-in in torch.cuda's place for the names the timers use."""
    import torch

    for name in API:
        monkeypatch.setattr(torch.cuda, name, getattr(device, name))
    return device
