"""AMD ROCm (HIP). torch exposes it as the `cuda` device type."""

from . import monitor_amdsmi
from .base import Backend, CaptureMarkers


def identity() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "device_name": props.name,
        "arch": getattr(props, "gcnArchName", "unknown").split(":")[0],
        "runtime": f"hip {torch.version.hip}",
    }


BACKEND = Backend(
    ray_resource="GPU",
    flaggems_vendor="amd",
    name="rocm",
    aliases=("amd", "hip"),
    torch_device_type="cuda",
    visibility_key="HIP_VISIBLE_DEVICES",
    vendor_cli=(("rocm-smi", "--showid"), r"^GPU\[\d+\]\s*: Device ID"),
    graph_capture=True,
    capture_markers=CaptureMarkers(
        recoverable=(
            "operation not permitted when stream is capturing",
            "hipErrorStreamCaptureUnsupported",
            "hipErrorStreamCaptureInvalidated",
            "hipErrorStreamCaptureImplicit",
            "during CUDA graph capture",
        ),
        fatal=(
            "an illegal memory access was encountered",
            "HIP out of memory",
            "OutOfMemoryError",
            "device-side assert triggered",
            "Memory access fault",
        ),
        poisoned=("HIP error: unknown error",),
    ),
    identity=identity,
    monitor=monitor_amdsmi.open_monitor,
    torch_build=lambda torch: torch.version.hip is not None,
    # ROCm builds of torch record HIP kernels under the CUDA activity (Kineto over roctracer). No
    # l2_cache_bytes: torch reports the L2 only, and a buffer of that size would leave MI300's
    # Infinity Cache (hundreds of MB, not reported) warm, so cold would not be cold.
    profiler_activity="CUDA",
)
