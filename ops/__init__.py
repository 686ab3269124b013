"""The operator corpus. One module per operator; each defines module-level `Operator` objects.

`harness.providers.registry` imports only the module of the operator asked for, so one operator's broken
dependency cannot break the others.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

DTYPE_NAMES = ("fp16", "bf16", "fp32")
# What a dtype selection must be, wherever one is given (command line, shape file, A/B plan): a repeated
# dtype would give rows that collide in every comparison.
DTYPES_RULE = f"a non-empty list of distinct names drawn from {', '.join(DTYPE_NAMES)}"

# An operator's name names files (its autotune records, its run dirs) and is typed on command lines.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def valid_dtype_list(value) -> bool:
    return (isinstance(value, list) and bool(value) and all(d in DTYPE_NAMES for d in value)
            and len(set(value)) == len(value))


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclasses.dataclass(frozen=True)
class Operator:
    """An operator as data: how to build inputs for a shape, the torch baseline, the Triton
    candidate, and how to size a row (bytes moved, flops) for gbps/tflops."""

    name: str
    # (shape, torch dtype, device) -> tuple of positional args for baseline and candidate.
    inputs: Callable[..., tuple]
    baseline: Callable[..., Any]
    candidate: Callable[..., Any]
    dtypes: tuple[str, ...] = DTYPE_NAMES
    # Names of the shape dims ("M", "N", "K") when the operator takes a fixed rank; None: any rank.
    dims: tuple[str, ...] | None = None
    # Shape-file keys tried after the op name: a family key ("blas", "norm") shared by several ops.
    shape_keys: tuple[str, ...] = ()
    # (shape, element size in bytes) -> bytes moved; (shape) -> flops. None: metric unknown.
    bytes_moved: Callable[[tuple, int], int] | None = None
    flops: Callable[[tuple], int] | None = None
    # dtype name -> (atol, rtol) for the correctness check against the baseline.
    # An unconditional skip: the reason it never runs (kept in the inventory, excluded by --all).
    skip: str = ""
    tolerance: dict[str, tuple[float, float]] = dataclasses.field(
        default_factory=lambda: {"fp16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2), "fp32": (1e-4, 1e-4)}
    )

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"operator name {self.name!r}: use letters, digits, '_', '.' and '-', starting with a "
                             "letter or '_' (it names files and is typed on command lines)")
        unknown = set(self.dtypes) - set(DTYPE_NAMES)
        if unknown:
            raise ValueError(f"operator {self.name}: unknown dtypes {sorted(unknown)}")
