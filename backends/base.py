"""The backend contract: everything that differs between accelerator vendors lives here.

Code above `backends/` asks a `Backend` for capabilities and markers; it never compares vendor
names. Each vendor module builds one `Backend` instance from data, so adding a vendor is adding a
module, not editing the harness.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from .monitor import Monitor

# Every vendor's visibility keys. A child's environment is scrubbed of all of them before its own
# backend's key is set: a stale HIP_VISIBLE_DEVICES under a CUDA run (or the reverse) silently
# picks the wrong card on hosts that have both stacks installed.
ALL_VISIBILITY_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
)

RECOVERABLE = "recoverable"
FATAL = "fatal"
POISONED = "poisoned"


class DeviceTouched(RuntimeError):
    """Something asked for the device inside `Backend.facts_standing_in` that the facts do not answer."""


class BackendUnavailable(RuntimeError):
    """The backend's device is not present on this machine."""


@dataclasses.dataclass(frozen=True)
class CaptureMarkers:
    """Substrings of accelerator error text, per class of graph-capture failure.

    Markers must be specific: torch appends a generic "compile with TORCH_USE_CUDA_DSA to enable
    device-side assertions" footer to every CUDA error, so a marker like "device-side assert"
    would turn every harmless capture refusal into a fatal error.
    """

    recoverable: tuple[str, ...] = ()
    fatal: tuple[str, ...] = ()
    poisoned: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    aliases: tuple[str, ...]
    torch_device_type: str
    visibility_key: str | None
    # (argv, regex): the vendor CLI that lists devices and the pattern of one device line.
    vendor_cli: tuple[tuple[str, ...], str] | None = None
    # Extension module that registers the device with torch (torch_musa, torch_npu).
    torch_module: str | None = None
    graph_capture: bool = False
    # Graph class on the torch device module (torch.cuda.CUDAGraph, torch.musa.MUSAGraph).
    graph_class: str = "CUDAGraph"
    # Triton's own driver runs kernels (False for the interpreter: no compile hooks, no do_bench).
    triton_driver: bool = True
    # Whether Triton compiles kernels here (an autotune sweep's configs are then compiled in
    # parallel before it is timed); the interpreter compiles nothing.
    compiles_kernels: bool = True
    # Whether this backend's timings are performance numbers at all (the interpreter's are not:
    # its runs exercise the pipeline, and reports must not present verdicts on them).
    measures_performance: bool = True
    capture_markers: CaptureMarkers = CaptureMarkers()
    # Test functions whose capture attempt kills the context: timed directly from the start.
    capture_deny: frozenset[str] = frozenset()
    # FlagGems' name for this vendor (GEMS_VENDOR), set before flag_gems is imported: its own probe
    # shells out to vendor CLIs and can hang; None leaves FlagGems to probe.
    flaggems_vendor: str | None = None
    # Extra environment for the child (e.g. TRITON_INTERPRET=1).
    child_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Why this backend computes a dtype wrongly whatever the kernel (a known limitation of its runtime,
    # found by a probe it runs in the child), or None where it computes it right. Rows of such a dtype
    # would fail as wrong through no fault of the kernel under test. None: every dtype is trusted.
    dtype_problem: Callable[[str], str | None] | None = None
    # Shape set used when the user gives none.
    default_shapes: str = "default.yaml"
    # Whether the other shipped shape sets (shapes/*.yaml, sized for GPUs) run in useful time here; where
    # not (the interpreter runs every program in NumPy: minutes per GPU-sized case), a plan that names
    # one runs default_shapes instead, saying so.
    runs_shipped_shapes: bool = True
    # Default timing budgets (ms); the interpreter is orders of magnitude slower. The warmup: on an H200 a
    # row's first samples after 0, 2, 5 or 25 ms of warmup, busy or idle before, read within +/-1% of the
    # steady median with no trend in the budget (docs/performance.md), and 25 ms a side was a sixth of a
    # FlagGems repeat step.
    warmup_ms: float = 5.0
    rep_ms: float = 100.0
    # Default within-process stopping (--max-noise, a fraction): a side stops sampling once its median's
    # relative standard error is below it. On an H200 (session 26's A/B, 100 ms a side, ~50 graph replays)
    # that error was 0.01-0.06% on 11 of 12 rows against 0.24-1.1% of spread between processes, which the
    # verdict's repeats carry anyway: at 0.1% most sides stop after 10-15 replays, a third of the budget,
    # and add at most (0.1/0.24)^2 = 17% to a row's variance between repeats (under 7% at 0.4%). A side
    # that stays noisy still times its whole rep_ms.
    max_noise: float = 0.001
    identity: Callable[[], dict] | None = None
    # A backend without device indices (the interpreter): how many runs it takes side by side,
    # numbered 0..n-1 like devices, so batch and the parallel sweep shard over it as over GPUs.
    virtual_devices: Callable[[], int] = lambda: 1
    # Whether the installed torch is a build for this vendor (ROCm torch also answers torch.cuda).
    torch_build: Callable[[object], bool] = lambda torch: True
    # Ray's resource name for one of this backend's devices (GPU, NPU): a batch's Ray task asks for
    # one and runs on the id Ray assigned it. None: no device resource (the interpreter).
    ray_resource: str | None = None
    # The device's last-level cache in bytes, read in the child (`--l2 cold` writes a buffer larger
    # than it between calls); None: no cache the harness knows how to flush, and cold is refused.
    l2_cache_bytes: Callable[[], int] | None = None
    # The torch.profiler activity (ProfilerActivity member, also the DeviceType of its events) that
    # records this device's kernels; None: no device profiler (no `--timer profiler`, no per-kernel
    # attribution on rows).
    profiler_activity: str | None = None
    # Opens the device monitor of the child's one visible device (backends.monitor): clocks,
    # temperature, power, throttle reasons; None where the backend has none (the interpreter).
    monitor: Callable[[], Monitor] | None = None
    # The device's per-SM limits that bound a kernel's occupancy (regs_per_sm, threads_per_sm,
    # smem_per_sm), read in the child; None where the device reports none, or where the compiler
    # states the occupancy itself (AMDGCN's `; Occupancy:`).
    occupancy_limits: Callable[[], dict | None] | None = None
    # What every process does on the CPU before or as it first touches the device, which a warm worker
    # (harness.worker) does once for all the steps it forks: it must touch no device (a forked step
    # could not initialize one). None: nothing beyond the imports.
    warm_fork: Callable[[], None] | None = None
    # What a package may ask of the device while it is imported (its capability, properties, count), so
    # that a warm worker can import an operator library (FlagGems: 4-5 s) once for all the steps it forks
    # without initializing the device. `device_facts()` reads them, run in a fresh process that sees only
    # the steps' device (it initializes that device, and exits); `facts_standing_in(facts)` is a context
    # in which the device module answers from them and anything that would initialize the device raises
    # DeviceTouched. None: no such import is done in a worker; the steps import the package themselves.
    device_facts: Callable[[], dict] | None = None
    facts_standing_in: Callable[[dict], AbstractContextManager] | None = None

    @property
    def default_timer(self) -> str:
        if not self.triton_driver:
            return "host"
        return "graph" if self.graph_capture else "direct"

    @property
    def timers(self) -> tuple[str, ...]:
        """The --timer choices this backend takes, `auto` (its default_timer) first."""
        if not self.triton_driver:
            return ("auto", "host")
        return ("auto", *(("graph",) if self.graph_capture else ()), "direct",
                *(("profiler",) if self.profiler_activity else ()))

    # --- devices ---------------------------------------------------------------------------
    def enumerate_devices(
        self,
        explicit: Sequence[int] | None = None,
        environ: Mapping[str, str] | None = None,
        torch_count: Callable[[], int] | None = None,
    ) -> list[int]:
        """Device indices, by the first source that answers: explicit list, visibility env,
        vendor CLI, then torch."""
        if explicit:
            return list(explicit)
        environ = os.environ if environ is None else environ
        if self.visibility_key is None:
            return list(range(self.virtual_devices()))
        visible = environ.get(self.visibility_key)
        if visible is not None:
            items = [x.strip() for x in visible.split(",") if x.strip() != ""]
            if not all(x.isdigit() for x in items):
                # The child is handed one index in this key: UUIDs or MIG names cannot be mapped.
                raise BackendUnavailable(f"backend '{self.name}': {self.visibility_key}={visible!r} is not a list of "
                                         "device indices (zl_bench hands each child one index); set indices, e.g. 0,1")
            return [int(x) for x in items]
        listed = self._devices_from_cli()
        if listed is not None:
            return listed
        return list(range((torch_count or self._torch_count)()))

    def _devices_from_cli(self) -> list[int] | None:
        if self.vendor_cli is None:
            return None
        argv, pattern = self.vendor_cli
        if shutil.which(argv[0]) is None:
            return None
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        return list(range(len(re.findall(pattern, out, flags=re.MULTILINE))))

    def _torch_count(self) -> int:
        import importlib

        try:
            torch = importlib.import_module("torch")
            if self.torch_module:
                importlib.import_module(self.torch_module)
            if not self.torch_build(torch):
                return 0
            accel = getattr(torch, self.torch_device_type)
            return int(accel.device_count()) if accel.is_available() else 0
        except (ImportError, AttributeError, RuntimeError):
            return 0

    def check_available(self, explicit: Sequence[int] | None = None) -> list[int]:
        """The devices to use, or BackendUnavailable with one line telling what to do."""
        found = self.enumerate_devices()
        if not found:
            raise BackendUnavailable(
                f"backend '{self.name}': no device found on this machine; "
                "to run the pipeline without a GPU use --backend interpreter"
            )
        if explicit:
            missing = [d for d in explicit if d not in found]
            if missing:
                valid = ", ".join(map(str, found))
                # The first few named, the rest counted: a list of 5,000 was a 29 KB line.
                named = str(missing[:8])[:-1] + (f", ... ({len(missing) - 8} more)]" if len(missing) > 8 else "]")
                raise BackendUnavailable(
                    f"backend '{self.name}': device(s) {named} do not exist here; it has {len(found)} "
                    f"device{'s' if len(found) != 1 else ''}, valid --device: {valid}"
                )
            return list(explicit)
        return found

    def visibility_env(self, device: int, environ: Mapping[str, str]) -> dict[str, str]:
        """The child's environment: every vendor's visibility key removed, then ours set."""
        env = {k: v for k, v in environ.items() if k not in ALL_VISIBILITY_KEYS}
        if self.visibility_key is not None:
            env[self.visibility_key] = str(device)
        env.update(self.child_env)
        return env

    # --- capture failures ------------------------------------------------------------------
    def classify_capture_error(self, exc: BaseException) -> str:
        """recoverable / fatal / poisoned, from the error text. Unknown text is fatal: a failure
        we cannot name must not be papered over with a number from another timer."""
        text = f"{type(exc).__name__}: {exc}"
        m = self.capture_markers
        for cls, markers in ((FATAL, m.fatal), (POISONED, m.poisoned), (RECOVERABLE, m.recoverable)):
            if any(marker in text for marker in markers):
                return cls
        return FATAL

    def device_touched(self) -> bool:
        """Whether this process has initialized its device (torch's flag, no device call): a fork
        from here would copy the context and its threads. True where torch cannot say."""
        import torch

        check = getattr(getattr(torch, self.torch_device_type, None), "is_initialized", None)
        return True if check is None else bool(check())

    def torch_device(self) -> str:
        """Inside the child exactly one device is visible, so it is always index 0."""
        return "cpu" if self.torch_device_type == "cpu" else f"{self.torch_device_type}:0"
