"""GPU state per row (harness.child.plugins.gpu_state over backends.monitor): NVML's answers decoded
from a fake pynvml at the device boundary, the CLOCK_THROTTLED rule, and the plugin in a real child
whose backend is given a fake monitor."""

import os
import subprocess
import sys
import types

import pytest
from conftest import REPO, load, run_dir_of

import backends
from backends import monitor_amdsmi, monitor_nvml
from backends.monitor import MonitorError, MonitorUnavailable, decode_bits
from harness.child.plugins import gpu_state
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.providers import shapes

SLOWDOWN_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown"}
BENIGN_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x10: "sync_boost", 0x100: "display_clock_setting"}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(reasons=0x1, counters=None, fail=None):
    """A pynvml module as far as the monitor uses it, answering for one H200-like device. `fail`:
    {function name: NVML error code} raised by that call."""
    counters = {74: 1000, 269: 0, 270: 0, 271: 0} if counters is None else counters
    fail = fail or {}

    def field(field_id):
        ok = field_id in counters
        return types.SimpleNamespace(fieldId=field_id, nvmlReturn=0 if ok else 3,
                                     value=types.SimpleNamespace(ullVal=counters.get(field_id, 0)))

    answers = {
        "nvmlSystemGetDriverVersion": lambda: "570.86",
        "nvmlDeviceGetClockInfo": lambda h, kind: {1: 1980, 2: 3201}[kind],
        "nvmlDeviceGetTemperature": lambda h, sensor: 41,
        "nvmlDeviceGetPowerUsage": lambda h: 123456,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700000,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: reasons,
        "nvmlDeviceGetFieldValues": lambda h, ids: [field(i) for i in ids],
    }
    module = types.SimpleNamespace(NVMLError=NVMLError, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0)
    for name, answer in answers.items():
        def call(*args, _name=name, _answer=answer):
            if _name in fail:
                raise NVMLError(fail[_name])
            return _answer(*args)

        call.__name__ = name
        setattr(module, name, call)
    return module


def test_nvml_sample_in_units_and_names():
    sample = monitor_nvml.NvmlMonitor(fake_nvml(reasons=0x1 | 0x4, counters={74: 5, 270: 7}), "h").sample()
    assert sample == {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 41, "power_w": 123.456,
                      "power_cap_w": 700.0, "throttle_reasons": ["gpu_idle", "sw_power_cap"],
                      "slowdown_counters": {"sw_power_cap": 5, "hw_thermal_slowdown": 7}}


@pytest.mark.parametrize("bit,name", sorted({**SLOWDOWN_BITS, **BENIGN_BITS}.items()))
def test_each_nvml_reason_bit_decodes_to_its_name(bit, name):
    assert monitor_nvml.NvmlMonitor(fake_nvml(reasons=bit), "h").sample()["throttle_reasons"] == [name]


def test_unknown_reason_bits_are_kept_not_dropped():
    assert decode_bits(0x4 | 0x800, monitor_nvml.REASONS) == ["sw_power_cap", "0x800"]


@pytest.mark.parametrize("code", [3, 13])  # not supported; function not found (an older driver)
def test_a_field_the_device_does_not_report_is_none_and_the_rest_still_count(code):
    sample = monitor_nvml.NvmlMonitor(fake_nvml(fail={"nvmlDeviceGetPowerUsage": code}), "h").sample()
    assert sample["power_w"] is None and sample["sm_clock_mhz"] == 1980


def test_a_real_nvml_error_is_a_monitor_error():
    monitor = monitor_nvml.NvmlMonitor(fake_nvml(fail={"nvmlDeviceGetClockInfo": 15}), "h")  # GPU is lost
    with pytest.raises(MonitorError, match="^NVML nvmlDeviceGetClockInfo: NVML error 15$"):
        monitor.sample()


def test_without_pynvml_the_monitor_is_unavailable_and_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(MonitorUnavailable, match=r"^pynvml is not installed \(pip install nvidia-ml-py\)$"):
        monitor_nvml.open_monitor()


def test_amdsmi_violations_decode_to_names_and_counters():
    class AmdSmiLibraryException(Exception):
        def get_error_code(self):
            return 2

    big = 0xFFFFFFFFFFFFFFFF  # what amdsmi reports for a counter the device lacks
    amdsmi = types.SimpleNamespace(
        AmdSmiLibraryException=AmdSmiLibraryException,
        amdsmi_wrapper=types.SimpleNamespace(AMDSMI_STATUS_NOT_SUPPORTED=2),
        AmdSmiClkType=types.SimpleNamespace(GFX="gfx", MEM="mem"),
        AmdSmiTemperatureType=types.SimpleNamespace(HOTSPOT="hot"),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT=0),
        amdsmi_get_clock_info=lambda h, kind: {"clk": {"gfx": 2100, "mem": 1300}[kind]},
        amdsmi_get_power_info=lambda h: {"current_socket_power": 650, "average_socket_power": 0xFFFFFFFF},
        amdsmi_get_power_cap_info=lambda h: {"power_cap": 750_000_000},
        amdsmi_get_temp_metric=lambda h, kind, metric: 70,
        amdsmi_get_violation_status=lambda h: {"active_ppt_pwr": 1, "active_socket_thrm": 0, "acc_ppt_pwr": 9,
                                               "acc_socket_thrm": 0, "acc_hbm_thrm": big})
    sample = monitor_amdsmi.AmdSmiMonitor(amdsmi, "h").sample()
    assert sample["sm_clock_mhz"] == 2100 and sample["mem_clock_mhz"] == 1300 and sample["temperature_c"] == 70
    assert sample["power_w"] == 650 and sample["power_cap_w"] == 750.0
    assert sample["throttle_reasons"] == ["ppt_power"]
    assert sample["slowdown_counters"] == {"ppt_power": 9, "socket_thermal": 0}
    assert "ppt_power" in monitor_amdsmi.AmdSmiMonitor.slowdowns


# --- the CLOCK_THROTTLED rule -------------------------------------------------------------------

def state(reasons=(), counters=None, clock=1980):
    return {"sm_clock_mhz": clock, "throttle_reasons": list(reasons),
            "slowdown_counters": {"sw_power_cap": 0, "hw_thermal_slowdown": 0} if counters is None else counters}


@pytest.mark.parametrize("name", sorted(SLOWDOWN_BITS.values()))
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_slowdown_caught_before_or_after_hits_the_row(name, when):
    samples = {"before": state(), "after": state(), when: state(["gpu_idle", name])}
    assert gpu_state.slowdowns_hit(monitor_nvml.SLOWDOWNS, samples["before"], samples["after"]) == [name]


@pytest.mark.parametrize("name", sorted(BENIGN_BITS.values()))
def test_an_idle_gpu_or_set_clocks_do_not_hit_the_row(name):
    assert gpu_state.slowdowns_hit(monitor_nvml.SLOWDOWNS, state([name]), state([name])) == []


def test_a_slowdown_that_came_and_went_between_the_samples_hits_the_row():
    before = state(counters={"sw_power_cap": 100, "hw_thermal_slowdown": 5})
    after = state(counters={"sw_power_cap": 100, "hw_thermal_slowdown": 6})
    assert gpu_state.slowdowns_hit(monitor_nvml.SLOWDOWNS, before, after) == ["hw_thermal_slowdown"]
    assert gpu_state.slowdowns_hit(monitor_nvml.SLOWDOWNS, before, before) == []


def test_a_counter_missing_from_either_sample_proves_nothing():
    grown = state(counters={"sw_power_cap": 9})
    assert gpu_state.slowdowns_hit(monitor_nvml.SLOWDOWNS, state(counters={}), grown) == []
    assert gpu_state.slowdowns_hit(monitor_nvml.SLOWDOWNS, {}, {}) == []


# --- the plugin ---------------------------------------------------------------------------------

class FakeMonitor:
    """Stands in for a vendor monitor: hands out the given samples in order; MonitorError for an
    exception among them."""
    source = "fake"
    slowdowns = monitor_nvml.SLOWDOWNS
    power_caps = monitor_nvml.NvmlMonitor.power_caps

    def __init__(self, samples):
        self.samples = list(samples)

    def sample(self):
        s = self.samples.pop(0)
        if isinstance(s, Exception):
            raise s
        return s


def plugin_with(tmp_path, monitor):
    said = []
    backend = types.SimpleNamespace(name="cuda", monitor=(lambda: monitor) if monitor is not None else None)
    ctx = types.SimpleNamespace(backend=backend, run_dir=tmp_path, say=said.append, case_id="fp32-4")
    plugin = gpu_state.GpuStatePlugin(ctx)
    plugin.pytest_configure(None)
    return plugin, said


def case(plugin, status="SUCCESS"):
    row = {"status": status, "markers": []}
    plugin.pytest_zl_case_started(case_id="fp32-4", shape_label="4")
    plugin.pytest_zl_row_ready(row=row)
    return row


def test_each_row_gets_its_state_before_and_after_and_a_throttled_one_its_marker(tmp_path):
    quiet, capped = state(["gpu_idle"]), state(["sw_power_cap"], clock=1755)
    hot = state(["sw_power_cap", "hw_thermal_slowdown"], clock=1500)
    plugin, said = plugin_with(tmp_path, FakeMonitor([quiet, quiet, quiet, capped, quiet, hot, quiet, hot]))
    clean, throttled, heated, failed = case(plugin), case(plugin), case(plugin), case(plugin, status="FAILED")
    assert clean == {"status": "SUCCESS", "markers": [], "gpu_state": {"before": quiet, "after": quiet}}
    assert throttled["gpu_state"] == {"before": quiet, "after": capped}
    # The power cap alone is its own kind: an A/B compares it like for like when it hits every repeat.
    assert throttled["markers"] == ["CLOCK_THROTTLED reasons=sw_power_cap kind=power_cap sm_clock_mhz=1980->1755"]
    assert heated["markers"] == [
        "CLOCK_THROTTLED reasons=hw_thermal_slowdown,sw_power_cap kind=slowdown sm_clock_mhz=1980->1500"]
    assert failed["markers"] == [] and failed["gpu_state"]["after"] == hot  # no measurement to distrust
    assert said == []
    assert load(tmp_path / rundir.RUN_JSON)["observed"]["gpu_state"] == {"recorded": True, "source": "fake"}


@pytest.mark.parametrize("monitor,reason", [
    (None, "backend 'cuda' has no device monitor"),
    (MonitorUnavailable("pynvml is not installed (pip install nvidia-ml-py)"),
     "pynvml is not installed (pip install nvidia-ml-py)"),
])
def test_without_a_monitor_rows_have_no_state_and_one_line_says_why(tmp_path, monitor, reason):
    said = []
    def unavailable():
        raise monitor

    backend = types.SimpleNamespace(name="cuda", monitor=unavailable if monitor is not None else None)
    ctx = types.SimpleNamespace(backend=backend, run_dir=tmp_path, say=said.append, case_id="")
    plugin = gpu_state.GpuStatePlugin(ctx)
    plugin.pytest_configure(None)
    rows = [case(plugin), case(plugin)]
    assert all("gpu_state" not in r for r in rows)
    assert said == [f"GPU state not recorded: {reason}"]
    assert load(tmp_path / rundir.RUN_JSON)["observed"]["gpu_state"] == {"recorded": False, "reason": reason}


def test_a_monitor_that_breaks_mid_run_is_said_once_and_the_run_goes_on(tmp_path):
    quiet = state()
    plugin, said = plugin_with(tmp_path, FakeMonitor([quiet, quiet, quiet, MonitorError("NVML x: GPU is lost")]))
    rows = [case(plugin), case(plugin), case(plugin)]
    assert ["gpu_state" in r for r in rows] == [True, False, False]
    assert said == ["GPU state not recorded: the monitor failed during case fp32-4: NVML x: GPU is lost"]


# A child whose interpreter backend has a monitor: the plugin is wired in and its hook reached for real.
CHILD = """
import dataclasses, sys
import backends.interpreter as interp
from harness.child import runner

class Hot:
    source = "fake"
    slowdowns = frozenset({"hw_thermal_slowdown"})
    power_caps = frozenset()
    n = 0
    def sample(self):
        Hot.n += 1
        return {"sm_clock_mhz": 1000 + Hot.n, "throttle_reasons": ["hw_thermal_slowdown"] if Hot.n == 4 else []}

interp.BACKEND = dataclasses.replace(interp.BACKEND, monitor=Hot)
sys.exit(runner.main(sys.argv[1:]))
"""


@pytest.mark.e2e
def test_a_child_records_gpu_state_on_every_row_and_marks_the_throttled_one(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec_mod.write(run_dir, spec_mod.RunSpec(op="add", backend="interpreter", mode="record", device=0,
                                             dtypes=["fp32"], shapes_source="x", timer="host", warmup_ms=0.0,
                                             rep_ms=0.0, ir=False))
    shapes.write_used(run_dir / rundir.SHAPES_YAML, "add", [[8], [16]], ["fp32"], "x")
    env = backends.get("interpreter").visibility_env(0, os.environ)
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
               TRITON_CACHE_DIR=str(tmp_path / "triton_cache"))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(run_dir)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = load(run_dir / rundir.RESULTS_JSON)["rows"]
    assert [(r["gpu_state"]["before"]["sm_clock_mhz"], r["gpu_state"]["after"]["sm_clock_mhz"]) for r in rows] == [
        (1001, 1002), (1003, 1004)]
    marker = "CLOCK_THROTTLED reasons=hw_thermal_slowdown kind=slowdown sm_clock_mhz=1003->1004"
    assert [r["markers"] for r in rows] == [[], [marker]]
    assert f"    {marker}" in proc.stdout  # under the row's own line
    assert "GPU state not recorded" not in proc.stdout


@pytest.mark.e2e
def test_an_interpreter_run_says_once_that_it_records_no_gpu_state(harness, tmp_path):
    proc = harness("record", "add", "--backend", "interpreter", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "GPU state" in ln]
    assert lines == ["GPU state not recorded: backend 'interpreter' has no device monitor"]
    d = run_dir_of(proc)
    assert all("gpu_state" not in r for r in load(d / rundir.RESULTS_JSON)["rows"])
    assert load(d / rundir.RUN_JSON)["observed"]["gpu_state"]["recorded"] is False


def test_the_interpreter_has_no_monitor_and_gpu_backends_do():
    assert backends.get("interpreter").monitor is None
    assert backends.get("cuda").monitor is monitor_nvml.open_monitor
    assert backends.get("rocm").monitor is monitor_amdsmi.open_monitor
