"""How many samples a row needs (issue 46): offline, from an A/B dir a GPU wrote (not collected by pytest; no
GPU needed):

    python3 tests/gpu/analyze_direct_samples.py [--timer direct|graph] AB_DIR/<op> [AB_DIR/<op> ...]

For each side's repeats of every row of that timer (direct: single calls; graph: 2 ms chains of replays) that
took at least the most samples asked about in each of them (results.json keeps every sample, `raw`), the
median of its first k samples, k in KS[timer], per repeat; then, across the side's repeats, the sd of
log(candidate median) and of log(candidate / torch baseline), the ratio the process factor reads. Prints the
median over rows of each sd (%), per k and latency band: where it stops narrowing, more samples buy the
verdict nothing, since it reads the spread between processes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_dirs import timed_runs  # noqa: E402

from harness.core.results import read_results  # noqa: E402

KS = {"direct": (10, 25, 50, 100, 250), "graph": (2, 3, 5, 7, 10)}
BANDS_US = ((0, 10), (10, 100), (100, float("inf")))


def side_samples(op_dir: Path, timer: str) -> dict[tuple[str, str], list[tuple[list[float], list[float]]]]:
    """(row case, side) -> per repeat: (candidate samples, baseline samples), rows of `timer` only."""
    out: dict[tuple[str, str], list] = {}
    for side in ("A", "B"):
        for row in (row for run in timed_runs(op_dir, side) for row in read_results(run)):
            samples = row.samples or {}
            if row.timer != timer or "candidate" not in samples or "baseline" not in samples:
                continue
            out.setdefault((row.case, side), []).append((samples["candidate"]["raw"], samples["baseline"]["raw"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timer", choices=sorted(KS), default="direct")
    parser.add_argument("op_dirs", nargs="+", type=Path)
    args = parser.parse_args()
    timer = args.timer
    ks = KS[timer]
    groups = {}
    for op_dir in args.op_dirs:
        groups.update({(op_dir.name, *key): value for key, value in side_samples(op_dir, timer).items()})
    full = {key: reps for key, reps in groups.items()
            if len(reps) >= 3 and all(min(len(c), len(b)) >= ks[-1] for c, b in reps)}
    print(f"{len(full)} rows x sides with >= 3 repeats of >= {ks[-1]} {timer} samples each (of {len(groups)})")
    for low, high in BANDS_US:
        band = [reps for reps in full.values() if low <= 1000 * np.median(reps[0][0]) < high]
        if not band:
            continue
        print(f"candidate {low}-{high} us: {len(band)} rows x sides")
        print(f"{'k':>5} {'sd log candidate %':>19} {'sd log candidate/baseline %':>28}")
        for k in ks:
            cand = [np.std([np.log(np.median(c[:k])) for c, _ in reps], ddof=1) for reps in band]
            ratio = [np.std([np.log(np.median(c[:k]) / np.median(b[:k])) for c, b in reps], ddof=1) for reps in band]
            print(f"{k:>5} {100 * statistics.median(cand):>19.3f} {100 * statistics.median(ratio):>28.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
