"""The device-monitor contract: what a vendor's management library (NVML, amdsmi) reports about
the device's state, in one vocabulary, so code above `backends/` never asks which vendor it is.

A monitor's `sample()` returns a dict with these keys (None where the device does not report one):

    sm_clock_mhz, mem_clock_mhz   current clocks
    temperature_c                 GPU temperature
    power_w, power_cap_w          power draw and the enforced power limit
    throttle_reasons              names of the reasons the clocks are held down right now
    slowdown_counters             cumulative counters of time (NVML: ns) or events (amdsmi) spent
                                  in a thermal or power slowdown, by reason name: one that grew
                                  between two samples means a slowdown hit the span between them,
                                  even if neither sample caught it in the act

`slowdowns` names the throttle reasons that are thermal or power slowdowns (as opposed to an idle
GPU or clocks set by the user), which is what makes a measurement untrustworthy. `power_caps` names
those among them that mean the board held its clocks at its power limit: a power-hungry kernel's
steady state (on an H200 every 4096^3 bf16 GEMM repeat runs capped, SM clock ~1400 of 1980 MHz),
which hits every run of it alike, unlike heat or a hardware brake.
"""

from __future__ import annotations

from typing import Protocol

# The marker a row gets when a slowdown hit its measurement, and its kinds: the power cap alone,
# or any other slowdown. The child's gpu_state plugin writes it and reports.compare reads it.
THROTTLE_MARKER = "CLOCK_THROTTLED"
POWER_CAP, SLOWDOWN = "power_cap", "slowdown"


class MonitorUnavailable(RuntimeError):
    """No monitor for this device here (library missing, driver refuses): the one-line reason."""


class MonitorError(RuntimeError):
    """The monitor failed while sampling (not a field the device lacks: a real error)."""


class Monitor(Protocol):
    source: str  # the library and its version, for run.json
    slowdowns: frozenset[str]
    power_caps: frozenset[str]  # a subset of slowdowns

    def sample(self) -> dict: ...


def sample(*, sm_clock_mhz, mem_clock_mhz, temperature_c, power_w, power_cap_w, throttle_reasons,
           slowdown_counters) -> dict:
    """One sample in the contract's vocabulary (above): every monitor builds its samples here, so
    none can leave out or misname a key."""
    return {"sm_clock_mhz": sm_clock_mhz, "mem_clock_mhz": mem_clock_mhz, "temperature_c": temperature_c,
            "power_w": power_w, "power_cap_w": power_cap_w, "throttle_reasons": throttle_reasons,
            "slowdown_counters": slowdown_counters}


def decode_bits(mask: int, names: dict[int, str]) -> list[str]:
    """Names of the set bits of `mask`, in bit order; an unknown bit keeps its hex value."""
    known = [name for bit, name in sorted(names.items()) if mask & bit]
    rest = mask & ~sum(names)
    return known + [hex(1 << i) for i in range(rest.bit_length()) if rest >> i & 1]
