"""An autotuned kernel of two configs, launched through a stand-in driver (tests/standin_triton.py):
`launch_all()` is what the compiling process runs, and the test process runs it again from the cache."""

import torch
import triton
import triton.language as tl

from harness.measure import tuning

N = 1024
# The second config's options are not the defaults: a compile that dropped them would build another kernel.
CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 128}, num_warps=8, num_stages=2)]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


vars(double_kernel)["do_bench"] = tuning.host_bench


def arguments(n=N):
    x = torch.ones(n)
    return x, torch.empty_like(x), n


def launch(n=N):
    double_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](*arguments(n))


def launch_all():
    launch()
