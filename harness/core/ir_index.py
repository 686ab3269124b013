"""The run dir's IR index (`ttgir/index.tsv`, written by harness.measure.ir): its columns, how it is
read, and how two runs' launched variants are matched. One module, so the writer, the A/B IR
comparison and the corpus report cannot drift apart."""

from __future__ import annotations

import os
from pathlib import Path

from harness.core import bounded

IR_DIR = "ttgir"
INDEX_FILE = "index.tsv"
# Per launched variant, the statistics of its compiled code (harness.measure.kernel_stats), by cache hash.
STATS_FILE = "stats.json"
# A statistic no artifact of the variant answers (a tool missing, a stage the backend does not emit).
NOT_AVAILABLE = "not available"
# Statistics counted in bytes (shown in KB where large).
BYTE_FIELDS = ("smem", "stack bytes", "local bytes", "spill bytes")
# Stages hashed into the index so that a change only in LLVM lowering or codegen is still seen.
HASHED_STAGES = ("ttir", "ttgir", "llir", "ptx", "amdgcn")
INDEX_COLUMNS = ("shape", "kernel", "file", "launches", "dtype", "align", "num_warps", "num_stages",
                 "constexprs", "hash", *(f"{s}_sha" for s in HASHED_STAGES))
# What a variant is, as opposed to its file name (which depends on the rest of its group) or its
# cache hash (which depends on the compiler build): both legitimately differ between A and B.
IDENTITY_COLUMNS = ("shape", "kernel", "dtype", "align", "num_warps", "num_stages", "constexprs")


def index_path(run_dir: Path) -> Path:
    return Path(run_dir) / IR_DIR / INDEX_FILE


def read_index(run_dir: Path) -> list[dict] | None:
    """Every compiled variant's row, or None where the run collected no IR."""
    path = index_path(run_dir)
    if not os.path.lexists(path):
        return None
    lines = bounded.read_text(path, "IR index").splitlines()
    if not lines:
        raise bounded.InputRefused(f"{path} is empty: an IR index starts with its header line")
    header, rows = lines[0].split("\t"), []
    for n, line in enumerate(lines[1:], 2):
        cells = line.split("\t")
        if line and len(cells) != len(header):
            raise bounded.InputRefused(f"{path}:{n} has {len(cells)} fields, its header {len(header)}: a corrupt IR "
                                       "index")
        rows += [dict(zip(header, cells, strict=True))] if line else []
    return rows


def launched(run_dir: Path) -> dict[tuple, dict] | None:
    """The variants that ran (a row whose file is `-` was compiled, never launched), by identity;
    None where the run collected no IR."""
    rows = read_index(run_dir)
    if rows is None:
        return None
    return {tuple(r[c] for c in IDENTITY_COLUMNS): r for r in rows if r["file"] != "-"}


def differing_stages(ra: dict, rb: dict) -> list[str]:
    return [s for s in HASHED_STAGES if ra[f"{s}_sha"] != rb[f"{s}_sha"]]


def stats_path(run_dir: Path) -> Path:
    return Path(run_dir) / IR_DIR / STATS_FILE


def read_stats(run_dir: Path) -> dict[str, dict] | None:
    """Cache hash -> the launched variant's statistics (harness.measure.kernel_stats), or None where
    the run wrote none (IR off, or a run older than the statistics)."""
    path = stats_path(run_dir)
    if not os.path.lexists(path):
        return None
    data = bounded.read_json(path, "IR statistics")
    if not isinstance(data, dict) or not isinstance(data.get("variants"), dict):
        raise bounded.InputRefused(f"{path} holds no 'variants' object: corrupt IR statistics")
    return data["variants"]


def row_variants(indexes: tuple, dtype: str, shape) -> tuple[dict, dict]:
    """A result row's launched variants on each side (`indexes`: both sides' `launched()`), by
    identity: those of its shape, narrowed to its dtype where the signatures tell dtypes apart (a
    shape's dir holds every dtype's kernels)."""
    label = "x".join(map(str, shape))
    sides = [{k: r for k, r in index.items() if k[0] == label} for index in indexes]
    own = [{k: r for k, r in side.items() if k[2] == dtype} for side in sides]
    return tuple(own) if any(own) else tuple(sides)
