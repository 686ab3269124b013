"""An operator whose graph capture kills the accelerator context, on a machine with none.

The interpreter cannot capture graphs, so this module (which the child imports before its plugins
start) hands the timing plugin the real Timer with only the capture itself standing in for a CUDA
device's: it fails with the error text of a dead CUDA context, which the cuda backend's markers
classify as poisoned. Everything after that (marker, failed row, stopping the session, the run's
outcome) is the harness's own code."""

import torch

import backends
from harness.child.plugins import timing
from harness.measure import timers
from ops import Operator
from ops.add import triton_add

DEAD_CONTEXT = "CUDA error: unknown error"


class CaptureKillsContext(timers.Timer):
    def __init__(self, backend, timer, warmup_ms, rep_ms, mark, **options):
        super().__init__(backend, timer, warmup_ms, rep_ms, mark, **options)
        self.timer = "graph"
        self.backend = backends.get("cuda")  # whose markers classify the capture error

    def _graph(self, fn, warmup_ms=None, rep_ms=None, sizes=None):
        raise timers._CaptureFailed("capture", RuntimeError(DEAD_CONTEXT))


timing.Timer = CaptureKillsContext

poisoned = Operator(
    name="poisoned",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=triton_add,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
