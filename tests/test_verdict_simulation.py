"""The verdict rule's statistical promises, by seeded simulation (deterministic, not timed): synthetic
repeats with known effects and the noise shapes seen on an H200, judged by the real code
(reports.compare.judge, the rule every report uses).

Noise per repeat (one process): log-normal jitter of 0.2-0.5% on big kernels; on small ones a
two-state mixture (a window sits in a fast or an 8% slower state, 40% slow), each repeat the
geometric mean of its TIMING_WINDOWS windows; now and then (2%) a repeat 7% off."""

import math

import numpy as np
import pytest

from harness.measure import timers
from reports import compare, stats

SLOW_STATE, SLOW_SHARE, OUTLIER, OUTLIER_RATE = 1.08, 0.4, 1.07, 0.02


def _repeats(rng, latency, n, sd, two_state, effect=1.0):
    logs = np.log(latency * effect) + rng.normal(0.0, sd, n)
    if two_state:
        states = rng.random((n, timers.TIMING_WINDOWS)) < SLOW_SHARE
        logs += np.log(np.where(states, SLOW_STATE, 1.0)).mean(axis=1)
    logs += np.where(rng.random(n) < OUTLIER_RATE, math.log(OUTLIER), 0.0)
    return list(np.exp(logs))


def _row(i, a, b):
    return compare.PairedRow(op="sim", dtype="fp32", shape=(i,), a_ms=a, b_ms=b, a_control_ms=[], b_control_ms=[],
                             timers={"graph"}, flags=[], configs_a={}, configs_b={},
                             comparison=stats.compare(a, b))


def _report(rng, rows, repeats, effects=None):
    """One report of `rows` rows: latencies from 2 us to 2 ms, the small ones two-state; effects[i]
    the true B/A of row i (default: none)."""
    out = []
    for i in range(rows):
        latency = 10 ** rng.uniform(-2.7, 0.3)  # ms
        two_state = latency < 0.01
        sd = 0.01 if two_state else rng.uniform(0.002, 0.005)
        effect = effects[i] if effects is not None else 1.0
        out.append(_row(i, _repeats(rng, latency, repeats, sd, two_state),
                        _repeats(rng, latency, repeats, sd, two_state, effect)))
    compare.judge(out)
    return out


def _called(rows):
    return [r.verdict in (stats.FASTER, stats.SLOWER) for r in rows]


@pytest.mark.parametrize("repeats", [3, 5])
def test_null_rows_are_called_no_more_often_than_the_fdr_promises(repeats):
    # 10,000 null rows as 100 reports of 100: with every row null, a report with any call is a report
    # whose calls are all false, so the FDR promise is that at most 5% of reports call anything.
    rng = np.random.default_rng(20261201 + repeats)
    reports = [_report(rng, 100, repeats) for _ in range(100)]
    with_calls = sum(any(_called(r)) for r in reports)
    calls = sum(sum(_called(r)) for r in reports)
    assert with_calls <= 5 + 4, (with_calls, calls)  # 5% of 100, and two binomial sd of Monte-Carlo slack
    assert calls / 10_000 <= 0.002


def test_among_real_changes_the_false_share_of_calls_stays_within_the_fdr():
    rng = np.random.default_rng(11)
    shares = []
    for _ in range(100):
        effects = np.where(rng.random(100) < 0.2, rng.choice([0.9, 0.95, 1.03, 1.05, 1.1], 100), 1.0)
        called = _called(_report(rng, 100, 5, effects))
        false = sum(c and e == 1.0 for c, e in zip(called, effects, strict=True))
        shares.append(false / max(sum(called), 1))
    assert np.mean(shares) <= stats.FDR


def test_a_one_percent_change_at_a_third_of_a_percent_noise_is_called_on_nine_rows_in_ten_at_five_repeats():
    rng = np.random.default_rng(3)
    rows = []
    for i in range(1000):
        latency = 10 ** rng.uniform(-1.5, 0.3)  # 30 us to 2 ms
        rows.append(_row(i, _repeats(rng, latency, 5, 0.003, False), _repeats(rng, latency, 5, 0.003, False, 1.01)))
    compare.judge(rows)
    assert sum(r.verdict == stats.SLOWER for r in rows) >= 900
    assert not any(r.verdict == stats.FASTER for r in rows)


def test_the_same_change_among_null_rows_is_still_mostly_called():
    # Half the rows changed by 1%, half untouched: BH's threshold is about half the nominal one.
    rng = np.random.default_rng(4)
    rows, effects = [], []
    for i in range(1000):
        latency = 10 ** rng.uniform(-1.5, 0.3)
        effect = 1.01 if i % 2 else 1.0
        effects.append(effect)
        rows.append(_row(i, _repeats(rng, latency, 5, 0.003, False), _repeats(rng, latency, 5, 0.003, False, effect)))
    compare.judge(rows)
    called = [r.verdict == stats.SLOWER for r in rows]
    assert sum(c for c, e in zip(called, effects, strict=True) if e > 1) >= 0.85 * 500
    assert sum(c for c, e in zip(called, effects, strict=True) if e == 1.0) <= 0.05 * sum(called)


class TwoStateTimer(timers.Timer):
    """A graph timer whose every measurement window draws a latency state (the H200's small-kernel
    behaviour), through the Timer's real window logic."""

    def __init__(self, rng):
        self.backend = None
        self.timer, self.warmup_ms, self.rep_ms, self.l2 = "graph", 25.0, 100.0, "warm"
        self.rng = rng

    def _graph(self, fn, warmup_ms=None, rep_ms=None):
        level = 2.5e-3 * (SLOW_STATE if self.rng.random() < SLOW_SHARE else 1.0)
        return timers.Measurement(list(level * np.exp(self.rng.normal(0, 0.002, 20))), "graph")


def _between_process_sd(windows, monkeypatch):
    monkeypatch.setattr(timers, "TIMING_WINDOWS", windows)
    rng = np.random.default_rng(99)
    timer = TwoStateTimer(rng)  # one per process: each draws its windows' states afresh
    latencies = [timer._windows({"candidate": lambda: None}, timer._graph)["candidate"].latency_ms
                 for _ in range(400)]
    return float(np.std(np.log(latencies), ddof=1))


def test_spreading_a_row_over_windows_lowers_the_between_process_spread_of_two_state_rows(monkeypatch):
    one = _between_process_sd(1, monkeypatch)
    spread = _between_process_sd(4, monkeypatch)
    assert one == pytest.approx(math.log(SLOW_STATE) * math.sqrt(SLOW_SHARE * (1 - SLOW_SHARE)), rel=0.15)
    assert spread < 0.6 * one
