"""A copy whose side B moves a known fraction more bytes (GPU sensitivity check, not in the corpus).

`ZL_TRAFFIC_EXTRA` (a fraction, default 0) makes the candidate copy that many more elements,
rounded up to whole 4 KiB blocks so every access stays vector-aligned: only the traffic changes,
not the instructions per element. The padding is a constexpr, so the two sides' IR differs as a
compiler change's would. Both sides get the same input (sized for 3% extra) and compare only the
first n elements."""

import os

import torch
import triton
import triton.language as tl

from ops import Operator, numel

BLOCK = 4096
SLACK = 0.03


@triton.jit
def copy_kernel(x_ptr, out_ptr, n_elements, PAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements + PAD
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _pad(n: int) -> int:
    extra = float(os.environ.get("ZL_TRAFFIC_EXTRA", "0"))
    return triton.cdiv(int(n * extra), BLOCK) * BLOCK


def make_inputs(shape, dtype, device):
    n = numel(shape)
    return (torch.randn(n + triton.cdiv(int(n * SLACK), BLOCK) * BLOCK, dtype=dtype, device=device), n)


def triton_copy(x, n):
    out = torch.empty_like(x)
    pad = _pad(n)
    copy_kernel[(triton.cdiv(n + pad, BLOCK),)](x, out, n, PAD=pad, BLOCK=BLOCK)
    return out[:n]


def torch_copy(x, n):
    return x[:n].clone()


traffic = Operator(
    name="traffic",
    inputs=make_inputs,
    baseline=torch_copy,
    candidate=triton_copy,
    dtypes=("fp32",),
    shape_keys=("traffic",),
    bytes_moved=lambda shape, elem: 2 * elem * numel(shape),
)
