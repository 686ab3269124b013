"""AMD's device monitor through amdsmi (ROCm's Python bindings), where it is installed."""

from __future__ import annotations

from . import monitor
from .monitor import MonitorError, MonitorUnavailable

# amdsmi_get_violation_status: `active_<key>` says the slowdown is on now, `acc_<key>` counts it.
# All of them are thermal or power slowdowns (package power tracking, socket/VR/HBM thermal, PROCHOT).
VIOLATIONS = {"ppt_pwr": "ppt_power", "socket_thrm": "socket_thermal", "vr_thrm": "vr_thermal",
              "hbm_thrm": "hbm_thermal", "prochot_thrm": "prochot_thermal"}
UNSUPPORTED = {0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}  # what amdsmi puts in a field the device lacks


def _value(v):
    return None if v in UNSUPPORTED or v == "N/A" else v


class AmdSmiMonitor:
    slowdowns = frozenset(VIOLATIONS.values())
    power_caps = frozenset({"ppt_power"})

    def __init__(self, amdsmi, handle):
        self.amdsmi = amdsmi
        self.handle = handle
        self.source = "amdsmi"

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.amdsmi.AmdSmiLibraryException as exc:
            if exc.get_error_code() == self.amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED:
                return None
            raise MonitorError(f"amdsmi {fn.__name__}: {exc}") from exc

    def sample(self) -> dict:
        a, h = self.amdsmi, self.handle
        gfx = self._call(a.amdsmi_get_clock_info, h, a.AmdSmiClkType.GFX) or {}
        mem = self._call(a.amdsmi_get_clock_info, h, a.AmdSmiClkType.MEM) or {}
        power = self._call(a.amdsmi_get_power_info, h) or {}
        cap = self._call(a.amdsmi_get_power_cap_info, h) or {}
        cap_uw = _value(cap.get("power_cap"))
        violations = self._call(a.amdsmi_get_violation_status, h) or {}
        active = [name for key, name in VIOLATIONS.items() if _value(violations.get(f"active_{key}"))]
        counters = {name: _value(violations.get(f"acc_{key}")) for key, name in VIOLATIONS.items()}
        return monitor.sample(
            sm_clock_mhz=_value(gfx.get("clk")),
            mem_clock_mhz=_value(mem.get("clk")),
            temperature_c=_value(self._call(a.amdsmi_get_temp_metric, h, a.AmdSmiTemperatureType.HOTSPOT,
                                            a.AmdSmiTemperatureMetric.CURRENT)),
            # MI300 and later report the current socket power, earlier cards an average.
            power_w=_value(power.get("current_socket_power")) or _value(power.get("average_socket_power")),
            power_cap_w=None if cap_uw is None else cap_uw / 1e6,
            throttle_reasons=active if violations else None,
            slowdown_counters={k: v for k, v in counters.items() if v is not None} if violations else None,
        )


def open_monitor() -> AmdSmiMonitor:
    """The monitor of the child's one visible device, found by its PCI address (amdsmi numbers
    devices its own way, whatever HIP_VISIBLE_DEVICES says)."""
    try:
        import amdsmi
    except ImportError as exc:
        raise MonitorUnavailable("amdsmi is not installed (it ships with ROCm: pip install amdsmi from "
                                 "/opt/rocm/share/amd_smi)") from exc
    import torch

    props = torch.cuda.get_device_properties(0)
    bdf = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    try:
        amdsmi.amdsmi_init()
        handle = amdsmi.amdsmi_get_processor_handle_from_bdf(bdf)
    except amdsmi.AmdSmiException as exc:
        raise MonitorUnavailable(f"amdsmi cannot open the device at {bdf}: {exc}") from exc
    return AmdSmiMonitor(amdsmi, handle)
