"""A test-only operator module that misbehaves while it is imported, as ZL_TEST_IMPORT_FAULT says:
`sys_exit` (sys.exit(0)), `os_exit` (os._exit(0)), `sleep` (never finishes importing), `base`
(raises a BaseException subclass). Unset, it imports and defines `import_fault_op`."""

import os
import sys
import time

import torch

from ops import Operator
from ops.add import triton_add

FAULT = os.environ.get("ZL_TEST_IMPORT_FAULT", "")


class Abort(BaseException):
    """Not an Exception: what `except Exception` lets through."""


if FAULT == "sys_exit":
    sys.exit(0)
elif FAULT == "os_exit":
    os._exit(0)
elif FAULT == "sleep":
    time.sleep(3600)
elif FAULT == "base":
    raise Abort("refusing to import")

import_fault_op = Operator(
    name="import_fault_op",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add, candidate=triton_add, dtypes=("fp32",), shape_keys=("pointwise",))
