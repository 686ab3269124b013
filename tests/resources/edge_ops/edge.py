"""Operators at the edges of the correctness check and the interpreter's sweep: NaN that the
candidate propagates as the baseline does, NaN of the candidate's own, and an autotuned kernel
whose static_assert refuses some configs for some shapes."""

import torch
import triton
import triton.language as tl

from ops import Operator
from ops.add import triton_add


def _with_nan(shape, dtype, device):
    x, y = (torch.randn(*shape, dtype=dtype, device=device) for _ in range(2))
    x.view(-1)[::7] = float("nan")
    return x, y


def _nan_of_its_own(x, y):
    out = triton_add(x, y)
    out.view(-1)[1] = float("nan")
    return out


COMMON = dict(baseline=torch.add, dtypes=("fp32",), shape_keys=("pointwise",))
nan_through = Operator(name="nan_through", inputs=_with_nan, candidate=triton_add, **COMMON)
nan_own = Operator(name="nan_own", inputs=lambda shape, dtype, device: _with_nan(shape, dtype, device)[1:] * 2,
                   candidate=_nan_of_its_own, **COMMON)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (256, 512, 1024, 2048)], key=["n"])
@triton.jit
def _one_block_copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK >= 512, "a block this small is refused")
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _copy(x):
    out = torch.empty_like(x)
    _one_block_copy[(1,)](x, out, x.numel())
    return out


static_some = Operator(name="static_some", inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype,
                                                                                            device=device),),
                       baseline=torch.clone, candidate=_copy, dtypes=("fp32",), shape_keys=("pointwise",))

# inputs() returning a bare tensor, not a tuple: unpacked, it would be two tensors of the shape.
bare_inputs = Operator(name="bare_inputs", inputs=lambda shape, dtype, device: torch.randn(2, *shape, dtype=dtype,
                                                                                           device=device),
                       candidate=triton_add, **COMMON)


def _raises(what):
    def side(*args):
        raise RuntimeError(f"{what} not implemented")

    return side


# A failed row says whether the torch baseline or the Triton candidate raised.
baseline_raises = Operator(name="baseline_raises", inputs=_with_nan, candidate=triton_add,
                           **{**COMMON, "baseline": _raises("torch reference")})
candidate_raises = Operator(name="candidate_raises", inputs=_with_nan, candidate=_raises("kernel"), **COMMON)
