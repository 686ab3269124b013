"""Binary pointwise add over the flattened tensor."""

import torch
import triton
import triton.language as tl

from ops import Operator, numel

POINTWISE_CONFIGS = [
    triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024, 4096) for w in (2, 4, 8)
]


@triton.autotune(configs=POINTWISE_CONFIGS, key=["n_elements"])
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def triton_add(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out


def make_inputs(shape, dtype, device):
    return (
        torch.randn(*shape, dtype=dtype, device=device),
        torch.randn(*shape, dtype=dtype, device=device),
    )


add = Operator(
    name="add",
    inputs=make_inputs,
    baseline=torch.add,
    candidate=triton_add,
    shape_keys=("pointwise",),
    bytes_moved=lambda shape, elem: 3 * elem * numel(shape),
    flops=numel,
)
