"""A/B statistics on latencies: ratios on the log scale, moderated intervals, verdicts, false calls.

The ratio is B latency / A latency: below 1 means B is faster. Each side's latency is the
geometric mean of its repeats (`center`), the one statistic the tables show, the ratio divides
and the interval is built on (log scale), so a side's number, the ratio and the verdict never point
different ways.

The noise enters once, in the interval. A row's variance is the spread of its repeats (both sides
pooled: the same code under the null), shrunk toward a prior learnt from the rows of similar
latency, with the prior's degrees of freedom added: empirical-Bayes moderation (Smyth 2004, limma's
`squeezeVar` with a trend on latency). With 2 to 5 repeats a row's own variance is a poor estimate:
two repeats that agree by chance must not make a row look quiet, so a variance below its posterior
is raised to it; one above is kept (an outlier repeat is this row's evidence, not its neighbours').
The interval is then compared with a fixed practical margin, never with a second copy of the noise:

    FASTER  the 95% interval lies below 1 - MARGIN, and the call survives the report's FDR
    SLOWER  the 95% interval lies above 1 + MARGIN, and the call survives the report's FDR
    SAME    the 95% interval lies within [1 - SAME_MARGIN, 1 + SAME_MARGIN] (or the margin, if wider)
    NOISY   anything else: the data cannot tell
    n/a     the backend's timings are not performance numbers (the interpreter): nothing to call

A report is many tests: FASTER/SLOWER calls are made by Benjamini-Hochberg over the rows' p-values
(of "the change exceeds the margin"), so at most a fraction FDR of a report's calls are expected
false. Alone, a row's call is its interval's.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from harness.core.options import FDR  # noqa: F401 (the reports' default rate, stats.FDR)

# scipy is imported where it is used, not with this module: its 1-2.5 s would otherwise come before an
# A/B's first step (the A/B imports it beside its steps instead: harness.sessions.ab.reporting.preload_reports).

CONFIDENCE = 0.95
# The practical margin (0.3%): the smallest change a FASTER/SLOWER verdict claims. It guards against
# what no repeat variance shows, a systematic offset between the sides' processes (the torch control's
# B/A over an H200 A/A sits within 0.1-0.2% of 1), and it is small enough that a 1% change at the 0.3%
# between-process noise of a big kernel is called on >= 90% of rows at 5 repeats (tests/test_stats.py).
MARGIN = 0.003
# SAME claims no change beyond 1%: narrow enough to mean something at a kernel's 0.2-0.5% noise.
SAME_MARGIN = 0.01
# The default false discovery rate of a report's FASTER/SLOWER calls: FDR, declared with --fdr.
# The prior's trend on latency: a row's prior variance is learnt from the rows within this factor of
# its A latency (how much a kernel varies from one repeat to the next depends on its size).
TREND_BAND = 2.0
# Fewer rows than this with a spread estimate leave the variance unmoderated (a prior of none).
MIN_PRIOR_ROWS = 3
# A row whose log variance lies more than this many robust sd (MAD) above its band's median is left
# out of the prior's fit (an outlier repeat).
OUTLIER_SCALES = 4.0
# A repeat farther than this many prior sd from its side's median is dropped (drop_outliers).
OUTLIER_SD = 8.0
# A log-latency variance below this is taken as this (repeats equal to the timer's last digit).
MIN_VARIANCE = 1e-12

FASTER, SLOWER, SAME, NOISY, NOT_APPLICABLE = "FASTER", "SLOWER", "SAME", "NOISY", "n/a"


def center(latencies) -> float:
    """A side's latency: the geometric mean of its repeats (or raw samples)."""
    return float(np.exp(np.mean(np.log(np.asarray(latencies, dtype=float)))))


@dataclasses.dataclass(frozen=True)
class Prior:
    """A row's prior for its log-latency variance: scale s0^2 and degrees of freedom d0 (inf: the
    prior is known exactly, 0: no prior)."""
    variance: float
    dof: float


NO_PRIOR = Prior(0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Comparison:
    ratio: float  # center(B) / center(A)
    lo: float
    hi: float
    margin: float  # the practical margin the interval is compared with
    verdict: str
    n_a: int
    n_b: int
    sd: float = math.nan  # the per-repeat log sd the interval used (moderated)
    dof: float = 0.0  # its degrees of freedom (the row's own plus the prior's)
    p: float = 1.0  # p-value of "the change exceeds the margin"
    q: float | None = None  # Benjamini-Hochberg adjusted p over the report; None: judged alone

    @property
    def delta_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    @property
    def half_width(self) -> float:
        """Half the interval's width on the log scale (inf where unbounded)."""
        if not (self.lo > 0 and math.isfinite(self.hi)):
            return math.inf
        return (math.log(self.hi) - math.log(self.lo)) / 2


def residual(a, b) -> tuple[float, float]:
    """(variance, dof) of the log latencies around each side's mean, both sides pooled."""
    la, lb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    dof = la.size + lb.size - 2
    if dof <= 0:
        return math.nan, 0.0
    ss = float(((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum())
    return max(ss / dof, MIN_VARIANCE), float(dof)


def _t():
    """Student's t distribution (scipy.stats.t), imported on first use (see the imports)."""
    from scipy.stats import t

    return t


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (Newton's method on 1/y, as limma's trigammaInverse)."""
    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    from scipy import special

    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


class PriorModel:
    """The prior of a row's log-latency variance, learnt from many rows, trended on latency: its
    variance is the mean variance of the rows within TREND_BAND of the row's latency (the nearest
    MIN_PRIOR_ROWS where fewer lie within), its degrees of freedom Smyth 2004's, from the spread of
    the log variances around that trend. `variances` and `dofs` as `residual` gives them (dof 0: no
    estimate, takes no part), `latencies` the rows' A latencies. Under MIN_PRIOR_ROWS estimates there
    is no prior: every row stands on its own repeats.

    Why the mean variance and not Smyth's scale (the exponentiated mean log variance): the mean is the
    band's average noise whatever its shape, while the log mean is right only for normal noise. A
    kernel of a few us sits in one of two states ~8% apart per process (an H200): of its rows' 3+3
    repeats, those that all drew one state have a variance near zero, which drags the log mean far
    down, so the prior read such rows as 3x quieter than they are and a lucky row (A all fast, B all
    slow) was called at 3 repeats in one report of five (tests/test_verdict_simulation.py). Under
    normal noise the mean lies above Smyth's scale by d0 / (d0 - 2): a conservative prior."""

    def __init__(self, variances, dofs, latencies):
        s2, d, lat = (np.asarray(x, dtype=float) for x in (variances, dofs, latencies))
        # Repeats equal to the timer's last digit measure no spread (the variance floor): in the fit their
        # log variance, far below every real one, would collapse the prior's degrees of freedom.
        usable = (d > 0) & (s2 > MIN_VARIANCE)
        self.rows, self.outliers = int(usable.sum()), 0
        if self.rows < MIN_PRIOR_ROWS:
            return
        from scipy import special

        half = d[usable] / 2
        self._s2 = s2[usable]
        self._e = np.log(self._s2) - special.digamma(half) + np.log(half)
        self._where = np.log(lat[usable])
        # A row far above its band's variances had an outlier repeat (a 7% one on a 0.3% kernel puts its
        # log variance 4 above its neighbours'): it would make the prior's spread look wide and leave
        # every other row unmoderated. The fit leaves such rows out; they are judged by their own.
        dev = self._e - np.array([self._location(x, np.median) for x in self._where])
        scale = 1.4826 * float(np.median(np.abs(dev)))
        keep = dev <= OUTLIER_SCALES * scale if scale > 0 else np.ones(dev.size, dtype=bool)
        self._e, self._s2, self._where, half = self._e[keep], self._s2[keep], self._where[keep], half[keep]
        self.rows, self.outliers = int(keep.sum()), int((~keep).sum())
        trend = np.array([self._location(x) for x in self._where])
        spread = (float(((self._e - trend) ** 2).sum() / (self.rows - 1))
                  - float(special.polygamma(1, half).mean()))
        self.dof = 2 * _trigamma_inverse(spread) if spread > 0 else math.inf

    def _near(self, x: float):
        near = np.abs(self._where - x) <= math.log(TREND_BAND)
        if near.sum() < MIN_PRIOR_ROWS:
            near = np.argsort(np.abs(self._where - x))[:MIN_PRIOR_ROWS]
        return near

    def _location(self, x: float, average=np.mean) -> float:
        return float(average(self._e[self._near(x)]))

    def at(self, latency: float) -> Prior:
        if self.rows < MIN_PRIOR_ROWS:
            return NO_PRIOR
        return Prior(float(self._s2[self._near(math.log(latency))].mean()), self.dof)


def drop_outliers(latencies, prior: Prior) -> tuple[list[float], list[float]]:
    """(kept, dropped): a side's repeats less the one farthest from its median, where it lies more
    than OUTLIER_SD prior sd away (a process that lost the GPU, a clock drop: an event, not the
    kernel's noise; a 7% repeat of a kernel that varies 0.3% lies 23 sd away). At most one per side,
    from 4 repeats up, and only with a prior to measure by."""
    values = [float(x) for x in latencies]
    if prior.dof == 0 or len(values) < 4:
        return values, []
    logs = np.log(values)
    far = np.abs(logs - np.median(logs))
    worst = int(np.argmax(far))
    if far[worst] <= OUTLIER_SD * math.sqrt(prior.variance):
        return values, []
    return values[:worst] + values[worst + 1:], [values[worst]]


def compare(a, b, prior: Prior = NO_PRIOR, margin: float = MARGIN) -> Comparison:
    """Compare two sets of latencies (repeats, or one run's raw samples), the row's variance
    moderated by `prior`; the verdict is the interval's alone (`adjust` applies a report's FDR)."""
    la, lb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    if la.size == 0 or lb.size == 0:
        raise ValueError("both sides need at least one latency")
    diff = float(lb.mean() - la.mean())
    own, own_dof = residual(a, b)
    if own_dof == 0 and prior.dof == 0:
        variance, dof = math.nan, 0.0
    elif own_dof == 0:
        variance, dof = prior.variance, prior.dof
    elif math.isinf(prior.dof):
        variance, dof = max(own, prior.variance), math.inf
    else:
        posterior = (prior.dof * prior.variance + own_dof * own) / (prior.dof + own_dof)
        variance, dof = max(own, posterior), prior.dof + own_dof
    ratio = math.exp(diff)
    if dof == 0:  # nothing says how much a repeat varies: an unbounded interval, the verdict NOISY
        return Comparison(ratio, 0.0, math.inf, margin, NOISY, int(la.size), int(lb.size))
    se = math.sqrt(variance * (1 / la.size + 1 / lb.size))
    t = float(_t().ppf(0.5 + CONFIDENCE / 2, dof))
    lo, hi = math.exp(diff - t * se), math.exp(diff + t * se)
    p = p_beyond_margin(diff, se, dof, margin)
    return Comparison(ratio, lo, hi, margin, verdict(lo, hi, margin), int(la.size), int(lb.size),
                      math.sqrt(variance), dof, p)


def p_beyond_margin(diff: float, se: float, dof: float, margin: float) -> float:
    """Two one-sided tests of "B/A beyond 1 +/- margin" on the log scale, Bonferroni-combined:
    below CONFIDENCE's alpha exactly when the interval clears the margin on one side."""
    if se == 0:
        return 0.0 if diff > math.log1p(margin) or diff < math.log1p(-margin) else 1.0
    up = float(_t().sf((diff - math.log1p(margin)) / se, dof))
    down = float(_t().cdf((diff - math.log1p(-margin)) / se, dof))
    return min(1.0, 2 * min(up, down))


def verdict(lo: float, hi: float, margin: float = MARGIN, called: bool = True) -> str:
    """The interval's verdict; `called`: whether a FASTER/SLOWER call survives the report's FDR (a
    call that does not may still be SAME)."""
    if called and hi < 1.0 - margin:
        return FASTER
    if called and lo > 1.0 + margin:
        return SLOWER
    # SAME claims no change beyond SAME_MARGIN, or beyond the margin where that is wider: a row judged
    # with a 3% margin (one run a side) cannot tell 1% from nothing.
    same = max(SAME_MARGIN, margin)
    if lo >= 1.0 - same and hi <= 1.0 + same:
        return SAME
    return NOISY


def bh(pvalues) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the order given."""
    p = np.asarray(pvalues, dtype=float)
    if p.size == 0:
        return []
    order = np.argsort(p)
    scaled = p[order] * p.size / np.arange(1, p.size + 1)
    q = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty_like(q)
    out[order] = np.minimum(q, 1.0)
    return [float(x) for x in out]


def adjust(comparisons: list[Comparison], fdr: float = FDR) -> list[Comparison]:
    """The report's verdicts: each comparison's q-value over all of them, and a FASTER/SLOWER call
    kept only where q <= fdr (else SAME or NOISY). n/a stays n/a."""
    judged = [i for i, c in enumerate(comparisons) if c.verdict != NOT_APPLICABLE]
    out = list(comparisons)
    for i, q in zip(judged, bh([comparisons[i].p for i in judged]), strict=True):
        c = comparisons[i]
        out[i] = dataclasses.replace(c, q=q, verdict=verdict(c.lo, c.hi, c.margin, called=q <= fdr))
    return out


def detectable(c: Comparison, alpha: float) -> float:
    """The smallest relative change this row would have called at a p-value threshold `alpha`
    (its noise, repeats and margin): where its p-value reaches `alpha` and its interval clears the
    margin, the later of the two. A call needs both (`adjust`), so a threshold looser than the
    interval's (a report at --fdr above 1 - CONFIDENCE, with most of its rows called) buys nothing."""
    if c.dof == 0 or not math.isfinite(c.sd):
        return math.inf
    se = c.sd * math.sqrt(1 / c.n_a + 1 / c.n_b)
    t = max(float(_t().isf(alpha / 2, c.dof)), float(_t().ppf(0.5 + CONFIDENCE / 2, c.dof)))
    return math.expm1(math.log1p(c.margin) + t * se)


def geomean(ratios) -> tuple[float, float, float]:
    """Geometric mean of per-row ratios with a t interval over rows: (gm, lo, hi)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(logs.mean())
    if logs.size < 2:
        return math.exp(mean), math.nan, math.nan
    se = float(logs.std(ddof=1)) / math.sqrt(logs.size)
    if se == 0.0:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    t = float(_t().ppf(0.5 + CONFIDENCE / 2, logs.size - 1))
    return math.exp(mean), math.exp(mean - t * se), math.exp(mean + t * se)


def spread(ratios) -> float:
    """3 sd of a set of ratios on the log scale, as a relative figure (0.0 under 2 ratios)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    return math.expm1(3 * float(np.std(logs, ddof=1))) if logs.size > 1 else 0.0


def describe(ratio: float) -> str:
    """Direction in words, never a bare signed percentage: '1.053x slower', '1.020x faster'."""
    if not math.isfinite(ratio):
        return "n/a"
    if abs(ratio - 1.0) < 1e-4:
        return "no change"
    return f"{ratio:.3f}x slower" if ratio > 1 else f"{1 / ratio:.3f}x faster"
