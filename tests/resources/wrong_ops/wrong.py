"""A user's operator whose Triton candidate computes the wrong thing (x + x for x + y): its rows
must fail the correctness check, with no time reported."""

import torch

from ops import Operator
from ops.add import triton_add


def _adds_x_twice(x, y):
    return triton_add(x, x)


wrong_add = Operator(
    name="wrong_add",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=_adds_x_twice,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
