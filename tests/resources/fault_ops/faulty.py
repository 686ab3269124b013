"""Test-only operators for fault injection: slow enough to be interrupted between rows, and one
that fills the disk under the run dir before a row is written."""

import os
import time
from pathlib import Path

import torch

from ops import Operator
from ops.add import triton_add


def _slow_inputs(shape, dtype, device):
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


COMMON = dict(baseline=torch.add, shape_keys=("pointwise",), dtypes=("fp32",))
slow_op = Operator(name="slow_op", inputs=_slow_inputs, candidate=triton_add, **COMMON)
disk_filler_op = Operator(name="disk_filler_op", inputs=_inputs, candidate=_fill_then_add, **COMMON)
