"""A user operator that reports the compiler switch its run saw: each case it builds writes
ZL_TEST_SWITCH (or `unset`) into switch_seen.txt in its run dir, so an A/B test can prove that
side B ran with B's environment and side A without it."""

import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from ops import Operator

SWITCH = "ZL_TEST_SWITCH"
SEEN_FILE = "switch_seen.txt"


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def probe_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def triton_probe(x):
    out = torch.empty_like(x)
    n = x.numel()
    probe_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    return out


def inputs(shape, dtype, device):
    # The measuring child is `python -m harness.child RUN_DIR` (docs/layout.md): its run dir is
    # its one argument. Cases are built there only, never in the parent that resolves the spec.
    run_dir = Path(sys.argv[1])
    with open(run_dir / SEEN_FILE, "a") as f:
        f.write(f"{os.environ.get(SWITCH, 'unset')}\n")
    return (torch.randn(*shape, dtype=dtype, device=device),)


switch_probe = Operator(
    name="switch_probe",
    inputs=inputs,
    baseline=lambda x: x + 1,
    candidate=triton_probe,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
