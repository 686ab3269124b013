"""An operator whose autotune winner for a key depends on a dimension outside the key (rows `m`;
the key is `n`), as when a kernel's key is too coarse: two sweep shards given shapes [2, n] and
[8, n] sweep the same key and pick different configs, deterministically (each shard's pruning
leaves one config), so a parallel sweep has exactly one conflict to count."""

import torch
import triton
import triton.language as tl

from ops import Operator

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=1)]


def _by_rows(configs, named_args, **kwargs):
    return [configs[0] if named_args["m"] < 4 else configs[1]]


@triton.autotune(configs=CONFIGS, key=["n"], prune_configs_by={"early_config_prune": _by_rows})
@triton.jit
def double_kernel(x_ptr, out_ptr, m, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < m * n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def triton_double(x):
    out = torch.empty_like(x)
    m, n = x.shape
    double_kernel[lambda meta: (triton.cdiv(m * n, meta["BLOCK"]),)](x, out, m, n)
    return out


split_key = Operator(
    name="split_key",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),),
    baseline=lambda x: x * 2,
    candidate=triton_double,
    dtypes=("fp32",),
    dims=("M", "N"),
)
