"""How much a row's B/A moves from one pair of repeats to the next: offline, from the op dirs of an A/B a GPU
wrote (not collected by pytest; no GPU needed):

    python3 tests/gpu/analyze_spread.py AB_DIR/<op> [AB_DIR/<op> ...]

For every row timed in each of the op's first N repeats on both sides (N: the fewer side's), per repeat pair
r: log(B_r / A_r) of the candidate, and the same less log of the torch baselines' B_r / A_r (what the process
factor takes out); their sd over r. Prints per op the median over rows of each sd, of log(candidate) per side
(between processes) and of a row's samples within one measurement (%): two schedules whose verdicts are
compared (`--chunk-records first|beside`) are compared by these.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_dirs import timed_runs  # noqa: E402

from harness.core.results import read_results  # noqa: E402


def _repeats(op_dir: Path, side: str) -> list[dict]:
    """Per repeat of `side`, in order: case -> row, of the rows with both timings."""
    return [{r.case: r for r in read_results(run) if r.candidate_ms and r.baseline_ms}
            for run in timed_runs(op_dir, side)]


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else math.nan


def _median_percent(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return 100 * statistics.median(xs) if xs else math.nan


def spread(op_dir: Path) -> dict | None:
    a, b = _repeats(op_dir, "A"), _repeats(op_dir, "B")
    n = min(len(a), len(b))
    if n < 2:
        return None
    cases = set.intersection(*(set(rows) for rows in a[:n] + b[:n]))
    ratio, factored, between, within = [], [], [], []
    for case in cases:
        logs = [math.log(b[i][case].candidate_ms / a[i][case].candidate_ms) for i in range(n)]
        bases = [math.log(b[i][case].baseline_ms / a[i][case].baseline_ms) for i in range(n)]
        ratio.append(_sd(logs))
        factored.append(_sd([x - y for x, y in zip(logs, bases, strict=True)]))
        for side in (a, b):
            between.append(_sd([math.log(side[i][case].candidate_ms) for i in range(n)]))
            for i in range(n):
                raw = ((side[i][case].samples or {}).get("candidate") or {}).get("raw") or []
                if len(raw) > 2:
                    within.append(_sd([math.log(x) for x in raw]))
    return {"rows": len(cases), "repeats": n, "b_over_a": _median_percent(ratio),
            "b_over_a_factored": _median_percent(factored), "between": _median_percent(between),
            "within": _median_percent(within)}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print(f"{'op':<40} {'rows':>4} {'reps':>4}  sd B/A  less baselines  between  within (%, medians over rows)")
    for op in map(Path, argv):
        got = spread(op)
        if got is None:
            print(f"{op.name[:40]:<40} fewer than 2 repeat pairs")
            continue
        print(f"{op.name[:40]:<40} {got['rows']:4d} {got['repeats']:4d}  {got['b_over_a']:6.3f}  "
              f"{got['b_over_a_factored']:14.3f}  {got['between']:7.3f}  {got['within']:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
