"""A/B statistics on latencies: ratios on the log scale, Welch intervals, verdicts.

The ratio is B latency / A latency: below 1 means B is faster. Each side's latency is the
geometric mean of its repeats (`center`), the one statistic the tables show, the ratio divides
and the interval is built on (log scale), so a side's number, the ratio and the verdict never point
different ways, as a median beside a geometric-mean ratio can. Verdicts compare the ratio's 95%
interval against a noise floor taken from A's own repeats (the A/A inside every A/B), pooled over
the rows of similar latency (`pooled_floors`):

    FASTER  the whole interval lies below 1 - floor
    SLOWER  the whole interval lies above 1 + floor
    SAME    the whole interval lies within [1 - floor, 1 + floor], and the floor is at most MAX_FLOOR
    NOISY   anything else: the data cannot tell
    n/a     the backend's timings are not performance numbers (the interpreter): nothing to call
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
# The smallest effect ever called a change, whatever A's repeats say (0.5%).
MIN_EFFECT = 0.005
# How many A/A standard deviations (log scale) a change must exceed.
NOISE_SIGMAS = 3.0
# A row whose A/A floor exceeds this is never called SAME (5%): "no change within 10%" says little. A
# change beyond even such a floor is still called (small kernels vary that much between repeats).
MAX_FLOOR = 0.05
# Rows whose A latencies lie within this factor of each other pool their A/A spread: how much a kernel
# varies from one repeat to the next depends on its size, and 2 to 5 repeats of one row alone
# estimate it badly (with 2, A's two repeats agree closely by chance often enough that a corpus
# calls identical code FASTER or SLOWER: 2 of 25 such rows on an H200).
POOL_BAND = 2.0

FASTER, SLOWER, SAME, NOISY, NOT_APPLICABLE = "FASTER", "SLOWER", "SAME", "NOISY", "n/a"


def center(latencies) -> float:
    """A side's latency: the geometric mean of its repeats (or raw samples)."""
    return float(np.exp(np.mean(np.log(np.asarray(latencies, dtype=float)))))


@dataclasses.dataclass(frozen=True)
class Comparison:
    ratio: float  # center(B) / center(A)
    lo: float
    hi: float
    floor: float  # relative noise floor used for the verdict
    verdict: str
    n_a: int
    n_b: int

    @property
    def delta_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0


def noise_floor(a: np.ndarray) -> float:
    """Relative floor from the spread of A's own repeats (log-scale sd), at least MIN_EFFECT."""
    logs = np.log(np.asarray(a, dtype=float))
    sd = float(np.std(logs, ddof=1)) if logs.size > 1 else 0.0
    return max(MIN_EFFECT, math.expm1(NOISE_SIGMAS * sd))


def pooled_floors(latencies, pool) -> list[float]:
    """Per latency in `latencies`, the noise floor (as `noise_floor`) of the spread of the repeats in
    `pool` (one list of A latencies per row) pooled over the rows whose geometric mean lies within
    POOL_BAND of it: their squared log deviations summed over their degrees of freedom summed."""
    logs = [np.log(np.asarray(a, dtype=float)) for a in pool]
    centers = np.array([x.mean() for x in logs])
    order = np.argsort(centers)
    centers = centers[order]
    sq = np.concatenate([[0.0], np.cumsum([float(((logs[i] - logs[i].mean()) ** 2).sum()) for i in order])])
    dof = np.concatenate([[0], np.cumsum([logs[i].size - 1 for i in order])])
    band = math.log(POOL_BAND)
    floors = []
    for latency in np.log(np.asarray(latencies, dtype=float)):
        lo = np.searchsorted(centers, latency - band, side="left")
        hi = np.searchsorted(centers, latency + band, side="right")
        d = dof[hi] - dof[lo]
        sd = math.sqrt((sq[hi] - sq[lo]) / d) if d > 0 else 0.0
        floors.append(max(MIN_EFFECT, math.expm1(NOISE_SIGMAS * sd)))
    return floors


def _interval(mean: float, se: float, dof: float) -> tuple[float, float]:
    if se == 0.0 or not math.isfinite(dof):
        return mean, mean
    t = float(sps.t.ppf(0.5 + CONFIDENCE / 2, dof))
    return mean - t * se, mean + t * se


def compare(a, b, floor: float | None = None) -> Comparison:
    """Compare two sets of latencies (repeat medians, or raw samples)."""
    la, lb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    if la.size == 0 or lb.size == 0:
        raise ValueError("both sides need at least one latency")
    diff = float(lb.mean() - la.mean())
    va = float(la.var(ddof=1)) / la.size if la.size > 1 else 0.0
    vb = float(lb.var(ddof=1)) / lb.size if lb.size > 1 else 0.0
    se = math.sqrt(va + vb)
    if la.size < 2 or lb.size < 2:  # no spread to estimate: an unbounded interval, the verdict NOISY
        lo, hi = -math.inf, math.inf
    else:
        # Welch-Satterthwaite degrees of freedom.
        dof = (va + vb) ** 2 / ((va ** 2) / (la.size - 1) + (vb ** 2) / (lb.size - 1)) if se > 0 else math.inf
        lo, hi = _interval(diff, se, dof)
    floor = noise_floor(a) if floor is None else floor
    ratio, rlo, rhi = math.exp(diff), math.exp(lo), math.exp(hi)
    return Comparison(ratio, rlo, rhi, floor, verdict(rlo, rhi, floor), int(la.size), int(lb.size))


def raise_floor(c: Comparison, floor: float) -> Comparison:
    """`c` judged against a floor of at least `floor`, its verdict called again (n/a stays n/a)."""
    if floor <= c.floor:
        return c
    return dataclasses.replace(c, floor=floor, verdict=c.verdict if c.verdict == NOT_APPLICABLE
                               else verdict(c.lo, c.hi, floor))


def verdict(lo: float, hi: float, floor: float) -> str:
    if hi < 1.0 - floor:
        return FASTER
    if lo > 1.0 + floor:
        return SLOWER
    if lo >= 1.0 - floor and hi <= 1.0 + floor and floor <= MAX_FLOOR:
        return SAME
    return NOISY


def geomean(ratios) -> tuple[float, float, float]:
    """Geometric mean of per-row ratios with a t interval over rows: (gm, lo, hi)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(logs.mean())
    if logs.size < 2:
        return math.exp(mean), math.nan, math.nan
    se = float(logs.std(ddof=1)) / math.sqrt(logs.size)
    lo, hi = _interval(mean, se, logs.size - 1)
    return math.exp(mean), math.exp(lo), math.exp(hi)


def describe(ratio: float) -> str:
    """Direction in words, never a bare signed percentage: '1.053x slower', '1.020x faster'."""
    if not math.isfinite(ratio):
        return "n/a"
    if abs(ratio - 1.0) < 1e-4:
        return "no change"
    return f"{ratio:.3f}x slower" if ratio > 1 else f"{1 / ratio:.3f}x faster"
