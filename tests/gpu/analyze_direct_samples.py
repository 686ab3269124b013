"""How many single-call samples a direct-timed row needs (issue 46): offline, from an A/B dir a GPU wrote (not
collected by pytest; no GPU needed):

    python3 tests/gpu/analyze_direct_samples.py AB_DIR/<op> [AB_DIR/<op> ...]

For each side's repeats of every direct-timed row that took at least the most samples asked about in each of
them (results.json keeps every sample, `raw`), the median of its first k samples, k in KS, per repeat; then,
across the side's repeats, the sd of log(candidate median) and of log(candidate / torch baseline), the ratio
the process factor reads. Prints the median over rows of each sd (%), per k: where it stops narrowing,
more samples buy the verdict nothing, since it reads the spread between processes.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.core.results import read_results  # noqa: E402

KS = (10, 25, 50, 100, 250, 500, 1000)


def side_samples(op_dir: Path) -> dict[tuple[str, str], list[tuple[list[float], list[float]]]]:
    """(row case, side) -> per repeat: (candidate samples, baseline samples), direct-timed rows only."""
    out: dict[tuple[str, str], list] = {}
    for results in sorted(op_dir.glob("[AB]-[0-9]*/*/results.json")):
        side = results.parent.parent.name.split("-")[0]
        for row in read_results(results.parent):
            samples = row.samples or {}
            if row.timer != "direct" or "candidate" not in samples or "baseline" not in samples:
                continue
            out.setdefault((row.case, side), []).append((samples["candidate"]["raw"], samples["baseline"]["raw"]))
    return out


def main() -> int:
    groups = {}
    for op_dir in map(Path, sys.argv[1:]):
        groups.update({(op_dir.name, *key): value for key, value in side_samples(op_dir).items()})
    full = {key: reps for key, reps in groups.items()
            if len(reps) >= 3 and all(min(len(c), len(b)) >= KS[-1] for c, b in reps)}
    print(f"{len(full)} rows x sides with >= 3 repeats of >= {KS[-1]} samples each (of {len(groups)})")
    print(f"{'k':>5} {'sd log candidate %':>19} {'sd log candidate/baseline %':>28}")
    for k in KS:
        cand = [np.std([np.log(np.median(c[:k])) for c, _ in reps], ddof=1) for reps in full.values()]
        ratio = [np.std([np.log(np.median(c[:k]) / np.median(b[:k])) for c, b in reps], ddof=1)
                 for reps in full.values()]
        if cand:
            print(f"{k:>5} {100 * statistics.median(cand):>19.3f} {100 * statistics.median(ratio):>28.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
