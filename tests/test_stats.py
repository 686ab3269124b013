import dataclasses
import math

import numpy as np
import pytest
from scipy import optimize, special
from scipy import stats as sps

from reports import stats


def test_identical_sides_are_same_with_ratio_one():
    a = [1.000, 1.001, 0.999, 1.000]
    c = stats.compare(a, list(a))
    assert c.ratio == pytest.approx(1.0)
    assert c.lo < 1.0 < c.hi and c.verdict == stats.SAME and c.p == pytest.approx(1.0)


def test_clear_slowdown_is_slower():
    a = [1.000, 1.001, 0.999, 1.000, 1.002]
    b = [x * 1.10 for x in a]
    c = stats.compare(a, b)
    assert c.ratio == pytest.approx(1.10, rel=1e-9)
    assert c.verdict == stats.SLOWER and c.lo > 1.0 and c.p < 1e-6


def test_clear_speedup_is_faster():
    assert stats.compare([2.0, 2.01, 1.99], [1.0, 1.005, 0.995]).verdict == stats.FASTER


def test_a_precise_change_inside_the_margin_is_not_called():
    # 0.2% slower, measured to 0.01%: beyond doubt, and below the practical margin: SAME, not SLOWER.
    a = [1.0, 1.0001, 0.9999, 1.0, 1.0001]
    c = stats.compare(a, [x * 1.002 for x in a])
    assert c.lo > 1.0 and c.verdict == stats.SAME
    assert stats.compare(a, [x * 1.005 for x in a]).verdict == stats.SLOWER


def test_wide_interval_is_noisy():
    c = stats.compare([1.0, 1.2, 0.8], [1.1, 0.9, 1.3])
    assert c.verdict == stats.NOISY


def test_one_value_per_side_cannot_conclude():
    c = stats.compare([1.0], [2.0])
    assert (c.lo, c.hi) == (0.0, math.inf) and c.verdict == stats.NOISY and c.dof == 0


def test_the_interval_is_the_pooled_t_interval_on_the_log_scale_without_a_prior():
    a, b = [1.0, 1.02, 0.99, 1.01], [1.05, 1.06, 1.04]
    la, lb = np.log(a), np.log(b)
    ss = ((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum()
    se = math.sqrt(ss / 5 * (1 / 4 + 1 / 3))
    t = sps.t.ppf(0.975, 5)
    c = stats.compare(a, b)
    diff = lb.mean() - la.mean()
    assert (c.lo, c.hi) == pytest.approx((math.exp(diff - t * se), math.exp(diff + t * se)))
    assert c.dof == 5 and c.sd == pytest.approx(math.sqrt(ss / 5))


@pytest.mark.parametrize("lo,hi,verdict", [
    (1.0031, 1.02, stats.SLOWER), (1.003, 1.02, stats.NOISY),  # touching the margin is not beyond it
    (0.98, 0.9969, stats.FASTER), (0.98, 0.997, stats.NOISY),
    (0.99, 1.01, stats.SAME), (0.9899, 1.0, stats.NOISY), (1.0, 1.0101, stats.NOISY),
    (1.004, 1.009, stats.SLOWER),
])
def test_verdict_compares_the_interval_with_the_margins(lo, hi, verdict):
    assert stats.verdict(lo, hi) == verdict


def test_a_call_that_does_not_survive_the_fdr_is_same_where_its_interval_allows_else_noisy():
    assert stats.verdict(1.004, 1.009, called=False) == stats.SAME
    assert stats.verdict(1.004, 1.02, called=False) == stats.NOISY


def test_the_p_value_crosses_alpha_exactly_where_the_interval_clears_the_margin():
    a = [1.0, 1.003, 0.997, 1.001, 0.999]
    for shift in np.linspace(1.0, 1.02, 81):
        c = stats.compare(a, [x * shift for x in a])
        assert (c.p < 0.05) == (c.verdict in (stats.FASTER, stats.SLOWER)), shift


def test_bh_matches_the_step_up_rule_by_hand():
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    # sorted: 0.005 0.01 0.03 0.04 0.5 -> *5/k: 0.025 0.025 0.05 0.05 0.5, then running minimum from the top.
    assert stats.bh(p) == pytest.approx([0.025, 0.05, 0.05, 0.025, 0.5])
    assert stats.bh([]) == []
    assert stats.bh([0.9, 0.95]) == pytest.approx([0.95, 0.95])


def test_adjust_keeps_only_the_calls_that_survive_bh_and_leaves_n_a_alone():
    a = [1.0, 1.001, 0.999, 1.0]
    strong = stats.compare(a, [x * 1.05 for x in a])
    weak = stats.compare([1.0, 1.01, 0.99, 1.0], [1.02, 1.03, 1.01, 1.02])  # p a little under 0.05
    assert weak.verdict == stats.SLOWER and 0.01 < weak.p < 0.05
    na = stats.Comparison(1.0, 0.9, 1.1, stats.MARGIN, stats.NOT_APPLICABLE, 3, 3)
    alone = stats.adjust([weak])
    assert alone[0].verdict == stats.SLOWER and alone[0].q == pytest.approx(weak.p)
    nulls = [stats.compare(a, list(a)) for _ in range(20)]
    out = stats.adjust([strong, weak, na, *nulls])
    assert out[0].verdict == stats.SLOWER and out[1].verdict == stats.NOISY and out[1].q > 0.05
    assert out[2] is na


def _chi2_variances(rng, n, s0, d0, dof):
    """Row variances whose true values are drawn from the prior s0^2 * d0 / chi2(d0), each
    estimated with `dof` degrees of freedom."""
    true = s0 ** 2 * d0 / rng.chisquare(d0, n)
    return true * rng.chisquare(dof, n) / dof


def test_the_prior_recovers_its_degrees_of_freedom_and_the_mean_variance():
    rng = np.random.default_rng(7)
    s2 = _chi2_variances(rng, 4000, 0.004, 8.0, 4)
    model = stats.PriorModel(s2, [4] * s2.size, [1.0] * s2.size)
    prior = model.at(1.0)
    assert prior.dof == pytest.approx(8.0, rel=0.25)
    # The mean of the true variances, s0^2 d0 / (d0 - 2), not the scale s0^2 itself.
    assert prior.variance == pytest.approx(0.004 ** 2 * 8.0 / 6.0, rel=0.1)


def test_a_two_state_band_gets_its_whole_variance_as_prior():
    # Each repeat (one process) sits in a fast or an 8% slower state, 40% slow: the per-repeat variance
    # of the log latency is 0.4 * 0.6 * log(1.08)^2 plus the jitter, though many rows' 3+3 repeats all
    # drew one state and show next to none of it.
    rng = np.random.default_rng(5)
    variances, dofs = [], []
    for _ in range(400):
        a, b = (np.exp(np.where(rng.random(3) < 0.4, math.log(1.08), 0.0) + rng.normal(0, 0.002, 3)) for _ in "ab")
        v, d = stats.residual(a, b)
        variances.append(v)
        dofs.append(d)
    prior = stats.PriorModel(variances, dofs, [0.004] * 400).at(0.004)
    true = 0.4 * 0.6 * math.log(1.08) ** 2 + 0.002 ** 2
    assert prior.variance == pytest.approx(true, rel=0.15)


def test_equal_variances_give_an_infinite_prior():
    rng = np.random.default_rng(3)
    s2 = 0.003 ** 2 * rng.chisquare(4, 2000) / 4
    prior = stats.PriorModel(s2, [4] * s2.size, [1.0] * s2.size).at(1.0)
    assert prior.dof == math.inf or prior.dof > 200
    assert math.sqrt(prior.variance) == pytest.approx(0.003, rel=0.05)


def test_the_prior_follows_latency():
    # Small kernels vary 4% between repeats, big ones 0.3%: each band gets its own prior location.
    rng = np.random.default_rng(5)
    small = 0.04 ** 2 * rng.chisquare(4, 300) / 4
    big = 0.003 ** 2 * rng.chisquare(4, 300) / 4
    model = stats.PriorModel(np.r_[small, big], [4] * 600, [0.002] * 300 + [0.2] * 300)
    assert math.sqrt(model.at(0.002).variance) == pytest.approx(0.04, rel=0.1)
    assert math.sqrt(model.at(0.2).variance) == pytest.approx(0.003, rel=0.1)
    # Beyond every band (0.5 ms, over 2x from the nearest rows) the nearest few give it: the big rows'.
    assert 0.0015 < math.sqrt(model.at(0.5).variance) < 0.006


def test_too_few_rows_give_no_prior():
    model = stats.PriorModel([1e-4, 2e-4], [2, 2], [1.0, 1.0])
    assert model.at(1.0) == stats.NO_PRIOR
    assert stats.PriorModel([1e-4, 2e-4, 1e-4], [2, 0, 2], [1.0, 1.0, 1.0]).at(1.0) == stats.NO_PRIOR


def test_a_lucky_row_whose_repeats_agree_by_chance_cannot_look_quiet():
    # Two repeats a side that happen to agree to 0.01%, a 3% shift, among rows that vary 4%.
    a, b = [2.500, 2.5003], [2.575, 2.5752]
    alone = stats.compare(a, b)
    assert alone.verdict == stats.SLOWER
    prior = stats.Prior(0.04 ** 2, 6.0)
    judged = stats.compare(a, b, prior)
    assert judged.verdict == stats.NOISY and judged.dof == 8.0
    posterior = (6 * 0.04 ** 2 + 2 * stats.residual(a, b)[0]) / 8
    assert judged.sd == pytest.approx(math.sqrt(posterior))


def test_a_noisy_row_keeps_its_own_variance_against_a_quiet_prior():
    # An outlier repeat is this row's evidence: its variance is not shrunk below its own.
    a, b = [1.0, 1.07, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0005]
    own, dof = stats.residual(a, b)
    c = stats.compare(a, b, stats.Prior(0.001 ** 2, 50.0))
    assert c.sd == pytest.approx(math.sqrt(own)) and c.dof == 58.0 and c.verdict == stats.NOISY


def test_an_exact_prior_replaces_smaller_variances_and_has_infinite_dof():
    c = stats.compare([1.0, 1.0001], [1.01, 1.0101], stats.Prior(0.002 ** 2, math.inf))
    assert c.dof == math.inf and c.sd == pytest.approx(0.002)


def test_a_row_of_one_repeat_a_side_takes_its_variance_from_the_prior():
    c = stats.compare([1.0], [1.05], stats.Prior(0.001 ** 2, 20.0))
    assert c.dof == 20.0 and c.verdict == stats.SLOWER
    assert stats.compare([1.0], [1.05]).verdict == stats.NOISY


def test_detectable_is_where_the_verdict_turns():
    a = [1.0, 1.004, 0.997, 1.002, 0.999]
    c = stats.compare(a, a)
    d = stats.detectable(c, 0.05)
    assert 0.004 < d < 0.02
    # The interval's width does not depend on the shift: just above d it is called, just below not.
    assert stats.compare(a, [x * (1 + d * 1.01) for x in a]).verdict == stats.SLOWER
    assert stats.compare(a, [x * (1 + d * 0.99) for x in a]).verdict != stats.SLOWER
    assert stats.detectable(stats.compare([1.0], [1.0]), 0.05) == math.inf
    # No degrees of freedom, however finite its sd: nothing is callable. One is enough for a finite figure.
    alone = stats.Comparison(1.0, 0.9, 1.1, 0.003, stats.SAME, 1, 1, sd=0.01, dof=0.0)
    assert stats.detectable(alone, 0.05) == math.inf
    assert math.isfinite(stats.detectable(dataclasses.replace(alone, n_a=2, dof=1.0), 0.05))


# Five repeats a side; a side cut short stands for one that lost repeats (a dropped outlier, a failed run).
REPEATS = [1.0, 1.004, 0.997, 1.002, 0.999]
OTHER_REPEATS = [1.001, 0.998, 1.003, 0.9985, 1.0005]


def _turning_ratio(a, b, alpha):
    """The B/A at which the row a, b (B scaled) turns SLOWER, judged alone at p-value threshold `alpha`
    (one row: its q is its p), by bisection on the scale: the verdict's own answer, to float precision."""
    called, uncalled = 1.2, 1.0
    for _ in range(80):
        scale = (called + uncalled) / 2
        if stats.adjust([stats.compare(a, [x * scale for x in b])], alpha)[0].verdict == stats.SLOWER:
            called = scale
        else:
            uncalled = scale
    return stats.center(b) * called / stats.center(a)


def _pooled_t_boundary(a, b, alpha):
    """The B/A at which scipy's pooled two-sample t test (log latencies, one-sided, "B/A beyond 1 + MARGIN")
    reaches the stricter of alpha / 2 (the two one-sided tests, Bonferroni) and the 95% interval's 2.5%."""
    la, lb = np.log(a), np.log(b)
    target = min(alpha, 1 - stats.CONFIDENCE) / 2

    def excess(shift):
        moved = lb + shift - math.log1p(stats.MARGIN)
        return sps.ttest_ind(moved, la, equal_var=True, alternative="greater").pvalue - target

    shift = optimize.brentq(excess, -0.2, 0.2, xtol=1e-15, rtol=1e-15)
    return math.exp(lb.mean() + shift - la.mean())


@pytest.mark.parametrize("alpha", [0.05, 0.005, 0.2])
@pytest.mark.parametrize("n_a,n_b", [(5, 5), (5, 4), (5, 3), (3, 5), (4, 2)])
def test_the_smallest_change_callable_is_where_the_verdict_turns_for_any_repeats_a_side(n_a, n_b, alpha):
    # Unequal repeats a side are what a dropped outlier or a failed repeat leaves; a threshold above 0.05 is
    # a report at a loose --fdr whose other rows are called, where the 95% interval, not the p-value, binds.
    a, b = REPEATS[:n_a], OTHER_REPEATS[:n_b]
    c = stats.compare(a, b)
    assert c.verdict != stats.SLOWER and (c.n_a, c.n_b, c.dof) == (n_a, n_b, n_a + n_b - 2)
    expected = _pooled_t_boundary(a, b, alpha)
    assert _turning_ratio(a, b, alpha) == pytest.approx(expected, rel=1e-9)
    assert 1 + stats.detectable(c, alpha) == pytest.approx(expected, rel=1e-9)


def test_a_call_whose_q_equals_the_fdr_stands():
    # Benjamini-Hochberg calls p_(k) <= k * fdr / m, equality included; one row alone: its q is its p.
    c = stats.compare(REPEATS, [x * 1.01 for x in REPEATS])
    assert c.verdict == stats.SLOWER and 0 < c.p < 0.05
    assert stats.adjust([c], c.p)[0].verdict == stats.SLOWER
    assert stats.adjust([c], math.nextafter(c.p, 0))[0].verdict != stats.SLOWER


def test_trigamma_inverse_inverts():
    for y in (0.05, 0.7, 3.0, 40.0, 5000.0):
        assert stats._trigamma_inverse(float(special.polygamma(1, y))) == pytest.approx(y, rel=1e-5)


def test_geomean_with_interval():
    gm, lo, hi = stats.geomean([1.1, 1.1, 1.1])
    assert gm == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    gm, lo, hi = stats.geomean([0.5, 2.0])
    assert gm == pytest.approx(1.0) and lo < 1.0 < hi


def test_spread_is_three_sd_of_the_logs():
    s = 0.01
    assert stats.spread([math.exp(-s), 1.0, math.exp(s)]) == pytest.approx(math.expm1(3 * s))
    assert stats.spread([1.0]) == 0.0


@pytest.mark.parametrize("ratio,words", [(1.05, "1.050x slower"), (0.8, "1.250x faster"), (1.0, "no change")])
def test_direction_in_words(ratio, words):
    assert stats.describe(ratio) == words


def test_a_sides_latency_is_the_geometric_mean_and_the_ratio_divides_the_two():
    assert stats.center([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.center([3]) == pytest.approx(3.0)
    a, b = [7.0, 7.5, 7.4], [7.2, 7.1, 7.3]  # medians and means could point other ways than the ratio
    assert stats.compare(a, b).ratio == pytest.approx(stats.center(b) / stats.center(a))


def test_rows_at_the_variance_floor_take_no_part_in_the_prior():
    # Repeats equal to the timer's last digit: their log variance, far below every real one, must not
    # collapse the prior (found by a review: two such rows took the prior's dof from 15 to 0.6).
    rng = np.random.default_rng(1)
    s2 = list(0.003 ** 2 * rng.chisquare(4, 30) / 4)
    with_floor = stats.PriorModel([*s2, stats.MIN_VARIANCE, stats.MIN_VARIANCE], [4] * 32, [0.1] * 32).at(0.1)
    assert with_floor == stats.PriorModel(s2, [4] * 30, [0.1] * 30).at(0.1)
    a, b = [0.1] * 3, [0.1] * 3
    assert stats.compare(a, b, with_floor).sd == pytest.approx(math.sqrt(with_floor.variance))


def test_a_margin_wider_than_the_same_margin_widens_same_too():
    assert stats.verdict(0.985, 1.015, margin=0.03) == stats.SAME
    assert stats.verdict(0.985, 1.015) == stats.NOISY
    assert stats.verdict(0.98, 1.031, margin=0.03) == stats.NOISY
