"""Triton's CPU interpreter with a host timer: meaningless as timing, but it runs the whole
pipeline (record, replay, results, reports) on a machine with no accelerator, which is what CI
and the end-to-end tests use."""

import contextlib
import os
import platform

from .base import Backend


def identity() -> dict:
    return {
        "device_name": f"cpu ({platform.processor() or platform.machine()})",
        "arch": platform.machine(),
        "runtime": "triton interpreter",
    }


def dtype_problem(dtype: str) -> str | None:
    """Why the interpreter miscomputes `dtype`, or None. Triton's interpreter (3.9 at least) runs bf16
    through NumPy, which has no bf16: a kernel that loads, doubles and stores bf16 values returns other
    numbers (NaN in the softmax of the operator example in docs/user-guide.md). Probed, not assumed from a version, so a
    fixed interpreter is trusted again."""
    if dtype != "bf16":
        return None
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def double(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets) * 2)

    x = torch.tensor([1.0, -1.5, 0.25, 3.0, -2.0, 0.5, 4.0, -0.75], dtype=torch.bfloat16)
    y = torch.zeros_like(x)
    double[(1,)](x, y, BLOCK=x.numel())
    if torch.equal(y, x * 2):
        return None
    return (f"Triton {triton.__version__}'s interpreter computes bf16 wrongly (a kernel doubling "
            f"{x.tolist()} returned {y.tolist()})")


BACKEND = Backend(
    name="interpreter",
    aliases=("cpu", "interpret"),
    torch_device_type="cpu",
    visibility_key=None,
    triton_driver=False,
    compiles_kernels=False,
    measures_performance=False,
    child_env={"TRITON_INTERPRET": "1"},
    dtype_problem=dtype_problem,
    default_shapes="tiny.yaml",
    runs_shipped_shapes=False,
    warmup_ms=0.0,
    rep_ms=0.0,
    max_noise=0.0,
    identity=identity,
    virtual_devices=lambda: os.cpu_count() or 1,  # one interpreter process per core
    # No device to ask: a package imports in a warm worker as it is.
    device_facts=dict,
    facts_standing_in=contextlib.nullcontext,
)
