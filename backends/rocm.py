"""AMD ROCm (HIP). torch exposes it as the `cuda` device type."""

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
    torch_build=lambda torch: torch.version.hip is not None,
)
