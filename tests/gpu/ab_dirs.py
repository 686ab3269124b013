"""An A/B dir as the offline analyses of tests/gpu read it (no GPU needed): its op dirs, and each side's timed
repeats in repeat order (A-1, A-2, ..., A-10: by number, not by name), each its run dir."""

from __future__ import annotations

from pathlib import Path


def op_dirs(ab_dir: Path) -> list[Path]:
    """The dirs of the A/B's ops: those with a first repeat."""
    return sorted(p for p in Path(ab_dir).iterdir() if (p / "A-1").is_dir())


def timed_runs(op_dir: Path, side: str) -> list[Path]:
    """The run dirs of `side`'s repeats of the op (its record and passes aside), in repeat order; a repeat
    that wrote no results.json is left out."""
    steps = sorted(Path(op_dir).glob(f"{side}-[0-9]*"), key=lambda p: int(p.name.split("-")[1]))
    return [found.parent for step in steps if (found := next(step.glob("*/results.json"), None))]
