"""An operator whose candidate kills its process (as a segfault would) on its second shape."""

import os
import signal

import torch

from ops import Operator
from ops.add import triton_add


def candidate(x, y):
    if x.numel() > 400:
        os.kill(os.getpid(), signal.SIGKILL)
    return triton_add(x, y)


crashy = Operator(
    name="crashy",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=candidate,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
