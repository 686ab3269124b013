"""Pair rows of A runs with rows of B runs by (op, dtype, shape) and compare them.

Each side is a list of run dirs (its repeats). A row's latency per repeat is that run's median
candidate latency; with a single run per side (comparing two existing run dirs), the raw samples
of that run stand in for repeats. Rows whose timer fell back, whose replay fell back, whose
baseline and candidate were timed by different timers (FlagGems' `mixed`), whose measurement a
thermal or power slowdown hit (CLOCK_THROTTLED), or whose sides were timed by different timers are
kept and shown, but excluded from the headline. A row that failed on a side (a wrong result, a
crash) is kept too, flagged `failed_<side>` with its error. One slowdown is compared like for like instead: the
board's power cap on every repeat of both sides (CLOCK_THROTTLED kind=power_cap), which is how a
power-hungry kernel runs on that board, whichever compiler built it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from scipy import stats as sps

from backends.monitor import POWER_CAP, THROTTLE_MARKER
from reports import stats

TIMER_FALLBACK = "TIMER_FALLBACK"
REPLAY_FALLBACK = "AUTOTUNE_REPLAY_FALLBACK"
TIMER_MIXED = "TIMER_MIXED"
NO_DEVICE_WORK = "NO_DEVICE_WORK"
# A row's statuses that mean the operator broke on that side (SKIPPED is the op declining a case).
FAILED_STATUSES = ("FAILED", "ERROR")
# Verdicts of a row with no comparison.
FAILED, UNPAIRED = "FAILED", "UNPAIRED"
# The margin of a row compared from one run per side (3%): the samples of one process each measure
# nothing of how two processes of the same build differ (clocks, placement, code layout); run an A/A
# (the same compiler screened twice) to see that on your machine (README, Corpus report).
SINGLE_RUN_MARGIN = 0.03


@dataclasses.dataclass
class PairedRow:
    op: str
    dtype: str
    shape: tuple
    a_ms: list[float]
    b_ms: list[float]
    a_control_ms: list[float]
    b_control_ms: list[float]
    timers: set[str]
    flags: list[str]
    configs_a: dict
    configs_b: dict
    comparison: stats.Comparison | None = None
    # Per side ("a", "b"): the slowdowns named by its CLOCK_THROTTLED markers, over its repeats.
    throttled: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    # Per side: the first successful run's per-kernel attribution (results.json `kernels`), if profiled.
    kernels: dict[str, list[dict]] = dataclasses.field(default_factory=dict)
    # Per side whose row failed in some run (FAILED or ERROR): the first line of its first error.
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    # One run per side: the latencies are one process's raw samples, not repeats.
    single: bool = False
    # Per side: repeats left out of the comparison as outliers (stats.drop_outliers).
    dropped: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.op} {self.dtype} {'x'.join(map(str, self.shape))}"

    @property
    def key(self) -> tuple:
        return (self.op, self.dtype, self.shape)

    @property
    def verdict(self) -> str:
        """The comparison's verdict; without one, FAILED where a side's row failed, else UNPAIRED."""
        if self.comparison is not None:
            return self.comparison.verdict
        return FAILED if self.errors else UNPAIRED

    @property
    def in_headline(self) -> bool:
        return self.comparison is not None and not self.flags

    @property
    def config_differs(self) -> bool:
        return bool(self.configs_a) and bool(self.configs_b) and self.configs_a != self.configs_b


def load_rows(run_dir: Path) -> dict[tuple, dict]:
    data = json.loads((Path(run_dir) / "results.json").read_text())
    return {(r["op"], r["dtype"], tuple(r["shape"] or ())): r for r in data["rows"]}


def _flags(rows: list[dict]) -> list[str]:
    flags = set()
    for r in rows:
        markers = r.get("markers") or []
        if any(m.startswith(TIMER_FALLBACK) for m in markers):
            flags.add("timer_fallback")
        if any(m.startswith(REPLAY_FALLBACK) for m in markers):
            flags.add("replay_fallback")
        if any(m.startswith(TIMER_MIXED) for m in markers):
            flags.add("timer_mixed")
        # The side under test launched nothing: no compiler output to compare (the baseline's
        # emptiness only affects the control).
        if any(m.startswith(NO_DEVICE_WORK) and "side=baseline" not in m for m in markers):
            flags.add("no_device_work")
    return sorted(flags)


def _throttles(row: dict) -> list[dict]:
    """The fields of a row's CLOCK_THROTTLED markers ("CLOCK_THROTTLED reasons=a,b kind=k ...")."""
    return [dict(f.split("=", 1) for f in m.split()[1:] if "=" in f)
            for m in row.get("markers") or [] if m.startswith(THROTTLE_MARKER)]


def _slowdowns(rows: list[dict]) -> list[str]:
    """The reasons of a side's CLOCK_THROTTLED markers."""
    return sorted({reason for r in rows for fields in _throttles(r)
                   for reason in fields.get("reasons", "?").split(",")})


def _throttled_unlike(rows: list[dict]) -> bool:
    """Whether slowdowns make the row's sides unlike: any slowdown but the power cap (or a marker
    without a kind), or a power cap that hit some repeats and spared others."""
    hits = [_throttles(r) for r in rows]
    if not any(hits):
        return False
    return not all(hits) or any(fields.get("kind") != POWER_CAP for hit in hits for fields in hit)


def _first_line(error: str | None) -> str:
    lines = (error or "").strip().splitlines()
    return lines[0][:200] if lines else "no error text recorded"


def _latencies(rows: list[dict], side: str, single: bool) -> list[float]:
    """Per-repeat medians; a single run's raw samples when there is only one run per side."""
    if single and rows and rows[0].get("samples"):
        return list(rows[0]["samples"][side]["raw"])
    return [r[f"{side}_ms"] for r in rows]


def pair(a_runs: list[Path], b_runs: list[Path], expected: int | None = None,
         performance: bool = True) -> list[PairedRow]:
    """Rows of both sides paired by (op, dtype, shape). `expected`: repeats planned per side;
    a row with fewer successful runs on a side is flagged incomplete (default: the runs given).
    `performance`: whether the timings are performance numbers; if not, every verdict is n/a."""
    side_rows = {"a": [load_rows(d) for d in a_runs], "b": [load_rows(d) for d in b_runs]}
    single = len(a_runs) == 1 and len(b_runs) == 1
    keys = list(dict.fromkeys(k for runs in side_rows.values() for rows in runs for k in rows))
    paired = []
    for key in keys:
        got = {s: [rows[key] for rows in runs if key in rows] for s, runs in side_rows.items()}
        want = {"a": expected or len(a_runs), "b": expected or len(b_runs)}
        if all(len(rs) == want[s] and all(r["status"] == "SKIPPED" for r in rs) for s, rs in got.items()):
            # Declined by the op (or the backend) in every run of both sides: nothing was measured to
            # compare, and nothing is missing from the pairing.
            continue
        ok = {s: [r for r in rs if r["status"] == "SUCCESS"] for s, rs in got.items()}
        failed = {s: [r for r in rs if r["status"] in FAILED_STATUSES] for s, rs in got.items()}

        flags = _flags(ok["a"] + ok["b"])
        if _throttled_unlike(ok["a"] + ok["b"]):
            flags.append("clock_throttled")
        for side in ("a", "b"):
            if failed[side]:
                flags.append(f"failed_{side}({len(failed[side])}/{want[side]})")
            if len(ok[side]) < want[side]:
                flags.append(f"incomplete_{side}({len(ok[side])}/{want[side]})")
        timers = {r["timer"] for r in ok["a"] + ok["b"]}
        if len(timers) > 1:
            flags.append("timer_mismatch")
        row = PairedRow(
            op=key[0], dtype=key[1], shape=key[2],
            a_ms=_latencies(ok["a"], "candidate", single), b_ms=_latencies(ok["b"], "candidate", single),
            a_control_ms=_latencies(ok["a"], "baseline", single),
            b_control_ms=_latencies(ok["b"], "baseline", single),
            timers=timers, flags=flags,
            configs_a=ok["a"][0]["configs"] if ok["a"] else {}, configs_b=ok["b"][0]["configs"] if ok["b"] else {},
            throttled={s: _slowdowns(rs) for s, rs in ok.items() if _slowdowns(rs)},
            # The first run that profiled the row: an A/B's timing-only repeats carry none.
            kernels={s: next(r["kernels"] for r in rs if r.get("kernels")) for s, rs in ok.items()
                     if any(r.get("kernels") for r in rs)},
            errors={s: _first_line(rs[0].get("error")) for s, rs in failed.items() if rs}, single=single)
        if row.a_ms and row.b_ms:
            row.comparison = stats.compare(row.a_ms, row.b_ms, margin=SINGLE_RUN_MARGIN if single else stats.MARGIN)
            if not performance:
                row.comparison = dataclasses.replace(row.comparison, verdict=stats.NOT_APPLICABLE)
        paired.append(row)
    return paired


def judge(rows: list[PairedRow], fdr: float = stats.FDR) -> None:
    """The report's verdicts, over all its rows at once. Rows of repeats have their variance
    moderated by a prior learnt from the unflagged such rows (a throttled or incomplete row's spread
    is not the machine's), and every compared row's FASTER/SLOWER call must survive
    Benjamini-Hochberg at `fdr` over the report. A repeat far outside its row's prior is left out
    (stats.drop_outliers) and named in `dropped`. A row of one run per side compares raw samples of
    one process each: nothing measures the difference between processes, so its margin is
    SINGLE_RUN_MARGIN and its variance is its own."""
    judged = [r for r in rows if r.comparison is not None and r.comparison.verdict != stats.NOT_APPLICABLE]
    repeated = [r for r in judged if not r.single]
    pool = [r for r in repeated if not r.flags]
    variances, dofs = zip(*[stats.residual(r.a_ms, r.b_ms) for r in pool], strict=True) if pool else ((), ())
    model = stats.PriorModel(variances, dofs, [stats.center(r.a_ms) for r in pool])
    for r in judged:
        if r.single:
            r.comparison = stats.compare(r.a_ms, r.b_ms, margin=SINGLE_RUN_MARGIN)
            continue
        prior = model.at(stats.center(r.a_ms))
        (a, dropped_a), (b, dropped_b) = stats.drop_outliers(r.a_ms, prior), stats.drop_outliers(r.b_ms, prior)
        r.dropped = {side: x for side, x in (("a", dropped_a), ("b", dropped_b)) if x}
        r.comparison = stats.compare(a, b, prior)
    for r, c in zip(judged, stats.adjust([r.comparison for r in judged], fdr), strict=True):
        r.comparison = c


# Latency bands of the power table (upper bounds in ms; the last is open).
BANDS = ((0.005, "< 5 us"), (0.010, "5-10 us"), (0.030, "10-30 us"), (0.100, "30-100 us"), (1.0, "0.1-1 ms"),
         (math.inf, ">= 1 ms"))


def call_threshold(rows: list[PairedRow], fdr: float) -> float:
    """The p-value a further row would have needed to be called under Benjamini-Hochberg: fdr
    times (calls made + 1) over the rows judged."""
    judged = [r.comparison for r in rows if r.comparison is not None and r.comparison.q is not None]
    if not judged:
        return fdr
    calls = sum(1 for c in judged if c.verdict in (stats.FASTER, stats.SLOWER))
    return fdr * min(calls + 1, len(judged)) / len(judged)


def resolution(rows: list[PairedRow], fdr: float) -> list[dict]:
    """Per latency band of the headline rows: how many, the median smallest change they could have
    called (stats.detectable at this report's threshold), and the rows that could not have called a
    change of SAME_MARGIN."""
    alpha = call_threshold(rows, fdr)
    head = [r for r in rows if r.in_headline and r.comparison.q is not None]
    out, lower = [], 0.0
    for upper, label in BANDS:
        band = [r for r in head if lower <= stats.center(r.a_ms) < upper]
        lower = upper
        if not band:
            continue
        smallest = [stats.detectable(r.comparison, alpha) for r in band]
        out.append({"band": label, "rows": len(band), "detectable": float(np.median(smallest)),
                    "unresolved": [r.label for r, s in zip(band, smallest, strict=True) if s > stats.SAME_MARGIN]})
    return out


@dataclasses.dataclass
class Summary:
    rows: int
    headline_rows: int
    excluded: dict[str, int]
    verdicts: dict[str, int]
    overall: tuple[float, float, float]
    per_op: dict[str, tuple[float, float, float]]
    control: tuple[float, float, float]
    config_differs: int
    fdr: float = stats.FDR
    # resolution(): per latency band, what the headline rows could have called.
    resolution: list[dict] = dataclasses.field(default_factory=list)

    @property
    def calls(self) -> int:
        return self.verdicts.get(stats.FASTER, 0) + self.verdicts.get(stats.SLOWER, 0)

    def fdr_line(self) -> str:
        """How many of the headline's calls may be false, as the FDR promises."""
        return (f"FASTER/SLOWER calls: {self.calls}, at a false discovery rate of {self.fdr:g} (Benjamini-Hochberg "
                f"over the report's rows): about {self.calls * self.fdr:.1f} of them may be false")

    def resolution_lines(self) -> list[str]:
        """The power table in words: 'the smallest change callable, per latency band'."""
        if not self.resolution:
            return []
        bands = "; ".join(f"{b['detectable']:.1%} on {b['band']} rows ({b['rows']})" for b in self.resolution)
        lines = [f"smallest change callable (median per latency band, beyond the {stats.MARGIN:.1%} margin): {bands}"]
        unresolved = [name for b in self.resolution for name in b["unresolved"]]
        if unresolved:
            names = ", ".join(unresolved[:10]) + (", ..." if len(unresolved) > 10 else "")
            lines.append(f"rows that could not have called a {stats.SAME_MARGIN:.0%} change (too noisy at these "
                         f"repeats): {len(unresolved)} ({names})")
        return lines


def aggregate(comparisons: list[stats.Comparison]) -> tuple[float, float, float]:
    """Geometric mean of rows' B/A with a t interval over the rows; a lone row keeps its own
    interval (over its repeats): one row has no spread across rows, yet it is not exact."""
    if len(comparisons) == 1:
        c = comparisons[0]
        return c.ratio, c.lo, c.hi
    return stats.geomean([c.ratio for c in comparisons])


def summarize(rows: list[PairedRow], fdr: float = stats.FDR) -> Summary:
    head = [r for r in rows if r.in_headline]
    excluded = collections.Counter(f.split("(")[0] for r in rows for f in r.flags)
    no_pair = sum(1 for r in rows if r.comparison is None)
    if no_pair:
        excluded["unpaired"] = no_pair
    per_op = {op: aggregate([r.comparison for r in head if r.op == op]) for op in dict.fromkeys(r.op for r in head)}
    controls = [stats.compare(r.a_control_ms, r.b_control_ms) for r in head if r.a_control_ms and r.b_control_ms]
    return Summary(
        rows=len(rows), headline_rows=len(head), excluded=dict(excluded),
        verdicts=dict(collections.Counter(r.comparison.verdict for r in head)),
        overall=aggregate([r.comparison for r in head]), per_op=per_op,
        control=aggregate(controls), config_differs=sum(1 for r in rows if r.config_differs), fdr=fdr,
        resolution=resolution(rows, fdr))


def calibration(identical: list[PairedRow], calls: int, fdr: float) -> tuple[str, bool] | None:
    """The run's own A/A: the headline rows whose IR is byte-identical on both sides, and the calls
    among them. (line, alarming): alarming when more of them were called than the FDR lets a report
    of `calls` calls get wrong (the 95% point of Binomial(calls, fdr)). None without such rows."""
    if not identical:
        return None
    wrong = sum(1 for r in identical if r.verdict in (stats.FASTER, stats.SLOWER))
    allowed = int(sps.binom.ppf(0.95, calls, fdr)) if calls else 0
    line = (f"rows whose IR is identical on both sides (the run's own A/A): {len(identical)}, called "
            f"FASTER/SLOWER: {wrong}")
    if wrong > allowed:
        return (f"{line}: more than the {fdr:g} FDR allows of {calls} calls (at most {allowed}): the noise is "
                "larger than the model says (or the change lies below the IR)"), True
    return line, False
