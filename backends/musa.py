"""Moore Threads MUSA (torch_musa)."""

from .base import Backend, CaptureMarkers


def identity() -> dict:
    import torch
    import torch_musa  # noqa: F401  (registers torch.musa)

    props = torch.musa.get_device_properties(0)
    return {
        "device_name": props.name,
        "arch": f"mp_{props.major}{props.minor}",
        "runtime": f"torch_musa {getattr(torch_musa, '__version__', 'unknown')}",
    }


BACKEND = Backend(
    ray_resource="GPU",  # Ray detects no MUSA device: start its nodes with --num-gpus N
    flaggems_vendor="mthreads",
    name="musa",
    aliases=("mthreads", "moore"),
    torch_device_type="musa",
    visibility_key="MUSA_VISIBLE_DEVICES",
    vendor_cli=(("mthreads-gmi", "-L"), r"^GPU \d+:"),
    torch_module="torch_musa",
    graph_capture=True,
    graph_class="MUSAGraph",
    capture_markers=CaptureMarkers(
        recoverable=(
            "operation not permitted when stream is capturing",
            "is not callable during capture",
            "during MUSA graph capture",
        ),
        fatal=(
            "an illegal memory access was encountered",
            "MUSA out of memory",
            "OutOfMemoryError",
            "device-side assert triggered",
        ),
        # The fallback after this error runs, then the process dies in teardown.
        poisoned=("MUSA error: unknown error",),
    ),
    capture_deny=frozenset({"unique2"}),
    identity=identity,
)
