"""Row softmax: one program per row, whole row in registers."""

import torch
import triton
import triton.language as tl

from ops import Operator, numel


@triton.autotune(
    configs=[triton.Config({}, num_warps=w, num_stages=s) for w in (1, 2, 4, 8, 16) for s in (1, 2)],
    key=["N"],
)
@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    x = tl.load(in_ptr + row * stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def triton_softmax(x):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(x2)
    M, N = x2.shape
    softmax_kernel[(M,)](out, x2, x2.stride(0), N, BLOCK_N=triton.next_power_of_2(N))
    return out.view_as(x)


def make_inputs(shape, dtype, device):
    return (torch.randn(*shape, dtype=dtype, device=device),)


softmax = Operator(
    name="softmax",
    inputs=make_inputs,
    baseline=lambda x: torch.softmax(x, dim=-1),
    candidate=triton_softmax,
    shape_keys=("norm",),
    bytes_moved=lambda shape, elem: 2 * elem * numel(shape),
)
