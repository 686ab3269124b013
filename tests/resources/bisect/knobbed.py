"""A user operator whose speed a build's knobs set, for the bisect tests. Each call of its candidate
costs COST_S on the host timer's clock, FACTOR times that where the knob of its shape's size is "1" in
the side's environment (a build of the bisect is a side of each probe's A/B): row (300,) reads
ZL_TEST_SLOW_SMALL, row (2, 700) ZL_TEST_SLOW_LARGE, so a build list that turns them on at different
builds moves the two rows at different builds.

The cost is simulated, as tests/standin_cuda.py simulates a device clock: the candidate advances the
clock the host timer reads (time.perf_counter, in the measuring child that imports this module) instead
of sleeping, so a reading is the call's real few microseconds plus an exact cost, whatever the load on
the machine; a real sleep's wake-up latency varies by a millisecond there, and the A/B's 0.3% margin
then calls moves that are not there."""

import os
import time

import torch
import triton
import triton.language as tl

from ops import Operator, numel

SLOW_SMALL, SLOW_LARGE = "ZL_TEST_SLOW_SMALL", "ZL_TEST_SLOW_LARGE"
COST_S = 0.01
FACTOR = 2


def _knob(x) -> str:
    return SLOW_SMALL if numel(x.shape) < 1000 else SLOW_LARGE


# Autotuned (one config), so that the record has a config to pin and every replay replays it.
@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def add_one(x):
    out = torch.empty_like(x)
    n = x.numel()
    add_one_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    return out


def inputs(shape, dtype, device):
    x = torch.randn(*shape, dtype=dtype, device=device)
    # The kernel runs (and is tuned, recorded, replayed) as each case is built, not in the timed call:
    # the interpreter's kernel time varies with the machine's load; the simulated cost does not.
    torch.testing.assert_close(add_one(x), x + 1)
    return (x,)


_real_clock = time.perf_counter
_spent_s = 0.0


def _clock() -> float:
    return _real_clock() + _spent_s


time.perf_counter = _clock


def candidate(x):
    global _spent_s
    _spent_s += COST_S * (FACTOR if os.environ.get(_knob(x)) == "1" else 1)
    return x + 1


knobbed = Operator(
    name="knobbed",
    inputs=inputs,
    baseline=lambda x: x + 1,
    candidate=candidate,
    dtypes=("fp32",),
    shape_keys=("pointwise",),
)
