"""GPU state: the device's clocks, temperature, power, power cap and throttle reasons as each case
starts and as its row is written (right after its measurement), through the backend's monitor
(backends.monitor), into `row["gpu_state"] = {"before": ..., "after": ...}`. A row whose span a
thermal or power slowdown hit carries CLOCK_THROTTLED: its numbers are the throttled GPU's. The
marker's `kind` is `power_cap` when the only slowdowns were the board's power cap (a kernel's own
steady state, which an A/B compares like for like when it hit every repeat of a side), else
`slowdown`.

Where the backend has no monitor, or its library is missing, rows carry no `gpu_state` and one
line per run says why (also in run.json `observed.gpu_state`)."""

from __future__ import annotations

from backends.monitor import POWER_CAP, SLOWDOWN, THROTTLE_MARKER, MonitorError, MonitorUnavailable
from harness.core import rundir


def slowdowns_hit(slowdowns: frozenset[str], before: dict, after: dict) -> list[str]:
    """The thermal or power slowdowns that hit the span from `before` to `after`: reasons either
    sample caught in force, and slowdown counters that grew in between (a slowdown that came and
    went inside the span). An idle GPU or user-set clocks are not slowdowns."""
    caught = {r for s in (before, after) for r in s.get("throttle_reasons") or () if r in slowdowns}
    start = before.get("slowdown_counters") or {}
    end = after.get("slowdown_counters") or {}
    grew = {name for name, n in end.items() if name in start and n > start[name]}
    return sorted(caught | grew)


def marker(hit: list[str], power_caps: frozenset[str], before: dict, after: dict) -> str:
    kind = POWER_CAP if set(hit) <= power_caps else SLOWDOWN
    return (f"{THROTTLE_MARKER} reasons={','.join(hit)} kind={kind} "
            f"sm_clock_mhz={before.get('sm_clock_mhz')}->{after.get('sm_clock_mhz')}")


class GpuStatePlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.monitor = None
        self.before: dict | None = None

    def pytest_configure(self, config):
        backend = self.ctx.backend
        if backend.monitor is None:
            return self._off(f"backend '{backend.name}' has no device monitor")
        try:
            self.monitor = backend.monitor()
        except MonitorUnavailable as exc:
            return self._off(str(exc))
        self._status({"recorded": True, "source": self.monitor.source})

    def _off(self, reason: str) -> None:
        self.monitor = None
        self.ctx.say(f"GPU state not recorded: {reason}")
        self._status({"recorded": False, "reason": reason})

    def _status(self, facts: dict) -> None:
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"gpu_state": facts}})

    def _sample(self) -> dict | None:
        try:
            return self.monitor.sample()
        except MonitorError as exc:
            # A monitor that broke mid-run leaves the rows after it without gpu_state, said once.
            self._off(f"the monitor failed during case {self.ctx.case_id}: {exc}")
            return None

    def pytest_zl_case_started(self, case_id, shape_label):
        self.before = self._sample() if self.monitor is not None else None

    def pytest_zl_row_ready(self, row):
        if self.monitor is None or self.before is None:
            return
        after = self._sample()
        if after is None:
            return
        before, self.before = self.before, None
        row["gpu_state"] = {"before": before, "after": after}
        hit = slowdowns_hit(self.monitor.slowdowns, before, after)
        if hit and row["status"] == "SUCCESS":  # a row without a measurement has nothing to distrust
            row["markers"].append(marker(hit, self.monitor.power_caps, before, after))
