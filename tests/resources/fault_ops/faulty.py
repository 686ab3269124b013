"""Test-only operators for fault injection: slow enough to be interrupted between rows, one that
fills the disk under the run dir before a row is written, one that leaves a process running, one whose
process exits in its second case, and one that changes torch's process-wide state in its first."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from ops import Operator
from ops.add import triton_add


def _slow_inputs(shape, dtype, device):
    if list(shape) == [int(os.environ.get("ZL_TEST_KILL_AT", -1))]:
        os.kill(os.getpid(), signal.SIGKILL)  # killed outright inside this case, never between two
    time.sleep(0.7)  # each case takes a while: a signal lands between rows, not after the last
    return (torch.randn(*shape, dtype=dtype, device=device), torch.randn(*shape, dtype=dtype, device=device))


def _fill_then_add(x, y):
    # From the second shape on (x.numel() > 4), fill the file system of ZL_TEST_FILL_DIR first.
    if x.numel() > 4:
        filler = Path(os.environ["ZL_TEST_FILL_DIR"]) / "filler"
        try:
            with open(filler, "ab") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        except OSError:
            pass  # full: what the harness writes next meets ENOSPC
    return triton_add(x, y)


def _inputs(shape, dtype, device):
    return (torch.randn(*shape, dtype=dtype, device=device), torch.randn(*shape, dtype=dtype, device=device))


def _add_leaving_a_process(x, y):
    # Once per process: a process never ended (named by ZL_TEST_MARK, for the test to find), with
    # our stdout; in a session of its own with ZL_TEST_SETSID, out of reach of a group kill.
    if not os.environ.get("ZL_TEST_LEFT"):
        os.environ["ZL_TEST_LEFT"] = "1"
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", os.environ["ZL_TEST_MARK"]],
                         start_new_session=bool(os.environ.get("ZL_TEST_SETSID")))
    return triton_add(x, y)


COMMON = dict(baseline=torch.add, shape_keys=("pointwise",), dtypes=("fp32",))
slow_op = Operator(name="slow_op", inputs=_slow_inputs, candidate=triton_add, **COMMON)
leaving_op = Operator(name="leaving_op", inputs=_inputs, candidate=_add_leaving_a_process, **COMMON)
disk_filler_op = Operator(name="disk_filler_op", inputs=_inputs, candidate=_fill_then_add, **COMMON)


def _exit_in_second_case(x, y):
    # As an extension that calls exit() would: no outcome recorded, any exit code (ZL_TEST_EXIT_CODE).
    if x.numel() > 4:
        os._exit(int(os.environ["ZL_TEST_EXIT_CODE"]))
    return triton_add(x, y)


def _default_dtype_inputs(shape, dtype, device):
    # Drawn in torch's default dtype, then cast: a default dtype changed by an earlier case changes them.
    return (torch.randn(*shape, device=device).to(dtype), torch.randn(*shape, device=device).to(dtype))


def _leak_state_in_first_case(x, y):
    if x.numel() == 4:
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True)
    return triton_add(x, y)


exit_op = Operator(name="exit_op", inputs=_inputs, candidate=_exit_in_second_case, **COMMON)
leaky_op = Operator(name="leaky_op", inputs=_default_dtype_inputs, candidate=_leak_state_in_first_case, **COMMON)


def _stop_the_group_once_a_row_is_landing():
    """What a batch's timeout does at the worst moment: SIGTERM to the run's group as the first
    case's row lands, on the first write that shows it finished (results.json holding a row, or
    run.json naming no running case after one ran), before the next case begins."""
    from harness.core import rundir

    write = rundir.atomic_write_json
    seen = {"running": False, "sent": False}

    def write_then_stop(path, data, durable=True):
        write(path, data, durable)
        name = Path(path).name
        running = data.get("observed", {}).get("running_case") if name == rundir.RUN_JSON else None
        seen["running"] = seen["running"] or running is not None
        landed = (name == rundir.RESULTS_JSON and data.get("rows")) or (
            name == rundir.RUN_JSON and seen["running"] and running is None)
        if landed and not seen["sent"]:
            seen["sent"] = True
            os.killpg(os.getpgid(0), signal.SIGTERM)

    rundir.atomic_write_json = write_then_stop


if os.environ.get("ZL_TEST_STOP_AFTER_ROW"):
    _stop_the_group_once_a_row_is_landing()
