"""The verdict rule's statistical promises, by seeded simulation (deterministic, not timed): synthetic
repeats with known effects and the noise shapes seen on an H200, judged by the real code
(reports.compare.judge, the rule every report uses).

Noise per repeat (one process): log-normal jitter of 0.2-0.5% on big kernels; on small ones a
two-state mixture (a window sits in a fast or an 8% slower state, 40% slow), each repeat the
geometric mean of its windows (as many as a run times by default); now and then (2%) a repeat 7% off."""

import math

import numpy as np
import pytest

from harness.core.spec import DEFAULT_WINDOWS
from harness.measure import timers
from reports import compare, stats

SLOW_STATE, SLOW_SHARE, OUTLIER, OUTLIER_RATE = 1.08, 0.4, 1.07, 0.02


def _repeats(rng, latency, n, sd, two_state, effect=1.0):
    logs = np.log(latency * effect) + rng.normal(0.0, sd, n)
    if two_state:
        states = rng.random((n, DEFAULT_WINDOWS)) < SLOW_SHARE
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

    def __init__(self, rng, windows):
        self.backend = None
        self.timer, self.warmup_ms, self.rep_ms, self.l2, self.windows = "graph", 25.0, 100.0, "warm", windows
        self.rng = rng

    def _graph(self, fn, warmup_ms=None, rep_ms=None, sizes=None):
        level = 2.5e-3 * (SLOW_STATE if self.rng.random() < SLOW_SHARE else 1.0)
        return timers.Measurement(list(level * np.exp(self.rng.normal(0, 0.002, 20))), "graph")


def _between_process_sd(windows):
    rng = np.random.default_rng(99)
    timer = TwoStateTimer(rng, windows)  # one per process: each draws its windows' states afresh
    def graph(side, fn, warmup_ms, rep_ms):
        return timer._graph(fn, warmup_ms, rep_ms)

    latencies = [timer._windows({"candidate": lambda: None}, graph)["candidate"].latency_ms for _ in range(400)]
    return float(np.std(np.log(latencies), ddof=1))


def test_spreading_a_row_over_windows_lowers_the_between_process_spread_of_two_state_rows():
    one = _between_process_sd(1)
    spread = _between_process_sd(4)
    assert one == pytest.approx(math.log(SLOW_STATE) * math.sqrt(SLOW_SHARE * (1 - SLOW_SHARE)), rel=0.15)
    assert spread < 0.6 * one


# The process's speed factor (compare.process_factors): every kernel a process times, the candidate and
# the torch baseline beside it, runs a little faster or slower with that process (on an H200, up to
# 0.6% per replay of a copy kernel). Simulated as one log-normal factor per process shared by every row
# of its op, over per-row jitter.
PROCESS_SD, ROW_SD, CONTROL_SD = 0.005, 0.0025, 0.003


def _op_rows(rng, op, rows, repeats, effect=1.0, controls=True, follows=1.0, log_ms=(-1.0, -0.05), factor=None):
    """`rows` rows of one op, 10**log_ms ms (by default 0.1-1 ms, one latency band: the factor is fitted
    per band), timed in `repeats` processes a side whose log factors are `factor` (default: drawn);
    each process's factor moves the candidate by `follows` times what it moves the baseline."""
    factor = factor or {side: rng.normal(0.0, PROCESS_SD, repeats) for side in "ab"}
    out = []
    for i in range(rows):
        latency = 10 ** rng.uniform(*log_ms)
        times = {}
        for side, change in (("a", 1.0), ("b", effect)):
            jitter, control_jitter = rng.normal(0, ROW_SD, repeats), rng.normal(0, CONTROL_SD, repeats)
            times[side] = list(np.exp(np.log(latency * change) + follows * factor[side] + jitter))
            times[side + "_control"] = list(np.exp(np.log(latency) + factor[side] + control_jitter)) if controls else []
        out.append(compare.PairedRow(
            op=op, dtype="fp32", shape=(i,), a_ms=times["a"], b_ms=times["b"], a_control_ms=times["a_control"],
            b_control_ms=times["b_control"], timers={"graph"}, flags=[], configs_a={}, configs_b={},
            comparison=stats.compare(times["a"], times["b"]),
            a_procs=[f"{op}/A-{j}" for j in range(repeats)], b_procs=[f"{op}/B-{j}" for j in range(repeats)]))
    return out


def _judged(rows):
    compare.judge(rows)
    return rows


def test_taking_out_the_process_factor_calls_a_one_percent_change_that_it_hides():
    rng = np.random.default_rng(28)
    with_baseline = _judged([r for k in range(50) for r in _op_rows(rng, f"op{k}", 10, 5, 1.01)])
    rng = np.random.default_rng(28)
    without = _judged([r for k in range(50) for r in _op_rows(rng, f"op{k}", 10, 5, 1.01, controls=False)])
    assert sum(r.verdict == stats.SLOWER for r in with_baseline) >= 0.9 * 500
    # The same latencies judged without a baseline to measure the factor by: the factor stays in as noise.
    assert sum(r.verdict == stats.SLOWER for r in without) < 0.7 * 500
    # Each op's fitted beta: near the true 1 (slightly under: the baseline's own jitter blurs the offsets).
    # (An op whose sides' processes happen to differ like a moved baseline, at 5%, keeps its latencies.)
    betas = [r.process_factor for r in with_baseline[::10] if r.process_factor is not None]
    assert len(betas) >= 0.85 * 50 and 0.8 < np.mean(betas) < 1.1 and min(betas) > 0.3
    assert all(r.process_factor is None for r in without)


@pytest.mark.parametrize("rows", [10, 20])
def test_the_process_factor_adds_no_false_calls(rows):
    # 100 null reports of 10 ops: at most 5 may call anything (FDR 5%). A band whose sides' factors differed
    # beyond their spread within a side at p 0.05 (compare.BASELINE_MOVED_P) kept them in: 7 and 11 reports.
    rng = np.random.default_rng(29)
    reports = [_judged([r for k in range(10) for r in _op_rows(rng, f"op{k}", rows, 3)]) for _ in range(100)]
    assert sum(any(_called(r)) for r in reports) <= 5


def _controls_on(rows, keep):
    """The rows with their baseline left out (a timing-only replay's, compare.control_cases) but on `keep`
    of them a band, spread: each op's process factor read from those alone."""
    for op in dict.fromkeys(r.op for r in rows):
        mine = sorted((r for r in rows if r.op == op), key=lambda r: stats.center(r.a_ms))
        kept = compare.spread(len(mine), keep)
        for i, r in enumerate(mine):
            if i not in kept:
                r.a_control_ms, r.b_control_ms = [], []
    return rows


def test_a_process_factor_read_from_a_bands_controls_alone_calls_as_many_and_no_more_falsely():
    # 20 rows an op, one band, 5 repeats: the baseline timed on 12 of them (compare.CONTROLS_PER_BAND)
    # against all 20. The factor is a median over the controls' offsets: fewer of them widen it a little.
    n = compare.CONTROLS_PER_BAND
    rng = np.random.default_rng(40)
    every = _judged([r for k in range(40) for r in _op_rows(rng, f"op{k}", 20, 5, 1.01)])
    rng = np.random.default_rng(40)
    some = _judged(_controls_on([r for k in range(40) for r in _op_rows(rng, f"op{k}", 20, 5, 1.01)], n))
    called = {name: sum(r.verdict == stats.SLOWER for r in rows) for name, rows in (("every", every), ("some", some))}
    assert called["some"] >= 0.9 * 800 and called["some"] >= 0.97 * called["every"]
    # Each op's rows without a baseline are adjusted too (an op whose sides' baselines happen to differ as a moved
    # baseline would, at 5%, keeps its latencies, as with every baseline).
    adjusted = [all(r.process_factor is not None for r in some[k:k + 20]) for k in range(0, 800, 20)]
    assert sum(adjusted) >= 0.85 * 40
    # Null reports (10 ops of 20 rows, 3 repeats), each judged with every baseline and with the band's controls
    # alone: no more false calls with fewer controls, beyond the binomial room of either count.
    false_calls = {}
    for keep in (20, n):
        rng = np.random.default_rng(41)
        null = [_judged(_controls_on([r for k in range(10) for r in _op_rows(rng, f"op{k}", 20, 3)], keep))
                for _ in range(60)]
        false_calls[keep] = (sum(any(_called(r)) for r in null), sum(sum(_called(r)) for r in null))
    (reports_every, calls_every), (reports_some, calls_some) = false_calls[20], false_calls[n]
    assert reports_some <= reports_every + 5 and calls_some <= 1.25 * calls_every + 3


def test_the_change_under_test_is_not_taken_out_with_the_process_factor():
    # No noise but the processes' factors, shared by candidate and baseline: the whole 1% stays in the
    # ratio, the factors (A's processes 1% slow on average against B's) go.
    factor = {"a": [1.02, 1.0, 1.01, 1.03], "b": [1.0, 0.99, 1.01, 1.0]}
    rows = []
    for i, latency in enumerate([0.11, 0.2, 0.3, 0.5, 0.9]):
        a = [latency * f for f in factor["a"]]
        b = [latency * 1.01 * f for f in factor["b"]]
        rows.append(compare.PairedRow(
            op="op", dtype="fp32", shape=(i,), a_ms=a, b_ms=b, a_control_ms=[latency * 0.9 * f for f in factor["a"]],
            b_control_ms=[latency * 0.9 * f for f in factor["b"]], timers={"graph"}, flags=[], configs_a={},
            configs_b={}, comparison=stats.compare(a, b),
            a_procs=[f"A-{j}" for j in range(4)], b_procs=[f"B-{j}" for j in range(4)]))
    assert all(r.comparison.ratio < 1.0 for r in rows)  # as measured, B looks faster
    compare.judge(rows)
    assert all(abs(r.comparison.ratio - 1.01) < 1e-9 for r in rows)
    assert all(r.verdict == stats.SLOWER and r.process_factor == pytest.approx(1.0) for r in rows)


def test_a_kernel_that_does_not_follow_the_baseline_keeps_its_latencies():
    rng = np.random.default_rng(31)
    rows = _judged(_op_rows(rng, "op", 20, 5, follows=0.0))
    assert rows[0].process_factor < 0.2
    few = _judged(_op_rows(rng, "op", compare.MIN_FACTOR_ROWS - 1, 5))
    assert all(r.process_factor is None for r in few)


def test_the_process_factor_is_fitted_per_latency_band():
    # One op's processes: its 0.1-1 ms rows follow their baselines, its 2-4 us rows (bound by their
    # launch) do not. One beta over both would move the small rows by a factor they never had.
    rng = np.random.default_rng(32)
    factor = {side: rng.normal(0.0, PROCESS_SD, 5) for side in "ab"}
    big = _op_rows(rng, "op", 10, 5, factor=factor)
    small = _op_rows(rng, "op", 10, 5, follows=0.0, log_ms=(-2.7, -2.4), factor=factor)
    for i, r in enumerate(small):
        r.shape = (100 + i,)
    compare.judge(big + small)
    assert all(r.process_factor > 0.5 for r in big)
    assert all(r.process_factor < 0.3 for r in small)


def test_a_baseline_that_a_side_moved_is_not_taken_for_the_processes_factor():
    # B's own torch runs the baseline 3% slower in every process: that is the side's, not a process's,
    # and taking it out would move every row of B by it.
    rng = np.random.default_rng(33)
    rows = _op_rows(rng, "op", 10, 5)
    for r in rows:
        r.b_control_ms = [x * 1.03 for x in r.b_control_ms]
    as_measured = [stats.compare(r.a_ms, r.b_ms).ratio for r in rows]
    compare.judge(rows)
    assert all(r.process_factor is None for r in rows)
    assert [r.comparison.ratio for r in rows] == pytest.approx(as_measured)
