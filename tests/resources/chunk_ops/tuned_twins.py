"""Two operators that launch one autotuned kernel (one Autotuner object, as FlagGems' in-place and
out-of-place variants share theirs): in a measuring host the second op's replay meets the tuner the first
op's run left behind, and must still inject its own record's configs, not the first run's."""

import torch
import triton
import triton.language as tl

from ops import Operator


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def shared_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def twice(x):
    out = torch.empty_like(x)
    n = x.numel()
    shared_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    return out


def _inputs(shape, dtype, device):
    return (torch.randn(*shape, dtype=dtype, device=device),)


COMMON = dict(inputs=_inputs, baseline=lambda x: x * 2, candidate=twice, shape_keys=("pointwise",), dtypes=("fp32",))
twin_a = Operator(name="twin_a", **COMMON)
twin_b = Operator(name="twin_b", **COMMON)
