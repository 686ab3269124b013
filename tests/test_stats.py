import math

import numpy as np
import pytest

from reports import stats


def test_identical_sides_are_same_with_ratio_one():
    a = [1.00, 1.01, 0.99, 1.00]
    c = stats.compare(a, list(a))
    assert c.ratio == pytest.approx(1.0)
    assert c.lo < 1.0 < c.hi and c.verdict == stats.SAME


def test_clear_slowdown_is_slower():
    a = [1.000, 1.001, 0.999, 1.000, 1.002]
    b = [x * 1.10 for x in a]
    c = stats.compare(a, b)
    assert c.ratio == pytest.approx(1.10, rel=1e-9)
    assert c.verdict == stats.SLOWER and c.lo > 1.0


def test_clear_speedup_is_faster():
    a = [2.0, 2.01, 1.99]
    b = [1.0, 1.005, 0.995]
    assert stats.compare(a, b).verdict == stats.FASTER


def test_change_below_the_noise_floor_is_same():
    # A's own repeats spread by ~1%: a 0.5% shift lies within the floor they set.
    a = [1.00, 1.01, 0.99, 1.005, 0.995]
    b = [x * 1.005 for x in a]
    c = stats.compare(a, b)
    assert c.floor > 0.01 and c.verdict == stats.SAME


def test_wide_interval_is_noisy():
    a = [1.0, 1.5, 0.7]
    b = [1.2, 0.8, 1.6]
    assert stats.compare(a, b).verdict == stats.NOISY


def test_one_value_per_side_cannot_conclude():
    c = stats.compare([1.0], [2.0])
    assert c.verdict == stats.NOISY and c.ratio == pytest.approx(2.0)


def test_welch_interval_matches_scipy():
    from scipy import stats as sps

    rng = np.random.default_rng(0)
    a = rng.lognormal(0.0, 0.02, 6)
    b = rng.lognormal(0.05, 0.03, 5)
    c = stats.compare(a, b)
    res = sps.ttest_ind(np.log(b), np.log(a), equal_var=False)
    lo, hi = res.confidence_interval(0.95)
    assert c.lo == pytest.approx(math.exp(lo)) and c.hi == pytest.approx(math.exp(hi))


def test_noise_floor_has_a_minimum_and_grows_with_spread():
    assert stats.noise_floor([1.0, 1.0, 1.0]) == 0.005  # README: at least 0.5%
    assert stats.noise_floor([1.0, 1.1, 0.9]) > 0.2


# README's A/B rules, numbers as literals: the floor is at least 0.5%; FASTER / SLOWER when the
# whole interval lies beyond it, SAME within it, NOISY otherwise or when A's repeats disagree by
# more than 5%. A's repeats below agree to 0.01%, so the floor is the 0.5% minimum.
STEADY = [1.0, 1.0001, 0.9999, 1.0, 1.0001]


@pytest.mark.parametrize("shift,verdict", [
    (1.0045, stats.SAME), (0.9955, stats.SAME),      # within 0.5%: would be a change under a 0.4% floor
    (1.0055, stats.SLOWER), (0.9945, stats.FASTER),  # beyond 0.5%: would be SAME under a 0.6% floor
])
def test_the_noise_floor_is_half_a_percent(shift, verdict):
    c = stats.compare(STEADY, [x * shift for x in STEADY])
    assert c.floor == 0.005 and c.ratio == pytest.approx(shift)
    assert c.lo > min(shift, 1.0) - 0.0005 and c.hi < max(shift, 1.0) + 0.0005  # a tight interval
    assert c.verdict == verdict


@pytest.mark.parametrize("lo,hi,verdict", [
    (1.001, 1.004, stats.SAME), (0.996, 1.004, stats.SAME),
    (1.006, 1.100, stats.SLOWER), (0.900, 0.994, stats.FASTER),
    (1.003, 1.007, stats.NOISY), (0.993, 0.997, stats.NOISY),  # straddles the floor
    (0.900, 1.100, stats.NOISY),                               # straddles the whole band
])
def test_verdict_compares_the_whole_interval_with_the_floor(lo, hi, verdict):
    assert stats.verdict(lo, hi, 0.005) == verdict


@pytest.mark.parametrize("floor,far,near", [(0.049, stats.SLOWER, stats.SAME), (0.051, stats.SLOWER, stats.NOISY)])
def test_a_floor_above_5_percent_calls_no_row_same_but_still_a_change_beyond_it(floor, far, near):
    assert stats.verdict(1.5, 2.0, floor) == far
    assert stats.verdict(0.999, 1.001, floor) == near


def test_the_floor_comes_from_a_own_repeats():
    # A spread by several percent: B 10% slower, with a tight B, is within that floor; twice as slow is not.
    a = [1.0, 1.06, 0.95, 1.04]
    c = stats.compare(a, [1.1, 1.1001, 1.0999, 1.1])
    assert 0.1 < c.floor < 0.2 and c.verdict == stats.NOISY
    assert stats.compare(a, [2.0, 2.0001, 1.9999, 2.0]).verdict == stats.SLOWER
    # B's own spread does not set the floor: A steady, B noisy, the floor stays at 0.5%.
    assert stats.compare(STEADY, [1.0, 1.06, 0.95, 1.04]).floor == 0.005


def test_geomean_with_interval():
    gm, lo, hi = stats.geomean([1.1, 1.1, 1.1])
    assert gm == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    gm, lo, hi = stats.geomean([0.5, 2.0])
    assert gm == pytest.approx(1.0) and lo < 1.0 < hi


@pytest.mark.parametrize("ratio,words", [(1.05, "1.050x slower"), (0.8, "1.250x faster"), (1.0, "no change")])
def test_direction_in_words(ratio, words):
    assert stats.describe(ratio) == words


def test_a_sides_latency_is_the_geometric_mean_and_the_ratio_divides_the_two():
    assert stats.center([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.center([3]) == pytest.approx(3.0)
    a, b = [7.0, 7.5, 7.4], [7.2, 7.1, 7.3]  # medians and means could point other ways than the ratio
    assert stats.compare(a, b).ratio == pytest.approx(stats.center(b) / stats.center(a))
