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


def test_change_below_the_noise_floor_is_not_called():
    # A's own repeats spread by ~1%: a 0.5% shift must not be called a change.
    a = [1.00, 1.01, 0.99, 1.005, 0.995]
    b = [x * 1.005 for x in a]
    assert stats.compare(a, b).verdict in (stats.SAME, stats.NOISY)


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
    assert stats.noise_floor([1.0, 1.0, 1.0]) == stats.MIN_EFFECT
    assert stats.noise_floor([1.0, 1.1, 0.9]) > 0.2


def test_geomean_with_interval():
    gm, lo, hi = stats.geomean([1.1, 1.1, 1.1])
    assert gm == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    gm, lo, hi = stats.geomean([0.5, 2.0])
    assert gm == pytest.approx(1.0) and lo < 1.0 < hi


@pytest.mark.parametrize("ratio,words", [(1.05, "1.050x slower"), (0.8, "1.250x faster"), (1.0, "no change")])
def test_direction_in_words(ratio, words):
    assert stats.describe(ratio) == words
