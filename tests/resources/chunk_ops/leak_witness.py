"""An operator that writes what its process looks like as each case is built (leaky's leftovers: the
variable, the sys.path entry, the working dir, the cycles it left uncollected) into witness.txt in its run dir."""

import os
import sys
from pathlib import Path

import torch

from ops import Operator


def _cycles_alive() -> int:
    """leaky's cycles still alive: each holds a tensor only a collection frees."""
    leaky = next((m for name, m in sys.modules.items() if name.endswith("misbehaving_in_a_host")), None)
    return sum(ref() is not None for ref in getattr(leaky, "LEFT", ()))


def inputs(shape, dtype, device):
    run_dir = Path(sys.argv[1])  # the measuring child's one argument, as an exec'd child has it
    with open(run_dir / "witness.txt", "a") as f:
        f.write(f"env={os.environ.get('ZL_LEAKED', 'unset')} path={'/zl-leaked' in sys.path} cwd={os.getcwd()} "
                f"cycles={_cycles_alive()}\n")
    return (torch.randn(*shape, dtype=dtype, device=device),)


leak_witness = Operator(
    name="leak_witness",
    inputs=inputs,
    baseline=lambda x: x + 1,
    candidate=lambda x: x + 1,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
