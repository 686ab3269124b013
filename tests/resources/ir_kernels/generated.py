"""A kernel whose code is generated into a file and loaded from it, kept out of sys.modules, calling a JIT
function its loader puts in its globals afterwards (wrapped, at module level, by a decorator's object):
what FlagGems' pointwise_dynamic does. Launched through a stand-in driver (tests/standin_triton.py)."""

import importlib.util
from pathlib import Path

import torch
import triton

N = 1024
BLOCK = 128


class Pointwise:
    """A decorator's object in place of the JIT function (FlagGems' PointwiseDynamicFunction)."""

    def __init__(self, scalar_fn):
        self._scalar_fn = scalar_fn


@Pointwise
@triton.jit
def triple(x):
    return x * 3


CODE = '''import triton
import triton.language as tl


@triton.jit
def triple_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, triple(tl.load(x_ptr + offs, mask=mask)), mask=mask)
'''


def build(directory: Path):
    """The generated module, loaded from its file in `directory` under a name no import finds."""
    path = Path(directory) / "zl_generated_rank_1.py"
    path.write_text(CODE)
    spec = importlib.util.spec_from_file_location("_zl_gen_module_rank_1", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not in sys.modules
    module.__dict__.update(triple._scalar_fn.__globals__)  # as FlagGems does: the scalar's module's globals,
    module.__dict__["triple"] = triple._scalar_fn  # and the scalar function itself under its name
    return module


def launch(module, n=N):
    x = torch.ones(n)
    module.triple_kernel[(triton.cdiv(n, BLOCK),)](x, torch.empty_like(x), n, BLOCK=BLOCK)
