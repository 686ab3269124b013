"""Shape files: yaml whose top-level keys are operator names or family keys.

    softmax:
      shapes: [[1024, 1024], [64, 512]]
      dtypes: [bf16, fp16]        # optional

An operator takes the entry under its own name, else the first of its family keys present
(e.g. `blas` for mm), so one family entry serves several operators and a file that names only
the operator still works. Every validation error names the file and the key.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from harness.core.errors import clip
from harness.core.rundir import atomic_write_text, read_yaml_mapping
from ops import DTYPES_RULE, valid_dtype_list


class ShapeFileError(ValueError):
    pass


# Ceilings on a shape, read before any input is made: a dim past int32 indexing, or a shape whose dims
# multiply past 2**48 (a 65536-cube GEMM is 2**48; a pointwise shape of that many elements is petabytes),
# is no benchmark's. Without them [1e12, 1e6] failed its row only once torch tried to allocate it, and a
# host that overcommits memory could be driven out of it.
MAX_DIM = 2**31 - 1
MAX_SHAPE_PRODUCT = 2**48


def load(path: Path) -> dict:
    return read_yaml_mapping(path, ShapeFileError, "shape file", "a mapping of op or family names")


def resolve(path: Path, op_name: str, fallback_keys: tuple[str, ...],
            ndim: int | None = None) -> tuple[str, list[list[int]], list[str] | None]:
    """(key used, shapes, dtypes or None) for one operator, validated."""
    data = load(path)
    for key in (op_name, *fallback_keys):
        if key in data:
            break
    else:
        tried = ", ".join((op_name, *fallback_keys))
        raise ShapeFileError(f"{path}: no entry for '{op_name}' (keys tried: {tried})")
    entry = data[key]
    where = f"{path}: key '{key}'"
    if isinstance(entry, list):
        entry = {"shapes": entry}
    if not isinstance(entry, dict) or "shapes" not in entry:
        raise ShapeFileError(f"{where}: expected a mapping with a 'shapes' list")
    unknown = set(entry) - {"shapes", "dtypes"}
    if unknown:
        raise ShapeFileError(f"{where}: unknown fields {clip(sorted(map(str, unknown)))} (allowed: shapes, dtypes)")
    shapes = entry["shapes"]
    if not isinstance(shapes, list) or not shapes:
        raise ShapeFileError(f"{where}: 'shapes' must be a non-empty list")
    first = {}  # shape -> its index: a long list is checked for repeats in one pass
    for i, shape in enumerate(shapes):
        if isinstance(shape, int):
            shape = [shape]
        if (not isinstance(shape, list) or not shape
                or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise ShapeFileError(f"{where}: shapes[{i}] = {clip(shape)} is not a list of positive ints")
        if max(shape) > MAX_DIM or math.prod(shape) > MAX_SHAPE_PRODUCT:
            raise ShapeFileError(f"{where}: shapes[{i}] = {clip(shape)} is past the ceilings of a shape (each dim at "
                                 f"most 2**31-1, their product at most 2**48)")
        if ndim is not None and len(shape) != ndim:
            raise ShapeFileError(f"{where}: shapes[{i}] = {clip(shape)} has {len(shape)} dims, '{op_name}' takes "
                                 f"{ndim}")
        if tuple(shape) in first:  # rows are keyed by shape: a second one would collide with the first
            raise ShapeFileError(f"{where}: shapes[{i}] = {clip(shape)} repeats shapes[{first[tuple(shape)]}]")
        first[tuple(shape)] = i
    dtypes = entry.get("dtypes")
    if dtypes is not None and not valid_dtype_list(dtypes):
        raise ShapeFileError(f"{where}: dtypes {clip(dtypes)} must be {DTYPES_RULE}")
    return key, [list(shape) for shape in first], dtypes


def write_used(path: Path, op_name: str, shapes: list[list[int]], dtypes: list[str], source: str) -> None:
    """shapes.yaml of a run dir: exactly the shapes and dtypes used, readable by `resolve`."""
    header = f"# shapes used by this run (from {source})\n"
    body = yaml.safe_dump({op_name: {"shapes": shapes, "dtypes": dtypes}}, default_flow_style=None, sort_keys=False)
    atomic_write_text(Path(path), header + body)


def label(shape) -> str:
    return "x".join(str(d) for d in shape)
