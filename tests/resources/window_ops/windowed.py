"""An operator timed through the direct timer's windows, on a machine with no device timer.

The interpreter's host timer takes no windows, so this module (which the child imports before its
plugins start) hands the timing plugin the real Timer with only the direct timer's clock standing in:
each window is one host-clock measurement. A row's `windows_ms` then counts the windows the child's
Timer was given."""

import torch

from harness.child.plugins import timing
from harness.measure import timers
from ops import Operator
from ops.add import triton_add


class DirectOnHostClock(timers.Timer):
    def __init__(self, backend, timer, warmup_ms, rep_ms, mark, **options):
        super().__init__(backend, timer, warmup_ms, rep_ms, mark, **options)
        self.timer = "direct"

    def _direct(self, fn, warmup_ms=None, rep_ms=None):
        return self._host(fn)


timing.Timer = DirectOnHostClock

windowed = Operator(
    name="windowed",
    inputs=lambda shape, dtype, device: (torch.randn(*shape, dtype=dtype, device=device),
                                         torch.randn(*shape, dtype=dtype, device=device)),
    baseline=torch.add,
    candidate=triton_add,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
