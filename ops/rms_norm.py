"""RMSNorm over the last dim, with a weight: one program per row."""

import torch
import triton
import triton.language as tl

from ops import Operator, numel

EPS = 1e-6


@triton.autotune(
    configs=[triton.Config({}, num_warps=w, num_stages=s) for w in (1, 2, 4, 8, 16) for s in (1, 2)],
    key=["N"],
)
@triton.jit
def rms_norm_kernel(out_ptr, in_ptr, w_ptr, stride, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    x = tl.load(in_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(out_ptr + row * stride + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def triton_rms_norm(x, weight):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(x2)
    M, N = x2.shape
    rms_norm_kernel[(M,)](out, x2, weight, x2.stride(0), N, EPS, BLOCK_N=triton.next_power_of_2(N))
    return out.view_as(x)


def torch_rms_norm(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)


def make_inputs(shape, dtype, device):
    x = torch.randn(*shape, dtype=dtype, device=device)
    weight = torch.randn(shape[-1], dtype=dtype, device=device)
    return (x, weight)


def _bytes(shape, elem):
    return elem * (2 * numel(shape) + shape[-1])


rms_norm = Operator(
    name="rms_norm",
    inputs=make_inputs,
    baseline=torch_rms_norm,
    candidate=triton_rms_norm,
    shape_keys=("norm",),
    bytes_moved=_bytes,
)
