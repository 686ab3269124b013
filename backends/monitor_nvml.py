"""NVIDIA's device monitor through NVML (the `pynvml` module of the nvidia-ml-py package)."""

from __future__ import annotations

from . import monitor
from .monitor import MonitorError, MonitorUnavailable, decode_bits

# nvmlClocksEventReason* bits (nvml.h).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# hw_slowdown is the umbrella bit the hardware sets with hw thermal or power brake (and for an
# external power brake or a power-supply overload, which have no bit of their own).
SLOWDOWNS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                       "hw_power_brake_slowdown"})
# NVML_FI_DEV_CLOCKS_EVENT_REASON_*: nanoseconds spent in each slowdown since the driver loaded.
COUNTER_FIELDS = {74: "sw_power_cap", 269: "sw_thermal_slowdown", 270: "hw_thermal_slowdown",
                  271: "hw_power_brake_slowdown"}
NVML_SUCCESS = 0
# What the device or driver simply does not report: that field is None, the rest still count.
NOT_REPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND


class NvmlMonitor:
    slowdowns = SLOWDOWNS
    power_caps = frozenset({"sw_power_cap"})

    def __init__(self, nvml, handle):
        """`nvml`: the pynvml module (a fake in tests), `handle`: the device's NVML handle."""
        self.nvml = nvml
        self.handle = handle
        self.source = f"nvml (driver {self._call(nvml.nvmlSystemGetDriverVersion)})"

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if exc.value in NOT_REPORTED:
                return None
            raise MonitorError(f"NVML {fn.__name__}: {exc}") from exc

    def sample(self) -> dict:
        n, h = self.nvml, self.handle
        power_mw = self._call(n.nvmlDeviceGetPowerUsage, h)
        cap_mw = self._call(n.nvmlDeviceGetEnforcedPowerLimit, h)
        reasons = self._call(n.nvmlDeviceGetCurrentClocksEventReasons, h)
        return monitor.sample(
            sm_clock_mhz=self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            mem_clock_mhz=self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            temperature_c=self._call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000,
            power_cap_w=None if cap_mw is None else cap_mw / 1000,
            throttle_reasons=None if reasons is None else decode_bits(reasons, REASONS),
            slowdown_counters=self._counters(),
        )

    def _counters(self) -> dict | None:
        values = self._call(self.nvml.nvmlDeviceGetFieldValues, self.handle, list(COUNTER_FIELDS))
        if values is None:
            return None
        return {COUNTER_FIELDS[v.fieldId]: int(v.value.ullVal) for v in values if v.nvmlReturn == NVML_SUCCESS}


def open_monitor() -> NvmlMonitor:
    """The monitor of the child's one visible device. NVML ignores CUDA_VISIBLE_DEVICES and numbers
    devices its own way, so the device is found by the UUID torch gives for its device 0."""
    try:
        import pynvml
    except ImportError as exc:
        raise MonitorUnavailable("pynvml is not installed (pip install nvidia-ml-py)") from exc
    import torch

    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as exc:
        raise MonitorUnavailable(f"NVML cannot open {uuid}: {exc}") from exc
    try:
        return NvmlMonitor(pynvml, handle)
    except MonitorError as exc:
        raise MonitorUnavailable(str(exc)) from exc
