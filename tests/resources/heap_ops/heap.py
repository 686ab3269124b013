"""An operator whose inputs refuse to be built unless the run's imports are frozen out of the garbage
collector's view (harness.child.plugins.heap): a FlagGems benchmark's gc.collect() after every row then
walks only what the cases made."""

import gc

import torch

from ops import Operator
from ops.add import triton_add

# torch, Triton, pytest and the harness alone make far more tracked objects than this.
IMPORTS_AT_LEAST = 50_000


def _inputs(shape, dtype, device):
    frozen = gc.get_freeze_count()
    if frozen < IMPORTS_AT_LEAST:
        raise RuntimeError(f"the case runs with {frozen} objects frozen: the imports are still walked by every "
                           "collection")
    return tuple(torch.randn(*shape, dtype=dtype, device=device) for _ in range(2))


heap_frozen = Operator(name="heap_frozen", inputs=_inputs, candidate=triton_add, baseline=torch.add,
                       dtypes=("fp32",), shape_keys=("pointwise",))
