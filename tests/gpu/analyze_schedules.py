"""What sequential schedules would have called, and at how many repeats, on rows a GPU timed: offline, from an
A/B run at fixed repeats (not collected by pytest; no GPU needed):

    python3 tests/gpu/analyze_schedules.py AB_DIR [--fixed 5] [--band 2:10] [--schedule FIRST:CAP:SHAPE ...]

AB_DIR is an A/B's dir whose repeats are at least the largest cap weighed (say `nox -s ab --
tests/gpu/sensitivity/aa.yaml --repeats 12`). Every op's rows are judged as the report judges them: at
fixed repeats cut to their first N (`--fixed`), and under each schedule look by look on the rows' first
repeats, as a sequential A/B's runner and report would have seen them (reports.sequential.judge). SHAPE
is the alpha spending function: `obf` (O'Brien-Fleming type, the rule's own) or `hsd:GAMMA` (Hwang, Shih
& DeCani 1990, Statistics in Medicine 9:1439: alpha(t) = a (1 - exp(-GAMMA t)) / (1 - exp(-GAMMA)); -4
near O'Brien-Fleming's shape, 0 spending alike at every look). FIRST may be 2 here, which the rule itself
refuses (it needs 3): what is weighed is whether it should. Prints per schedule the rows called FASTER
or SLOWER, SAME, the mean repeats per side and their share of fixed N's, and how many rows of a latency band
(`--band`, 2-10 us) resolved the schedule's resolve size (1%: called, or SAME within it), so a schedule is chosen by the
GPU's own noise rather than by the simulation's (tests/test_sequential_simulation.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_dirs import op_dirs, timed_runs  # noqa: E402

from reports import compare, sequential, stats  # noqa: E402

DEFAULT_SCHEDULES = ("3:12:obf", "3:12:hsd:-4", "3:12:hsd:-2", "3:12:hsd:0", "2:12:obf", "2:12:hsd:-2",
                     "2:12:hsd:0", "3:8:obf")


@dataclasses.dataclass(frozen=True)
class Weighed(sequential.Schedule):
    """A schedule under study: its spending function's shape given (None: the rule's own), a first look
    at 2 allowed."""

    gamma: float | None = None

    def __post_init__(self):
        if not 2 <= self.first <= self.cap:
            raise ValueError(f"need 2 <= first ({self.first}) <= cap ({self.cap})")

    @functools.cached_property
    def _weights(self) -> dict[int, float]:
        if self.gamma is None:
            return super()._weights
        t = np.array(self.spending(), dtype=float) / self.cap
        spent = t if self.gamma == 0 else (1 - np.exp(-self.gamma * t)) / (1 - np.exp(-self.gamma))
        return dict(zip(self.spending(), np.diff(spent, prepend=0.0).tolist(), strict=True))


def parse_schedule(text: str) -> Weighed:
    first, cap, shape = text.split(":", 2)
    if shape == "obf":
        gamma = None
    elif shape.startswith("hsd:"):
        gamma = float(shape[4:])
    else:
        raise argparse.ArgumentTypeError(f"{text}: SHAPE is obf or hsd:GAMMA")
    return Weighed(first=int(first), cap=int(cap), gamma=gamma)


def op_runs(ab_dir: Path) -> dict[str, dict[str, list[Path]]]:
    """Each op's timed repeats per side, in repeat order."""
    return {op_dir.name: {side: timed_runs(op_dir, side) for side in ("A", "B")} for op_dir in op_dirs(ab_dir)}


def rows_of(runs: dict[str, dict[str, list[Path]]]) -> list[compare.PairedRow]:
    return [r for sides in runs.values() for r in compare.pair(sides["A"], sides["B"])]


def tally(rows: list[compare.PairedRow], fixed: int, band_ms: tuple[float, float]) -> dict:
    judged = [r for r in rows if r.comparison is not None and r.comparison.q is not None]
    repeats = [r.sequential.repeats if r.sequential else fixed for r in judged]
    banded = [r for r in judged if band_ms[0] <= stats.center(r.a_ms) < band_ms[1]]
    return {"rows": len(judged), "called": sum(r.verdict in (stats.FASTER, stats.SLOWER) for r in judged),
            "same": sum(r.verdict == stats.SAME for r in judged),
            "repeats": float(np.mean(repeats)) if repeats else float("nan"),
            "banded": len(banded), "resolved": sum(1 for r in banded if r.sequential and r.sequential.resolved)}


def band_us(text: str) -> tuple[float, float]:
    low, high = text.split(":")
    return float(low) / 1000, float(high) / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ab_dir", type=Path)
    parser.add_argument("--fixed", type=int, default=5, help="the fixed repeats compared against (default 5)")
    parser.add_argument("--band", type=band_us, default=(0.002, 0.010), metavar="LO_US:HI_US",
                        help="the latency band whose rows' resolution is counted (default 2:10, the rows issue 46 "
                             "asks to resolve 1% at a cap of 12)")
    parser.add_argument("--schedule", type=parse_schedule, action="append",
                        help=f"FIRST:CAP:SHAPE, repeatable (default: {' '.join(DEFAULT_SCHEDULES)})")
    args = parser.parse_args(argv)
    schedules = args.schedule or [parse_schedule(s) for s in DEFAULT_SCHEDULES]
    runs = op_runs(args.ab_dir)
    have = min((len(sides[s]) for sides in runs.values() for s in ("A", "B")), default=0)
    if not runs or have < max([args.fixed, *(s.cap for s in schedules)]):
        print(f"{args.ab_dir}: {have} repeats a side in its op dirs; the largest cap or --fixed needs more")
        return 2
    fixed_rows = [sequential._cut(r, args.fixed) for r in rows_of(runs)]
    compare.judge(fixed_rows)
    base = tally(fixed_rows, args.fixed, args.band)
    print(f"{args.ab_dir}: {len(runs)} op(s), {base['rows']} rows judged, {have} repeats a side")
    print(f"fixed {args.fixed}: called {base['called']}, SAME {base['same']}")
    band = f"{args.band[0] * 1000:g}-{args.band[1] * 1000:g} us"
    for schedule in schedules:
        rows = rows_of(runs)  # judged afresh: judging fills in each row's verdict
        sequential.judge(rows, schedule=schedule)
        got = tally(rows, args.fixed, args.band)
        shape = "obf" if schedule.gamma is None else f"hsd:{schedule.gamma:g}"
        weights = ", ".join(f"{n}: {schedule.weight(n):.3f}" for n in schedule.spending())
        print(f"{schedule.first}:{schedule.cap}:{shape} (looks {weights}): called {got['called']}, SAME "
              f"{got['same']}, {got['repeats']:.2f} repeats a side ({got['repeats'] / args.fixed:.0%} of fixed "
              f"{args.fixed}'s); rows of {band}: {got['resolved']} of {got['banded']} resolved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
