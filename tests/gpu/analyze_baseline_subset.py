"""Does the process factor need the torch baseline timed on every row of every repeat (issue 46)? Offline,
from an A/B dir a GPU wrote (not collected by pytest; no GPU needed):

    python3 tests/gpu/analyze_baseline_subset.py AB_DIR/<op> [AB_DIR/<op> ...]

Re-judges each op's rows (reports.compare.judge, as the report does) with its baselines kept on every row,
on K rows per latency band (spread over the band by latency) for K in KS, and on none, and prints per
variant the median and mean half-width of the rows' 95% intervals (log scale, %), how many rows had a
process factor taken out, and the verdicts. A baseline not timed is a baseline the repeat need not spend
device time on.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_dirs import timed_runs  # noqa: E402

from reports import compare, stats  # noqa: E402

KS = (8, 6, 4)


def spread_subset(rows: list, k: int) -> list[bool]:
    """Per latency band, k of its rows spread over its latencies: which rows keep their baseline."""
    bands: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        bands.setdefault(compare.band(stats.center(r.a_ms)), []).append(i)
    kept = set()
    for members in bands.values():
        members.sort(key=lambda i: stats.center(rows[i].a_ms))
        step = max(1.0, len(members) / k)
        kept |= {members[int(j * step)] for j in range(min(k, len(members)))}
    return [i in kept for i in range(len(rows))]


def judged(rows: list, keep: list[bool]) -> list:
    rows = copy.deepcopy(rows)
    for r, kept in zip(rows, keep, strict=True):
        if not kept:
            r.a_control_ms, r.b_control_ms = [], []
    compare.judge(rows)
    return rows


def main() -> int:
    for op_dir in map(Path, sys.argv[1:]):
        rows = [r for r in compare.pair(timed_runs(op_dir, "A"), timed_runs(op_dir, "B")) if r.a_ms and r.b_ms]
        variants = {"every row": [True] * len(rows), **{f"{k} a band": spread_subset(rows, k) for k in KS},
                    "none": [False] * len(rows)}
        print(f"{op_dir.name}: {len(rows)} rows")
        for name, keep in variants.items():
            out = judged(rows, keep)
            widths = [100 * r.comparison.half_width for r in out if math.isfinite(r.comparison.half_width)]
            verdicts = [r.comparison.verdict for r in out]
            print(f"  {name:<10} baselines {sum(keep):>3}  half-width median {statistics.median(widths):.3f}% "
                  f"mean {statistics.mean(widths):.3f}%  factor on {sum(1 for r in out if r.process_factor):>3} rows  "
                  + " ".join(f"{v} {verdicts.count(v)}" for v in sorted(set(verdicts))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
