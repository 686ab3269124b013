"""Test-only operators for batch: each misbehaves in one way a real operator can."""

import os
import time
from pathlib import Path

import torch

from ops import Operator
from ops.add import triton_add


def _inputs(shape, dtype, device):
    return (torch.randn(*shape, dtype=dtype, device=device), torch.randn(*shape, dtype=dtype, device=device))


def _crash(x, y):
    os._exit(3)  # dies like a segfaulting extension: no Python cleanup, same exit code every time


def _hang(x, y):
    time.sleep(3600)


def _hang_in_2d_case(x, y):
    # Hangs in its second case only (the interpreter's pointwise shapes are [300], then [2, 700]),
    # so a timeout has a case to name that is not simply the first.
    if x.dim() == 2:
        time.sleep(3600)
    return triton_add(x, y)


def _flaky(x, y):
    # Fails in the first process that runs it, passes afterwards (state kept by the test).
    marker = Path(os.environ["ZL_TEST_STATE_DIR"]) / "flaky_ran_once"
    if not marker.exists():
        marker.write_text("1")
        raise RuntimeError("transient failure")
    return triton_add(x, y)


# Spelled out as Operator(name=...) calls: the inventory scan reads them statically.
COMMON = dict(inputs=_inputs, baseline=torch.add, shape_keys=("pointwise",), dtypes=("fp32",))
crash_op = Operator(name="crash_op", candidate=_crash, **COMMON)
hang_op = Operator(name="hang_op", candidate=_hang, **COMMON)
hang_later_op = Operator(name="hang_later_op", candidate=_hang_in_2d_case, **COMMON)
flaky_op = Operator(name="flaky_op", candidate=_flaky, **COMMON)
fp32_op = Operator(name="fp32_op", candidate=triton_add, **COMMON)
skip_op = Operator(name="skip_op", candidate=triton_add, skip="not meaningful on this backend", **COMMON)


def _crash_differently(x, y):
    # Each process exits with another code (state kept by the test): never "the same code twice".
    counter = Path(os.environ["ZL_TEST_STATE_DIR"]) / "varying_crash_runs"
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    os._exit(10 + n)


varying_crash_op = Operator(name="varying_crash_op", candidate=_crash_differently, **COMMON)


_slept = []


def _slow(x, y):
    # Its first call says it started (its pid, in the state dir the test gives), then takes a while:
    # long enough for a test to stop the node it runs on. With ZL_TEST_SLOW_FIRST_ONLY set, only the
    # first process of the test waits: a test that stops that one need not wait out every later step.
    if not _slept:
        _slept.append(1)
        state = Path(os.environ["ZL_TEST_STATE_DIR"])
        first = not any(state.glob("slow_started_*"))
        (state / f"slow_started_{os.getpid()}").write_text("1")
        if first or not os.environ.get("ZL_TEST_SLOW_FIRST_ONLY"):
            time.sleep(float(os.environ.get("ZL_TEST_SLOW_S", "20")))
    return triton_add(x, y)


slow_op = Operator(name="slow_op", candidate=_slow, **COMMON)
slower_op = Operator(name="slower_op", candidate=_slow, **COMMON)
