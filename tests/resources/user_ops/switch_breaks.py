"""A user operator that compiler B breaks on one shape: with ZL_TEST_SWITCH=1 in its environment
(B's, in the A/B tests) its candidate is wrong on the 300-element input and right on the others,
as a miscompile that hits one shape would be."""

import os

import torch

from ops import Operator
from ops.add import triton_add


def candidate(x, y):
    out = triton_add(x, y)
    if os.environ.get("ZL_TEST_SWITCH") == "1" and x.numel() == 300:
        out.view(-1)[0] += 1
    return out


switch_breaks = Operator(
    name="switch_breaks",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=candidate,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
