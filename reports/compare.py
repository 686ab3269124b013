"""Pair rows of A runs with rows of B runs by (op, dtype, shape) and compare them.

Each side is a list of run dirs (its repeats). A row's latency per repeat is that run's median
candidate latency; with a single run per side (comparing two existing run dirs), the raw samples
of that run stand in for repeats. Rows whose timer fell back, whose replay fell back, whose
baseline and candidate were timed by different timers (FlagGems' `mixed`), whose measurement a
thermal or power slowdown hit (CLOCK_THROTTLED), or whose sides were timed by different timers are
kept and shown, but excluded from the headline. A row that failed on a side (a wrong result, a
crash) is kept too, flagged `failed_<side>` with its error. One slowdown is compared like for like instead: the
board's power cap on every repeat of a side (CLOCK_THROTTLED kind=power_cap), which is how a
power-hungry kernel runs on that board: one side's kernel may draw enough to hit it and the other's
not (tf32 mma against IEEE fp32 FMAs), and that is part of the change.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from backends.monitor import POWER_CAP, THROTTLE_MARKER
from harness.core.results import ResultRow, read_results
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
# (the same compiler screened twice) to see that on your machine (docs/verdicts.md, One run per side).
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
    # Per side: the run dir (the process) each latency of a_ms / b_ms came from; empty for a single run.
    a_procs: list[str] = dataclasses.field(default_factory=list)
    b_procs: list[str] = dataclasses.field(default_factory=list)
    # How much of its processes' speed factor was taken out of its latencies (process_factors); None: none.
    process_factor: float | None = None
    # A sequential A/B (reports.sequential): where the row stopped, at how many repeats, and why.
    sequential: Any = None  # a reports.sequential.Settlement (that module builds on this one)

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


def load_rows(run_dir: Path) -> dict[tuple, ResultRow]:
    """A run's rows by key (ResultRow.key); ResultsError where its results.json does not read."""
    return {r.key: r for r in read_results(run_dir)}


def _flags(rows: list[ResultRow]) -> list[str]:
    flags = set()
    for r in rows:
        markers = r.markers
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


def _throttles(row: ResultRow) -> list[dict]:
    """The fields of a row's CLOCK_THROTTLED markers ("CLOCK_THROTTLED reasons=a,b kind=k ...")."""
    return [dict(f.split("=", 1) for f in m.split()[1:] if "=" in f)
            for m in row.markers if m.startswith(THROTTLE_MARKER)]


def _slowdowns(rows: list[ResultRow]) -> list[str]:
    """The reasons of a side's CLOCK_THROTTLED markers."""
    return sorted({reason for r in rows for fields in _throttles(r)
                   for reason in fields.get("reasons", "?").split(",")})


def _throttled_unlike(sides: list[list[ResultRow]]) -> bool:
    """Whether slowdowns make a row's repeats unlike: any slowdown but the power cap (or a marker
    without a kind), or a power cap that hit some repeats of a side and spared others of it."""
    for rows in sides:
        hits = [_throttles(r) for r in rows]
        if any(hits) and not all(hits):
            return True
        if any(fields.get("kind") != POWER_CAP for hit in hits for fields in hit):
            return True
    return False


def _first_line(error: str | None) -> str:
    lines = (error or "").strip().splitlines()
    return lines[0][:200] if lines else "no error text recorded"


def _latencies(rows: list[ResultRow], side: str, single: bool) -> list[float]:
    """Per-repeat medians; a single run's raw samples when there is only one run per side. None for the
    baseline where a run did not time it (a timing-only replay times it only where a process factor reads
    it: control_cases): a row's control is all of its runs' or none."""
    if single and rows and rows[0].samples:
        summary = rows[0].samples.get(side)
        return list(summary["raw"]) if summary else []
    values = [r.candidate_ms if side == "candidate" else r.baseline_ms for r in rows]
    return [] if side == "baseline" and any(v is None for v in values) else values


def passes_key(side: str) -> str:
    """An A/B's key (in its runs per op, and its step dir) for the untimed run that carried a side's
    one-off passes: IR and per-kernel attribution."""
    return f"{side}-passes"


def profiled_run(runs: dict[str, list[Path]], side: str) -> Path | None:
    """The run whose IR and kernels stand for a side of one op's A/B: its passes run, or, where every
    step profiled (no passes run), its first repeat."""
    return next(iter(runs.get(passes_key(side)) or runs.get(side) or []), None)


def profiled_runs(runs: dict[str, list[Path]]) -> tuple[Path | None, Path | None]:
    """(A's, B's) profiled_run: the runs an op's IR and kernels are compared between."""
    return profiled_run(runs, "A"), profiled_run(runs, "B")


def _kernels(rows: list[ResultRow | None]) -> list[dict] | None:
    """The per-kernel attribution of the first successful row that carries one."""
    return next((r.kernels for r in rows if r and r.status == "SUCCESS" and r.kernels), None)


def pair(a_runs: list[Path], b_runs: list[Path], expected: int | None = None,
         performance: bool = True, profiled: tuple[Path | None, Path | None] = (None, None)) -> list[PairedRow]:
    """Rows of both sides paired by (op, dtype, shape). `expected`: repeats planned per side;
    a row with fewer successful runs on a side is flagged incomplete (default: the runs given).
    `performance`: whether the timings are performance numbers; if not, every verdict is n/a.
    `profiled`: each side's untimed passes run, where its rows' kernels come from (the timed runs'
    own, where they profiled, otherwise)."""
    side_rows = {"a": [(str(d), load_rows(d)) for d in a_runs], "b": [(str(d), load_rows(d)) for d in b_runs]}
    profiled_rows = {s: load_rows(d) if d is not None else {} for s, d in zip("ab", profiled, strict=True)}
    # Raw samples stand in for repeats only where one run a side is all there was to be: an A/B that planned
    # repeats and was stopped after its first has one repeat a side, whose samples say nothing of the spread
    # between processes (an H100 A/B of bincount stopped so: 0.65x-1.21x on rows of identical IR).
    single = len(a_runs) == 1 and len(b_runs) == 1 and (expected or 1) == 1
    keys = list(dict.fromkeys(k for runs in side_rows.values() for _, rows in runs for k in rows))
    paired = []
    for key in keys:
        got = {s: [rows[key] for _, rows in runs if key in rows] for s, runs in side_rows.items()}
        procs = {s: [d for d, rows in runs if key in rows and rows[key].status == "SUCCESS"]
                 for s, runs in side_rows.items()}
        want = {"a": expected or len(a_runs), "b": expected or len(b_runs)}
        if all(len(rs) == want[s] and all(r.status == "SKIPPED" for r in rs) for s, rs in got.items()):
            # Declined by the op (or the backend) in every run of both sides: nothing was measured to
            # compare, and nothing is missing from the pairing.
            continue
        ok = {s: [r for r in rs if r.status == "SUCCESS"] for s, rs in got.items()}
        failed = {s: [r for r in rs if r.status in FAILED_STATUSES] for s, rs in got.items()}

        flags = _flags(ok["a"] + ok["b"])
        if _throttled_unlike([ok["a"], ok["b"]]):
            flags.append("clock_throttled")
        for side in ("a", "b"):
            if failed[side]:
                flags.append(f"failed_{side}({len(failed[side])}/{want[side]})")
            if len(ok[side]) < want[side]:
                flags.append(f"incomplete_{side}({len(ok[side])}/{want[side]})")
        timers = {r.timer for r in ok["a"] + ok["b"]}
        if len(timers) > 1:
            flags.append("timer_mismatch")
        row = PairedRow(
            op=key[0], dtype=key[1], shape=key[2],
            a_ms=_latencies(ok["a"], "candidate", single), b_ms=_latencies(ok["b"], "candidate", single),
            a_control_ms=_latencies(ok["a"], "baseline", single),
            b_control_ms=_latencies(ok["b"], "baseline", single),
            timers=timers, flags=flags,
            configs_a=ok["a"][0].configs if ok["a"] else {}, configs_b=ok["b"][0].configs if ok["b"] else {},
            throttled={s: _slowdowns(rs) for s, rs in ok.items() if _slowdowns(rs)},
            # The side's passes run first, then its timed runs: an A/B's timing-only repeats carry none.
            kernels={s: found for s in ok if (found := _kernels([profiled_rows[s].get(key), *ok[s]]))},
            errors={s: _first_line(rs[0].error) for s, rs in failed.items() if rs}, single=single,
            a_procs=[] if single else procs["a"], b_procs=[] if single else procs["b"])
        if row.a_ms and row.b_ms:
            row.comparison = stats.compare(row.a_ms, row.b_ms, margin=SINGLE_RUN_MARGIN if single else stats.MARGIN)
            if not performance:
                row.comparison = dataclasses.replace(row.comparison, verdict=stats.NOT_APPLICABLE)
        paired.append(row)
    return paired


# Latency bands of the power table (upper bounds in ms; the last is open).
BANDS = ((0.005, "< 5 us"), (0.010, "5-10 us"), (0.030, "10-30 us"), (0.100, "30-100 us"), (1.0, "0.1-1 ms"),
         (math.inf, ">= 1 ms"))


def band(latency_ms: float) -> str:
    """The label of the latency band a latency falls in."""
    return next(label for upper, label in BANDS if latency_ms < upper)


# Every kernel a process times runs a little faster or slower with that process (its clocks, where its
# memory landed): on an H200, the replays of a copy kernel moved together by up to 0.6% per process,
# and torch's own copy, timed in the same processes, moved with them (correlation 0.95). The torch
# baseline measures that factor: it is timed beside the candidate, and the compiler under test does
# not move it. Estimating it needs this many rows with a baseline in every process of their op.
MIN_FACTOR_ROWS = 4
# Below this p the baseline moved between the sides by more than its processes did (_baseline_moved): such a band
# keeps its latencies (a side that moved torch itself: B's own `python:`). The test cannot tell that from
# processes whose factors differ between the sides by chance, and there the candidates, which follow their
# processes, differ as much: at p 0.05, seeded null reports (10 ops of 10-20 rows, 3 repeats) called something
# 7-11% of the time, 0 with the true factors taken out; at 0.01, 2-5%; at 0.001, 0 (tests/test_verdict_simulation.py).
# A side's own move of torch under what this p detects is taken out with the factor.
BASELINE_MOVED_P = 0.001


# A timing-only replay (an A/B's repeat) times the torch baseline only where process_factors can read it
# (control_cases): a band's factor is a median over its rows, and a band of fewer than MIN_FACTOR_ROWS
# rows takes none. Up to this many rows a band, spread over its latencies, and every row near a band's edge,
# whose band in the report (by its repeats' latency) may not be its record's. Re-judged offline with 8 a band,
# apply_rotary_pos_emb's 15-row band read 4-10% wider intervals (median) than with all 15 on two H200 runs; with
# 12, 1-3% (docs/performance.md, "The torch baseline in every repeat").
CONTROLS_PER_BAND = 12
BAND_EDGE = 0.15  # relative distance to an edge within which a row keeps its baseline whatever its band


def control_cases(rows: list[ResultRow]) -> set[str]:
    """The cases of a record (its rows) whose torch baselines its timing-only replays time: in each latency
    band (by the record's candidate latency) of at least MIN_FACTOR_ROWS rows timed with a baseline, up to
    CONTROLS_PER_BAND of them, spread over the band's latencies, and every such row within BAND_EDGE of a
    band's edge. The rest are rows no process factor reads: half of each one's timing, for a baseline the
    report would only print."""
    timed = [r for r in rows if r.status == "SUCCESS" and r.case and r.candidate_ms and r.baseline_ms
             and r.candidate_ms > 0]
    edges = [upper for upper, _ in BANDS if math.isfinite(upper)]
    chosen = {r.case for r in timed
              if any(abs(math.log(r.candidate_ms / edge)) < math.log1p(BAND_EDGE) for edge in edges)}
    by_band: dict[str, list[ResultRow]] = collections.defaultdict(list)
    for r in timed:
        by_band[band(r.candidate_ms)].append(r)
    for members in by_band.values():
        if len(members) < MIN_FACTOR_ROWS:
            continue
        members.sort(key=lambda r: r.candidate_ms)
        chosen.update(members[i].case for i in spread(len(members), CONTROLS_PER_BAND))
    return chosen


def spread(n: int, k: int) -> set[int]:
    """Up to k of the indices 0..n-1, evenly spread from the first to the last."""
    return set(np.linspace(0, n - 1, min(k, n)).round().astype(int).tolist())


def _processes(rows: list[PairedRow]) -> list[list[PairedRow]]:
    """The rows grouped by the processes they were timed in (an op's run dirs): rows that share
    any process are one group, also where a row failed in some of them."""
    parent: dict[str, str] = {}

    def root(p: str) -> str:
        while parent.setdefault(p, p) != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    timed = [r for r in rows if r.a_procs and r.b_procs]
    for r in timed:
        first, *rest = r.a_procs + r.b_procs
        for p in rest:
            parent[root(p)] = root(first)
    groups: dict[str, list[PairedRow]] = collections.defaultdict(list)
    for r in timed:
        groups[root(r.a_procs[0])].append(r)
    return list(groups.values())


def _in_order(r: PairedRow, a: list[float], b: list[float], procs: list[str]) -> list[float]:
    """A row's values of both sides, per process, in the order of `procs`."""
    by_proc = dict(zip(r.a_procs + r.b_procs, a + b, strict=True))
    return [by_proc[p] for p in procs]


def _within_sides(m: np.ndarray, n_a: int) -> np.ndarray:
    """Log latencies (rows x processes, A's first) less each side's mean: no A/B change is left in them."""
    return np.concatenate([m[..., :n_a] - m[..., :n_a].mean(-1, keepdims=True),
                           m[..., n_a:] - m[..., n_a:].mean(-1, keepdims=True)], -1)


def process_factors(rows: list[PairedRow]) -> dict[tuple[str, str], float]:
    """Per process (run dir) and latency band: the log speed factor to take out of the candidate
    latencies it timed. Per op (rows timed in the same processes) and band (a few-us kernel, bound by
    its launch, need not move with its process as a 0.5 ms copy does): a process's offset is the
    median over the rows of its baseline's log latency less that row's mean over every process of
    both sides; how strongly the candidates follow the offsets (beta, at least 0) is fitted on the
    deviations within each side, which hold no A/B change, each row weighted by its noise (a row
    quieter than the median counts as the median: a lucky row does not steer beta). Sets each
    adjusted row's process_factor to its beta. Rows of a band with fewer than MIN_FACTOR_ROWS rows
    complete with baselines, or under 2 processes a side, keep their latencies, and so do those
    whose baseline a side moved (_baseline_moved)."""
    factors: dict[tuple[str, str], float] = {}
    for group in _processes(rows):
        a_procs = sorted({p for r in group for p in r.a_procs})
        b_procs = sorted({p for r in group for p in r.b_procs})
        if len(a_procs) < 2 or len(b_procs) < 2:
            continue
        by_band = collections.defaultdict(list)
        for r in group:
            by_band[band(stats.center(r.a_ms))].append(r)
        for label, members in by_band.items():
            full = [r for r in members if sorted(r.a_procs) == a_procs and sorted(r.b_procs) == b_procs
                    and len(r.a_control_ms) == len(a_procs) and len(r.b_control_ms) == len(b_procs)
                    and all(x is not None and x > 0 for x in r.a_control_ms + r.b_control_ms)]
            if len(full) < MIN_FACTOR_ROWS:
                continue
            beta, offset = _fit_factor(full, a_procs, b_procs)
            if _baseline_moved(offset[:len(a_procs)], offset[len(a_procs):]):
                continue
            factors.update({(p, label): x for p, x in zip(a_procs + b_procs, (beta * offset).tolist(), strict=True)})
            for r in members:
                r.process_factor = beta
    return factors


def _baseline_moved(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the sides' processes' baseline offsets differ by more than their spread within a side
    explains (t test at BASELINE_MOVED_P): a side with its own torch (its own `python:`), or an
    environment that torch reads, moved the baseline itself, and then its move is no process's."""
    from scipy.stats import ttest_ind  # on first use, as reports.stats imports scipy

    spread = float(np.square(a - a.mean()).sum() + np.square(b - b.mean()).sum()) / (a.size + b.size - 2)
    if spread <= stats.MIN_VARIANCE:
        return abs(float(b.mean() - a.mean())) > math.sqrt(stats.MIN_VARIANCE)  # no spread to explain it
    return float(ttest_ind(b, a).pvalue) < BASELINE_MOVED_P


def _fit_factor(full: list[PairedRow], a_procs: list[str], b_procs: list[str]) -> tuple[float, np.ndarray]:
    """(beta, the processes' log offsets, A's first): see process_factors."""
    order = a_procs + b_procs
    control = np.log([_in_order(r, r.a_control_ms, r.b_control_ms, order) for r in full])
    offset = np.median(control - control.mean(axis=1, keepdims=True), axis=0)
    dev = _within_sides(np.log([_in_order(r, r.a_ms, r.b_ms, order) for r in full]), len(a_procs))
    follows = _within_sides(offset, len(a_procs))
    noise = (dev ** 2).mean(axis=1)
    weight = 1 / np.maximum(noise, max(float(np.median(noise)), stats.MIN_VARIANCE))
    scale = float(follows @ follows)
    beta = max(0.0, float((weight * (dev @ follows)).sum() / (weight.sum() * scale))) if scale > 0 else 0.0
    return beta, offset


def factor_line(rows: list[PairedRow]) -> str | None:
    """The headline's word on process_factors: how many rows had their processes' factor taken out."""
    adjusted = [r for r in rows if r.process_factor is not None]
    if not adjusted:
        return None
    betas = sorted({r.process_factor for r in adjusted})
    return (f"process speed factor (each process's torch baseline) taken out of {len(adjusted)} of {len(rows)} rows; "
            f"how closely the candidates followed it: {betas[0]:.2f}" + (f"-{betas[-1]:.2f}" if len(betas) > 1 else ""))


def _adjusted(r: PairedRow, factors: dict[tuple[str, str], float]) -> tuple[list[float], list[float]]:
    """The row's latencies of both sides with its processes' factors taken out (as they are where
    the processes are unknown)."""
    if not (r.a_procs and r.b_procs):
        return r.a_ms, r.b_ms
    label = band(stats.center(r.a_ms))
    return tuple([x * math.exp(-factors.get((p, label), 0.0)) for x, p in zip(ms, procs, strict=True)]
                 for ms, procs in ((r.a_ms, r.a_procs), (r.b_ms, r.b_procs)))


def judge(rows: list[PairedRow], fdr: float = stats.FDR,
          prior: stats.PriorModel | None = None) -> stats.PriorModel:
    """The report's verdicts, over all its rows at once. Rows of repeats have their variance
    moderated by a prior learnt from the unflagged such rows (a throttled or incomplete row's spread
    is not the machine's), and every compared row's FASTER/SLOWER call must survive
    Benjamini-Hochberg at `fdr` over the report. A repeat far outside its row's prior is left out
    (stats.drop_outliers) and named in `dropped`. A row of one run per side compares raw samples of
    one process each: nothing measures the difference between processes, so its margin is
    SINGLE_RUN_MARGIN and its variance is its own. A sequential A/B is judged by
    reports.sequential.judge, which judges each of its looks by this function. `prior`:
    the model to moderate by where it was learnt elsewhere (a sequential A/B's first look, before
    any row stopped); returns the model used."""
    judged = [r for r in rows if r.comparison is not None and r.comparison.verdict != stats.NOT_APPLICABLE]
    repeated = [r for r in judged if not r.single]
    factors = process_factors(repeated)
    timed = {id(r): _adjusted(r, factors) for r in repeated}
    pool = [r for r in repeated if not r.flags]
    variances, dofs = zip(*[stats.residual(*timed[id(r)]) for r in pool], strict=True) if pool else ((), ())
    model = prior if prior is not None else stats.PriorModel(
        variances, dofs, [stats.center(timed[id(r)][0]) for r in pool])
    for r in judged:
        if r.single:
            r.comparison = stats.compare(r.a_ms, r.b_ms, margin=SINGLE_RUN_MARGIN)
            continue
        a_ms, b_ms = timed[id(r)]
        prior = model.at(stats.center(a_ms))
        (a, dropped_a), (b, dropped_b) = stats.drop_outliers(a_ms, prior), stats.drop_outliers(b_ms, prior)
        # Named as measured, before the process factor came out.
        sides = (("a", r.a_ms, a_ms, dropped_a), ("b", r.b_ms, b_ms, dropped_b))
        r.dropped = {side: [raw[adjusted.index(x)] for x in dropped]
                     for side, raw, adjusted, dropped in sides if dropped}
        r.comparison = stats.compare(a, b, prior)
    for r, c in zip(judged, stats.adjust([r.comparison for r in judged], fdr), strict=True):
        r.comparison = c
    return model


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
        # A sequential row's last interval spent its look's share of the error rate (reports.sequential).
        smallest = [stats.detectable(r.comparison, alpha * (r.sequential.share if r.sequential else 1.0)) for r in band]
        out.append({"band": label, "rows": len(band), "detectable": float(np.median(smallest)),
                    "unresolved": [r.label for r, s in zip(band, smallest, strict=True) if _unresolved(r, s)]})
        if any(r.sequential for r in band):
            out[-1]["repeats"] = float(np.mean([r.sequential.repeats for r in band]))
    return out


def _unresolved(r: PairedRow, smallest: float) -> bool:
    """Whether a row could not resolve the size asked: at fixed repeats, a change of SAME_MARGIN (its
    smallest callable change is larger); under sequential repeats, the --resolve size (neither called
    nor SAME at it by its last look)."""
    return not r.sequential.resolved if r.sequential else smallest > stats.SAME_MARGIN


def sequential_summary(rows: list[PairedRow]) -> dict | None:
    """Where the rows of a sequential A/B stopped: its looks, cap and resolve, the mean repeats per
    side its judged rows used, and how many stopped for each reason; None at fixed repeats."""
    settled = [r.sequential for r in rows if r.sequential is not None]
    if not settled:
        return None
    schedule = settled[0].schedule
    used = [s.repeats for s in settled if s.repeats]
    return {"looks": schedule.spending(), "cap": schedule.cap, "resolve": schedule.resolve,
            "repeats": float(np.mean(used)) if used else 0.0,
            "reasons": dict(collections.Counter(s.reason for s in settled))}


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
    # sequential_summary(): a sequential A/B's looks and where its rows stopped (None: fixed repeats).
    sequential: dict | None = None

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
            return self.sequential_lines()
        bands = "; ".join(f"{b['detectable']:.1%} on {b['band']} rows ({b['rows']}"
                          + (f", {b['repeats']:.1f} repeats" if "repeats" in b else "") + ")" for b in self.resolution)
        lines = [f"smallest change callable (median per latency band, beyond the {stats.MARGIN:.1%} margin): {bands}"]
        unresolved = [name for b in self.resolution for name in b["unresolved"]]
        if unresolved:
            names = ", ".join(unresolved[:10]) + (", ..." if len(unresolved) > 10 else "")
            lines.append(f"rows that could not have called a {stats.SAME_MARGIN:.0%} change (too noisy at these "
                         f"repeats): {len(unresolved)} ({names})" if self.sequential is None else
                         f"rows that could not resolve a {self.sequential['resolve']:.1%} change by the cap "
                         f"({self.sequential['cap']} repeats): {len(unresolved)} ({names})")
        return self.sequential_lines() + lines

    def sequential_lines(self) -> list[str]:
        """A sequential A/B's rule and where its rows stopped, in words."""
        if self.sequential is None:
            return []
        seq = self.sequential
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(seq["reasons"].items()))
        return [f"sequential repeats: looks at {', '.join(map(str, seq['looks']))} repeats per side (O'Brien-Fleming "
                f"alpha spending, Bonferroni over looks); rows used {seq['repeats']:.1f} repeats per side on average; "
                f"stopped: {reasons}; SAME means no change beyond {seq['resolve']:.1%} (--resolve)"]


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
        resolution=resolution(rows, fdr), sequential=sequential_summary(rows))


def calibration(identical: list[PairedRow], calls: int, fdr: float) -> tuple[str, bool] | None:
    """The run's own A/A: the headline rows whose IR is byte-identical on both sides, and the calls
    among them. (line, alarming): alarming when more of them were called than the FDR lets a report
    of `calls` calls get wrong (the 95% point of Binomial(calls, fdr)). None without such rows."""
    from scipy.stats import binom  # on first use, as reports.stats imports scipy

    if not identical:
        return None
    wrong = sum(1 for r in identical if r.verdict in (stats.FASTER, stats.SLOWER))
    allowed = int(binom.ppf(0.95, calls, fdr)) if calls else 0
    line = (f"rows whose IR is identical on both sides (the run's own A/A): {len(identical)}, called "
            f"FASTER/SLOWER: {wrong}")
    if wrong > allowed:
        return (f"{line}: more than the {fdr:g} FDR allows of {calls} calls (at most {allowed}): the noise is "
                "larger than the model says (or the change lies below the IR)"), True
    return line, False
