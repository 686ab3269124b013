"""An operator whose candidate changes its process and leaves it so: an environment variable, sys.path,
the working dir. In a process of its own that ends with the run; in a measuring host it must not reach
the next op's run (leak_witness)."""

import os
import sys

import torch

from ops import Operator
from ops.add import triton_add


def candidate(x, y):
    os.environ["ZL_LEAKED"] = "1"
    if "/zl-leaked" not in sys.path:
        sys.path.append("/zl-leaked")
    os.chdir("/")
    return triton_add(x, y)


leaky = Operator(
    name="leaky",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=candidate,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
