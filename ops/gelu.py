"""Unary pointwise GELU (erf form, as torch's default)."""

import torch
import triton
import triton.language as tl

from ops import Operator, numel
from ops.add import POINTWISE_CONFIGS


@triton.autotune(configs=POINTWISE_CONFIGS, key=["n_elements"])
@triton.jit
def gelu_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def triton_gelu(x):
    out = torch.empty_like(x)
    n = x.numel()
    gelu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


def make_inputs(shape, dtype, device):
    return (torch.randn(*shape, dtype=dtype, device=device),)


gelu = Operator(
    name="gelu",
    inputs=make_inputs,
    baseline=torch.nn.functional.gelu,
    candidate=triton_gelu,
    shape_keys=("pointwise",),
    bytes_moved=lambda shape, elem: 2 * elem * numel(shape),
)
