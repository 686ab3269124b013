"""An operator whose candidate kills its process (as a segfault would) where ZL_TEST_CRASH is set: side B
of an A/B that sets it loses this op's timed steps, and, chunked, the measuring host they ran in."""

import os
import signal

import torch

from ops import Operator
from ops.add import triton_add


def candidate(x, y):
    if os.environ.get("ZL_TEST_CRASH"):
        os.kill(os.getpid(), signal.SIGKILL)
    return triton_add(x, y)


host_crash = Operator(
    name="host_crash",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=candidate,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
