"""Sequential repeats: an A/B that looks at its rows as rounds of repeats come in and stops timing the
rows whose verdict is settled (`--repeats auto`, `--max-repeats`, `--resolve`).

Looking at the data and stopping when they look good inflates false calls unless the rule pays for
the looks. Here each look gets a fixed share of the error rate, set in advance by the Lan-DeMets
spending function of O'Brien-Fleming type (Lan & DeMets 1983, Biometrika 70:659; O'Brien & Fleming
1979, Biometrics 35:549), alpha(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t)) at the information fraction
t = n / cap: the look at n repeats per side gets the increment of alpha(t) there, normalized to sum
to 1 (`Schedule.weight`). Early looks, where a row's noise is known worst, get little; the cap gets
most. The looks are combined by the union bound (Bonferroni over looks), the construction behind the
always-valid p-values and confidence sequences of Johari et al. 2017 ("Peeking at A/B tests", KDD)
and Howard et al. 2021 (Ann. Statist. 49:1055), valid under any stopping: a row's sequential p-value
is p* = min over its looks of p_n / w_n, and P(p* <= a) <= sum_n P(p_n <= a w_n) <= a under no change
beyond the margin, wherever the row stops, since stopping only leaves looks out. Its interval is the
running intersection of its looks' intervals at level 1 - 0.05 w_n: with probability >= 95% all of
them cover the true ratio at once. The looks that spend are at doubling repeats (`Schedule.spending`).

A look at n is the ordinary judge (reports.compare.judge: process factors, moderated prior, outlier
drop) over the rows still open with n repeats per side, each cut to its first n: the repeats are
numbered by round, so every look is recomputed from the run dirs alone, and the runner (after each
round) and the report compute the same thing. FASTER/SLOWER: Benjamini-Hochberg at the report's FDR
over every row's p*. BH is monotone in the p-values and p* only falls as looks are added, so a row
called at a look stays called: it stops once called with its interval clear of the margin. It also
stops once its interval lies within 1 +/- resolve (SAME at the size the user cares about; the verdict
SAME then means that size), at the cap, where it cannot resolve that size even at the cap (futile),
or where it failed or is flagged.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from reports import compare, stats

OPEN, CALLED, SAME, CAP, FUTILE, FAILED, FLAGGED, NOT_APPLICABLE = (
    "open", "called", "same", "cap", "futile", "failed", "flagged", "n/a")
# Flags that say what a row's data is, not how many repeats it got (those are the schedule's).
_SHORT = "incomplete_"
# The error rate the spending function's shape is computed at (the weights serve every rate).
_SHAPE_ALPHA = 1 - stats.CONFIDENCE


@dataclasses.dataclass(frozen=True)
class Schedule:
    first: int = 3  # repeats per side in the first round (a variance needs >= 2; the rule needs 3)
    cap: int = 12  # --max-repeats
    resolve: float = stats.SAME_MARGIN  # --resolve X% as a fraction (0.01 for 1%)

    def __post_init__(self):
        if not 3 <= self.first <= self.cap:
            raise ValueError(f"sequential repeats need 3 <= first ({self.first}) <= cap ({self.cap})")
        if not stats.MARGIN < self.resolve < 1:
            raise ValueError(f"resolve {self.resolve:g}: must lie above the {stats.MARGIN:.1%} margin (a call "
                             "needs its interval clear of it) and below 1")

    @classmethod
    def from_plan(cls, plan: dict) -> Schedule | None:
        """The schedule of an A/B whose plan (ab.json `plan`) says `repeats: auto`; None for fixed repeats."""
        if plan.get("repeats") != "auto":
            return None
        return cls(first=int(plan.get("first", cls.first)), cap=int(plan["max_repeats"]),
                   resolve=float(plan.get("resolve", cls.resolve)))

    def looks(self) -> list[int]:
        """The repeats per side after each round, where the runner asks `settle`: first, first + 1, ..., cap."""
        return list(range(self.first, self.cap + 1))

    def spending(self) -> list[int]:
        """The looks that spend error rate: first, twice that, four times, ..., then cap; at the rounds
        between them nothing new is decided. The union bound pays for every look, however alike its
        data to the last one's, so a look every round leaves each too little: in the simulations, looks
        every round at a cap of 7 called fewer true 1% changes at the same GPU time than fixed 5
        repeats, looks at doubling repeats more (tests/test_sequential_simulation.py)."""
        out = [self.first]
        while out[-1] < self.cap:
            out.append(min(2 * out[-1], self.cap))
        return out

    @functools.cached_property
    def _weights(self) -> dict[int, float]:
        from scipy.stats import norm

        t = np.array(self.spending(), dtype=float) / self.cap
        spent = 2 * norm.sf(norm.isf(_SHAPE_ALPHA / 2) / np.sqrt(t))
        return dict(zip(self.spending(), (np.diff(spent, prepend=0.0) / spent[-1]).tolist(), strict=True))

    def weight(self, n: int) -> float:
        """The share of alpha spent at the look with n repeats per side (over the looks: sums to 1; 0
        between the spending looks)."""
        return self._weights.get(n, 0.0)


@dataclasses.dataclass
class Settlement:
    """Where a row stands under `schedule`: `reason` (OPEN or why it stopped), `repeats` per side at its
    last look, `share` the weight of that look (w_n: its interval there is at level 1 - 0.05 w_n)."""
    reason: str
    schedule: Schedule
    repeats: int = 0
    share: float = 1.0
    p: float = 1.0  # p*: min over its looks of p_n / w_n
    lo: float = 0.0  # the running intersection of its looks' intervals
    hi: float = math.inf
    q: float | None = None  # BH over every judged row's p* (None: not judged)
    futile: bool = False  # _futile at its last look
    last: compare.PairedRow | None = dataclasses.field(default=None, repr=False)  # its data at its last look

    @property
    def resolved(self) -> bool:
        return self.reason in (CALLED, SAME)

    def to_json(self) -> dict:
        """The row's report.json `sequential`: why and where it stopped, its p* and its last look's share."""
        return {"reason": self.reason, "repeats": self.repeats, "share": self.share, "p_star": self.p}


def _count(r: compare.PairedRow) -> int:
    """Repeats per side a row has (both sides: a look needs them on each)."""
    return 0 if r.single else min(len(r.a_ms), len(r.b_ms))


def _terminal(r: compare.PairedRow) -> str | None:
    """Why a row stops whatever its data say: n/a, failed, flagged (a flag more repeats do not lift)."""
    if r.comparison is not None and r.comparison.verdict == stats.NOT_APPLICABLE:
        return NOT_APPLICABLE
    if r.comparison is None or r.errors or r.single:
        return FAILED
    if any(not f.startswith(_SHORT) for f in r.flags):
        return FLAGGED
    return None


def _cut(r: compare.PairedRow, n: int) -> compare.PairedRow:
    """The row as its first n repeats per side left it."""
    return dataclasses.replace(
        r, a_ms=r.a_ms[:n], b_ms=r.b_ms[:n], a_control_ms=r.a_control_ms[:n], b_control_ms=r.b_control_ms[:n],
        a_procs=r.a_procs[:n], b_procs=r.b_procs[:n], flags=[f for f in r.flags if not f.startswith(_SHORT)],
        dropped={}, process_factor=None)


def _clears(lo: float, hi: float) -> bool:
    return hi < 1 - stats.MARGIN or lo > 1 + stats.MARGIN


def _futile(c: stats.Comparison, sd: float, n: int, schedule: Schedule) -> bool:
    """Whether the row cannot resolve the size asked even at the cap: at a repeat noise of `sd`, its
    interval there (at the cap's share) would be wider than 1 +/- resolve, so neither SAME nor a call
    of a change of that size, and its estimate is not so large that a call is in sight. A 1-4 us row
    whose repeats vary by 2% cannot resolve 1% in 12 repeats; timing it on to the cap buys nothing
    (and stopping never costs validity: it leaves looks out)."""
    from scipy.stats import t as student

    dof = c.dof + 2 * (schedule.cap - n)
    half = float(student.isf(_SHAPE_ALPHA * schedule.weight(schedule.cap) / 2, dof)) * sd * math.sqrt(
        2 / schedule.cap)
    return half > math.log1p(schedule.resolve) and abs(math.log(c.ratio)) - half <= math.log1p(stats.MARGIN)


def _look(looked: list[compare.PairedRow], n: int, schedule: Schedule, states: dict,
          prior: stats.PriorModel | None) -> stats.PriorModel:
    """Judge the rows at look n by `prior` (None: learn it from them) and fold each one's look into its
    p* and running interval; returns the prior used."""
    from scipy.stats import t as student

    prior = compare.judge(looked, fdr=1.0, prior=prior)  # the calls are BH over p*, made by the caller
    w = schedule.weight(n)
    for r in looked:
        c, s = r.comparison, states[r.key]
        s.repeats, s.share, s.last = n, w, r
        if c.dof == 0:
            continue
        se = c.sd * math.sqrt(1 / c.n_a + 1 / c.n_b)
        half = float(student.isf(_SHAPE_ALPHA * w / 2, c.dof)) * se
        lo, hi = c.ratio * math.exp(-half), c.ratio * math.exp(half)
        s.p = min(s.p, c.p / w, 1.0)
        # The noise projected to the cap is its latency band's (the prior's): a row's own at 3 repeats
        # may hold an outlier that a later look drops.
        band = prior.at(stats.center(r.a_ms))
        s.futile = _futile(c, math.sqrt(band.variance) if band.dof > 0 else c.sd, n, schedule)
        # Disjoint looks: one of them missed already (under 5% of rows, by the union bound), and the
        # latest look's interval, valid alone, stands.
        s.lo, s.hi = (max(s.lo, lo), min(s.hi, hi)) if max(s.lo, lo) <= min(s.hi, hi) else (lo, hi)
    return prior


def replay(rows: list[compare.PairedRow], schedule: Schedule, fdr: float) -> dict[tuple, Settlement]:
    """Every look the rows' data reach, in order: each row's Settlement, by row key."""
    states = {r.key: Settlement(_terminal(r) or OPEN, schedule) for r in rows}
    judged = [r for r in rows if states[r.key].reason != NOT_APPLICABLE and r.comparison is not None
              and not r.single]
    counts = {r.key: _count(r) for r in judged}
    for r in judged:
        states[r.key].q = 1.0  # p* = 1 until a look
    # The variance prior is learnt at the first look, from every row, and kept: the rows still open at a
    # later look are the noisy ones (a prior from them alone kept the outlier repeats it should drop),
    # and the stopped rows' variances at their stop are the quiet ones.
    prior = None
    for n in schedule.spending():
        # A row that stopped short of the first look (failed, flagged) is judged there on what it has.
        looked = [_cut(r, n) for r in judged if states[r.key].reason == OPEN and counts[r.key] >= n
                  or (n == schedule.first and states[r.key].reason != OPEN and counts[r.key] >= 1)]
        if not looked:
            break
        prior = _look(looked, n, schedule, states, prior)
        for r, q in zip(judged, stats.bh([states[r.key].p for r in judged]), strict=True):
            s = states[r.key]
            s.q = q
            if s.reason != OPEN or s.last is None:
                continue
            if q <= fdr and _clears(s.lo, s.hi):
                s.reason = CALLED
            elif 1 - schedule.resolve <= s.lo and s.hi <= 1 + schedule.resolve:
                s.reason = SAME
            elif s.repeats == schedule.cap:
                s.reason = CAP
            elif s.futile:
                s.reason = FUTILE
    return states


def settle(rows: list[compare.PairedRow], schedule: Schedule, fdr: float) -> dict[str, str]:
    """After a round: each row's label -> 'open' or why it is settled ('called', 'same', 'cap', 'futile',
    'failed', 'flagged', 'n/a'). `rows`: compare.pair over each op's runs so far (a row settled earlier may have
    fewer repeats than the rounds run, or more: repeats after its settling look are not used)."""
    states = replay(rows, schedule, fdr)
    return {r.label: states[r.key].reason for r in rows}


def judge(rows: list[compare.PairedRow], fdr: float = stats.FDR, schedule: Schedule | None = None) -> None:
    """The report's verdicts: compare.judge's over fixed repeats, judge_sequential's over rows timed by
    `schedule` (--repeats auto)."""
    if schedule is None:
        compare.judge(rows, fdr)
    else:
        judge_sequential(rows, schedule, fdr)


def judge_sequential(rows: list[compare.PairedRow], schedule: Schedule, fdr: float = stats.FDR) -> None:
    """The report's verdicts over a sequential A/B (compare.judge's, for rows timed by `schedule`):
    each row's comparison is its data at its last look, with p = p*, its running interval, q over
    every row's p*, SAME within 1 +/- resolve. Sets each row's `sequential` Settlement and its
    incomplete flags against the repeats its schedule asked of it.

    Each op's rows are replayed alone, as the runner settled them after each round: the prior and BH of
    each look are that op's, so a row stops here where it stopped there (replayed together, another op's
    rows moved its interval: rows the runner stopped SAME came back open, short of repeats, in an H100
    A/A of two ops). The calls are then BH over every row's p*: the FDR holds over the report."""
    states = {}
    by_op: dict[str, list[compare.PairedRow]] = {}
    for r in rows:
        by_op.setdefault(r.op, []).append(r)
    for op_rows in by_op.values():
        states.update(replay(op_rows, schedule, fdr))
    judged = [r for r in rows if states[r.key].q is not None]
    for r, q in zip(judged, stats.bh([states[r.key].p for r in judged]), strict=True):
        states[r.key].q = q
    for r in rows:
        s = states[r.key]
        if s.q is None:  # n/a, or no comparison
            continue
        if s.last is None:  # short of the first look: nothing called
            r.comparison = dataclasses.replace(r.comparison, q=s.q, p=s.p, verdict=stats.verdict(
                r.comparison.lo, r.comparison.hi, r.comparison.margin, called=False))
            continue
        r.dropped, r.process_factor = s.last.dropped, s.last.process_factor
        verdict = stats.verdict(s.lo, s.hi, stats.MARGIN, called=s.q <= fdr)
        if verdict not in (stats.FASTER, stats.SLOWER):
            verdict = stats.SAME if 1 - schedule.resolve <= s.lo and s.hi <= 1 + schedule.resolve else stats.NOISY
        r.comparison = dataclasses.replace(s.last.comparison, lo=s.lo, hi=s.hi, p=s.p, q=s.q, verdict=verdict)
    rounds = {op: max(len(ms) for r in op_rows for ms in (r.a_ms, r.b_ms)) for op, op_rows in by_op.items()}
    for r in rows:
        s = states[r.key]
        r.sequential = s
        # Asked of it: repeats up to its settling look, or every round its op ran while it was open.
        asked = s.repeats if s.reason in (CALLED, SAME, CAP, FUTILE) else min(rounds[r.op], schedule.cap)
        short = [f"{_SHORT}{side}({len(ms)}/{asked})" for side, ms in (("a", r.a_ms), ("b", r.b_ms))
                 if len(ms) < asked and not r.single]
        r.flags = [f for f in r.flags if not f.startswith(_SHORT)] + short
