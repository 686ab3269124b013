"""A user operator that compiler B breaks on one shape: with ZL_TEST_SWITCH=1 in its environment
(B's, in the A/B tests) its candidate is wrong on the 300-element input and right on the others,
as a miscompile that hits one shape would be."""

import os

import torch
import triton
import triton.language as tl

from ops import Operator


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def triton_add_one(x):
    out = torch.empty_like(x)
    n = x.numel()
    add_one_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    if os.environ.get("ZL_TEST_SWITCH") == "1" and n == 300:
        out[0] += 1
    return out


switch_breaks = Operator(
    name="switch_breaks",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),),
    baseline=lambda x: x + 1,
    candidate=triton_add_one,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
