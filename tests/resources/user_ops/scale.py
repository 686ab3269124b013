"""A user's operator, defined outside the repo's corpus, in the same form as the built-in ones."""

import torch
import triton
import triton.language as tl

from ops import Operator


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (32, 64)], key=["n"])
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3, mask=mask)


def triton_scale(x):
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    return out


scale3 = Operator(
    name="scale3",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),),
    baseline=lambda x: x * 3,
    candidate=triton_scale,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
