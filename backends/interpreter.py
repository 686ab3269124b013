"""Triton's CPU interpreter with a host timer: meaningless as timing, but it runs the whole
pipeline (record, replay, results, reports) on a machine with no accelerator, which is what CI
and the end-to-end tests use."""

import os
import platform

from .base import Backend


def identity() -> dict:
    return {
        "device_name": f"cpu ({platform.processor() or platform.machine()})",
        "arch": platform.machine(),
        "runtime": "triton interpreter",
    }


BACKEND = Backend(
    name="interpreter",
    aliases=("cpu", "interpret"),
    torch_device_type="cpu",
    visibility_key=None,
    triton_driver=False,
    compiles_kernels=False,
    measures_performance=False,
    child_env={"TRITON_INTERPRET": "1"},
    default_shapes="tiny.yaml",
    runs_shipped_shapes=False,
    warmup_ms=0.0,
    rep_ms=0.0,
    identity=identity,
    virtual_devices=lambda: os.cpu_count() or 1,  # one interpreter process per core
)
