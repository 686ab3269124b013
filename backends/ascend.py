"""Huawei Ascend NPU (torch_npu)."""

from .base import Backend, CaptureMarkers


def identity() -> dict:
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    return {
        "device_name": torch.npu.get_device_name(0),
        "arch": torch.npu.get_device_name(0),
        "runtime": f"torch_npu {getattr(torch_npu, '__version__', 'unknown')}",
    }


BACKEND = Backend(
    ray_resource="NPU",
    flaggems_vendor="ascend",
    name="ascend",
    aliases=("npu", "huawei"),
    torch_device_type="npu",
    visibility_key="ASCEND_RT_VISIBLE_DEVICES",
    vendor_cli=(("npu-smi", "info", "-l"), r"^\s*NPU ID\s*:"),
    torch_module="torch_npu",
    # Graph capture on NPU goes through torch_npu's own API, not torch.cuda.graph: time directly.
    graph_capture=False,
    capture_markers=CaptureMarkers(
        fatal=("out of memory", "OutOfMemoryError", "device-side assert triggered"),
    ),
    identity=identity,
)
