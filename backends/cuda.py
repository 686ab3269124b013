"""NVIDIA CUDA."""

import contextlib
import types

from . import monitor_nvml
from .base import Backend, CaptureMarkers, DeviceTouched


def identity() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "device_name": props.name,
        "arch": f"sm_{props.major}{props.minor}",
        "runtime": f"cuda {torch.version.cuda}",
    }


def l2_cache_bytes() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).L2_cache_size)


def warm_fork() -> None:
    """A warm worker's once for all its steps (Backend.warm_fork): torch's registration of its Triton
    sparse ops, queued for the device's lazy init (0.25 s of a forked replay's child on an H200 host,
    under cProfile; the queued call then finds them registered), and Triton's `ldconfig -p` for
    libcuda (lru-cached). Neither touches the device."""
    import subprocess

    import torch

    register = getattr(torch.cuda, "_register_triton_kernels", None)  # private: another torch may lack it
    if register is not None:
        register()
    try:
        from triton.backends.nvidia.driver import libcuda_dirs
        libcuda_dirs()
    except (ImportError, AssertionError, OSError, subprocess.SubprocessError):  # another Triton, no libcuda:
        pass  # the step meets it again and says so itself


def device_facts() -> dict:
    """What a package may ask of torch.cuda while it is imported (FlagGems: the arch for its config
    tables, shared memory per block for its kernels' configs, Hopper or not), read from the one device
    this process sees (Backend.device_facts)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    fields = {name: getattr(props, name) for name in dir(props) if not name.startswith("_")}
    return {"count": torch.cuda.device_count(), "current_device": torch.cuda.current_device(),
            "name": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "properties": {name: value if isinstance(value, (bool, int, float, str)) else str(value)
                           for name, value in fields.items() if not callable(value)}}


# Every torch.cuda call that initializes the device goes through _lazy_init; these answer without it.
_STOOD_IN = ("device_count", "current_device", "get_device_name", "get_device_capability", "get_device_properties",
             "_lazy_init")


@contextlib.contextmanager
def facts_standing_in(facts: dict):
    """torch.cuda answering from `facts` (device_facts of the steps' device), and raising DeviceTouched
    on anything else that would initialize the device (Backend.facts_standing_in)."""
    import torch

    cuda = torch.cuda
    saved = {name: getattr(cuda, name) for name in _STOOD_IN}
    properties = types.SimpleNamespace(**facts["properties"])

    def touched():
        raise DeviceTouched("the device was asked for something its stood-in facts do not answer "
                            "(torch.cuda initialization)")

    stand_ins = {"device_count": lambda: facts["count"], "current_device": lambda: facts["current_device"],
                 "get_device_name": lambda device=None: facts["name"],
                 "get_device_capability": lambda device=None: tuple(facts["capability"]),
                 "get_device_properties": lambda device=None: properties, "_lazy_init": touched}
    for name, stand_in in stand_ins.items():
        setattr(cuda, name, stand_in)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(cuda, name, original)


def occupancy_limits() -> dict | None:
    import torch

    if not torch.cuda.is_available():  # compiling for CUDA without a device (a CPU host, stand-in drivers)
        return None
    props = torch.cuda.get_device_properties(0)
    limits = {"regs_per_sm": getattr(props, "regs_per_multiprocessor", None),
              "threads_per_sm": getattr(props, "max_threads_per_multi_processor", None),
              "smem_per_sm": getattr(props, "shared_memory_per_multiprocessor", None)}
    # An older torch that lacks one: no bound rather than a bound that leaves a limit out.
    return limits if all(limits.values()) else None


BACKEND = Backend(
    ray_resource="GPU",
    flaggems_vendor="nvidia",
    name="cuda",
    aliases=("nvidia", "gpu"),
    torch_device_type="cuda",
    visibility_key="CUDA_VISIBLE_DEVICES",
    vendor_cli=(("nvidia-smi", "-L"), r"^GPU \d+:"),
    graph_capture=True,
    capture_markers=CaptureMarkers(
        recoverable=(
            "operation not permitted when stream is capturing",
            "cudaErrorStreamCaptureUnsupported",
            "cudaErrorStreamCaptureInvalidated",
            "cudaErrorStreamCaptureImplicit",
            "Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture",
            "during CUDA graph capture",
            "not supported during capture",
        ),
        fatal=(
            "an illegal memory access was encountered",
            "CUDA out of memory",
            "OutOfMemoryError",
            "device-side assert triggered",
            "misaligned address",
        ),
        poisoned=("CUDA error: unknown error", "CUDA driver error: unknown error"),
    ),
    identity=identity,
    monitor=monitor_nvml.open_monitor,
    torch_build=lambda torch: torch.version.hip is None,
    l2_cache_bytes=l2_cache_bytes,
    occupancy_limits=occupancy_limits,
    warm_fork=warm_fork,
    device_facts=device_facts,
    facts_standing_in=facts_standing_in,
    # Kineto over CUPTI: kernels, memcpy and memset activities, each with device timestamps.
    profiler_activity="CUDA",
)
