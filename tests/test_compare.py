"""Pairing A and B rows from run dirs written by hand (reports.compare): which latencies a row
gets, which flags keep it out of the headline, and what the summary counts."""

import json
import math

import numpy as np
import pytest
from result_rows import result_row

from harness.core.results import ResultRow
from reports import ab_report, compare, stats


def row(op="softmax", dtype="fp16", shape=(4, 16), status="SUCCESS", cand=1.0, base=2.0, timer="graph",
        markers=None, configs=None, raw=None, error=None):
    return result_row(op, dtype, shape, status, baseline_ms=base, candidate_ms=cand, timer=timer, markers=markers or [],
                      configs=configs or {}, error=error,
                      samples=None if raw is None else {"candidate": {"raw": raw[0]}, "baseline": {"raw": raw[1]}})


def run_dir(tmp_path, name, *rows):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"format": 1, "rows": list(rows)}))
    return d


def runs(tmp_path, side, *per_run_rows):
    return [run_dir(tmp_path, f"{side}{i}", *rows) for i, rows in enumerate(per_run_rows)]


def test_a_case_skipped_in_every_run_of_both_sides_is_no_row_but_skipped_on_one_side_is_incomplete(tmp_path):
    skipped = lambda dtype: row(dtype=dtype, status="SKIPPED", cand=None, base=None)  # noqa: E731
    a = runs(tmp_path, "a", [row(), skipped("bf16"), skipped("fp32")], [row(), skipped("bf16"), skipped("fp32")])
    b = runs(tmp_path, "b", [row(), skipped("bf16"), row(dtype="fp32")], [row(), skipped("bf16")])
    paired = {p.dtype: p for p in compare.pair(a, b)}
    assert set(paired) == {"fp16", "fp32"} and paired["fp16"].flags == []
    # fp32: measured once on B, declined on A: incomplete on both sides, never a complete pairing.
    assert paired["fp32"].flags == ["incomplete_a(0/2)", "incomplete_b(1/2)"]
    # Skipped everywhere but a run of B short: that run is missing, so the row stays, incomplete.
    short = runs(tmp_path, "c", [skipped("bf16")])
    bf16 = [p for p in compare.pair(a, short, expected=2) if p.dtype == "bf16"]
    assert [p.flags for p in bf16] == [["incomplete_a(0/2)", "incomplete_b(0/2)"]]


def test_repeats_pair_by_op_dtype_shape_with_one_median_per_run(tmp_path):
    a = runs(tmp_path, "a", [row(cand=1.0, base=2.0), row(dtype="bf16", cand=5.0)],
             [row(dtype="bf16", cand=5.1), row(cand=1.1, base=2.2)])
    b = runs(tmp_path, "b", [row(cand=0.5, base=2.1), row(dtype="bf16", cand=5.2)],
             [row(cand=0.6, base=2.3), row(dtype="bf16", cand=5.3)])
    paired = compare.pair(a, b)
    assert [p.key for p in paired] == [("softmax", "fp16", (4, 16)), ("softmax", "bf16", (4, 16))]
    fp16 = paired[0]
    assert (fp16.a_ms, fp16.b_ms) == ([1.0, 1.1], [0.5, 0.6])
    assert (fp16.a_control_ms, fp16.b_control_ms) == ([2.0, 2.2], [2.1, 2.3])
    assert fp16.comparison == stats.compare([1.0, 1.1], [0.5, 0.6])
    assert fp16.flags == [] and fp16.timers == {"graph"} and fp16.in_headline


def test_a_row_only_in_b_is_paired_after_a_rows_and_left_unpaired(tmp_path):
    a = runs(tmp_path, "a", [row(shape=(8,))])
    b = runs(tmp_path, "b", [row(shape=(9,)), row(shape=(8,))])
    paired = compare.pair(a, b)
    assert [p.shape for p in paired] == [(8,), (9,)]
    only_b = paired[1]
    assert only_b.flags == ["incomplete_a(0/1)"] and only_b.a_ms == [] and only_b.b_ms == [1.0]
    assert only_b.comparison is None and not only_b.in_headline
    assert only_b.configs_a == {}


def test_a_row_only_in_a_has_no_b_configs(tmp_path):
    a = runs(tmp_path, "a", [row(shape=(8,), configs={"k": 1})])
    b = runs(tmp_path, "b", [row(shape=(9,))])
    only_a = compare.pair(a, b)[0]
    assert only_a.shape == (8,) and only_a.flags == ["incomplete_b(0/1)"] and only_a.b_ms == []
    assert only_a.configs_a == {"k": 1} and only_a.configs_b == {} and not only_a.config_differs


def test_a_scalar_op_without_shape_pairs_under_the_empty_shape(tmp_path):
    a = runs(tmp_path, "a", [row(shape=None)])
    b = runs(tmp_path, "b", [row(shape=None, cand=1.5)])
    (paired,) = compare.pair(a, b)
    assert paired.shape == () and paired.comparison.ratio == pytest.approx(1.5)


def test_one_run_per_side_compares_raw_samples(tmp_path):
    a = runs(tmp_path, "a", [row(cand=1.0, raw=([1.0, 1.01, 0.99], [2.0, 2.02]))])
    b = runs(tmp_path, "b", [row(cand=0.5, raw=([0.5, 0.51, 0.49], [2.1, 2.12]))])
    (paired,) = compare.pair(a, b)
    assert paired.a_ms == [1.0, 1.01, 0.99] and paired.b_ms == [0.5, 0.51, 0.49]
    assert paired.a_control_ms == [2.0, 2.02] and paired.b_control_ms == [2.1, 2.12]
    assert paired.comparison.n_a == 3 and paired.comparison.verdict == stats.FASTER


def test_a_row_whose_baseline_a_run_did_not_time_has_no_control_rather_than_a_nan_one(tmp_path):
    # A timing-only replay times the baseline only where a process factor reads it (control_cases): a row
    # left out in some run has no control at all, repeated or single, and the report's control stays a number.
    a = runs(tmp_path, "a", [row(base=None), row(dtype="bf16")], [row(base=None), row(dtype="bf16", base=2.2)])
    b = runs(tmp_path, "b", [row(base=None), row(dtype="bf16")], [row(base=2.0), row(dtype="bf16", base=2.2)])
    fp16, bf16 = compare.pair(a, b)
    assert (fp16.a_control_ms, fp16.b_control_ms) == ([], []) and fp16.comparison is not None
    assert (bf16.a_control_ms, bf16.b_control_ms) == ([2.0, 2.2], [2.0, 2.2])
    assert compare.summarize([fp16, bf16]).control[0] == pytest.approx(1.0)
    one = row(cand=1.0)
    one["samples"] = {"candidate": {"raw": [1.0, 1.01, 0.99]}}
    (single,) = compare.pair(runs(tmp_path, "c", [one]), runs(tmp_path, "d", [one]))
    assert single.single and (single.a_control_ms, single.b_control_ms) == ([], [])


def test_an_ab_stopped_after_its_first_repeat_takes_no_raw_samples_for_repeats_and_calls_nothing(tmp_path):
    a = runs(tmp_path, "a", [row(cand=1.0, raw=([1.0, 1.01, 0.99], [2.0, 2.02]))])
    b = runs(tmp_path, "b", [row(cand=0.5, raw=([0.5, 0.51, 0.49], [2.1, 2.12]))])
    (paired,) = compare.pair(a, b, expected=5)
    assert paired.a_ms == [1.0] and paired.b_ms == [0.5] and not paired.single
    assert paired.comparison.verdict == stats.NOISY
    assert paired.flags == ["incomplete_a(1/5)", "incomplete_b(1/5)"]


def test_one_run_per_side_without_samples_uses_the_median(tmp_path):
    a = runs(tmp_path, "a", [row(cand=1.0)])
    b = runs(tmp_path, "b", [row(cand=0.5)])
    (paired,) = compare.pair(a, b)
    assert paired.a_ms == [1.0] and paired.b_ms == [0.5]


def test_one_run_against_repeats_uses_medians_on_both_sides(tmp_path):
    samples = ([9.0, 9.0], [9.0, 9.0])
    a = runs(tmp_path, "a", [row(cand=1.0, raw=samples)])
    b = runs(tmp_path, "b", [row(cand=0.5, raw=samples)], [row(cand=0.6, raw=samples)])
    (paired,) = compare.pair(a, b)
    assert paired.a_ms == [1.0] and paired.b_ms == [0.5, 0.6]


def test_repeats_ignore_raw_samples(tmp_path):
    samples = ([9.0, 9.0], [9.0, 9.0])
    a = runs(tmp_path, "a", [row(cand=1.0, raw=samples)], [row(cand=1.1, raw=samples)])
    b = runs(tmp_path, "b", [row(cand=0.5, raw=samples)], [row(cand=0.6, raw=samples)])
    (paired,) = compare.pair(a, b)
    assert paired.a_ms == [1.0, 1.1] and paired.b_ms == [0.5, 0.6]


def test_fallback_markers_flag_the_row_and_failed_rows_do_not_count(tmp_path):
    a = runs(tmp_path, "a", [row(markers=["TIMER_FALLBACK: graph capture failed", "AUTOTUNE_REPLAY_FALLBACK k"])],
             [row(markers=["TIMER_MIXED baseline=host"])])
    b = runs(tmp_path, "b", [row(status="FAILED", markers=["OTHER"], timer="host",
                                 error="AssertionError: candidate disagrees with baseline\nMismatched elements")],
             [row()])
    (paired,) = compare.pair(a, b)
    assert paired.flags == ["replay_fallback", "timer_fallback", "timer_mixed", "failed_b(1/2)", "incomplete_b(1/2)"]
    assert paired.timers == {"graph"}  # the FAILED row's timer is not among the sides' timers
    assert paired.comparison is not None and not paired.in_headline
    # The failure is said, with the side's first error line: B computing wrong answers is news.
    assert paired.errors == {"b": "AssertionError: candidate disagrees with baseline"}


def test_a_side_whose_row_errored_on_every_repeat_is_flagged_failed_with_no_comparison(tmp_path):
    a = runs(tmp_path, "a", [row()], [row()])
    b = runs(tmp_path, "b", [row(status="ERROR", error="")], [row(status="ERROR", error="")])
    (paired,) = compare.pair(a, b, expected=2)
    assert paired.flags == ["failed_b(2/2)", "incomplete_b(0/2)"] and paired.comparison is None
    assert paired.errors == {"b": "no error text recorded"}
    summary = compare.summarize([paired])
    assert summary.headline_rows == 0 and summary.excluded["failed_b"] == 1
    lines = ab_report.failed_lines([paired])
    assert lines[0].endswith(": 1") and "B no error text recorded" in lines[1]


@pytest.mark.parametrize("marker,flag", [("TIMER_FALLBACK", "timer_fallback"),
                                         ("AUTOTUNE_REPLAY_FALLBACK", "replay_fallback"),
                                         ("TIMER_MIXED", "timer_mixed"),
                                         ("CLOCK_THROTTLED", "clock_throttled"),
                                         ("NO_DEVICE_WORK side=candidate", "no_device_work")])
def test_each_marker_alone_gives_its_flag(tmp_path, marker, flag):
    a = runs(tmp_path, "a", [row(markers=[f"{marker}: why"])])
    b = runs(tmp_path, "b", [row(markers=["UNRELATED"])])
    assert compare.pair(a, b)[0].flags == [flag]


def test_a_baseline_without_device_work_leaves_the_row_in_the_headline(tmp_path):
    a = runs(tmp_path, "a", [row(markers=["NO_DEVICE_WORK side=baseline detail='x'"])])
    b = runs(tmp_path, "b", [row()])
    assert compare.pair(a, b)[0].in_headline


def test_expected_repeats_flag_a_side_that_ran_fewer(tmp_path):
    a = runs(tmp_path, "a", [row()], [row()])
    b = runs(tmp_path, "b", [row()], [row()], [row()])
    assert compare.pair(a, b, expected=3)[0].flags == ["incomplete_a(2/3)"]
    assert compare.pair(a, b)[0].flags == []


def test_sides_timed_by_different_timers_are_flagged(tmp_path):
    a = runs(tmp_path, "a", [row(timer="graph")])
    b = runs(tmp_path, "b", [row(timer="direct")])
    (paired,) = compare.pair(a, b)
    assert paired.flags == ["timer_mismatch"] and paired.timers == {"graph", "direct"}


def test_timings_that_are_not_performance_get_no_verdict(tmp_path):
    a = runs(tmp_path, "a", [row(cand=2.0)], [row(cand=2.0)])
    b = runs(tmp_path, "b", [row(cand=1.0)], [row(cand=1.0)])
    (paired,) = compare.pair(a, b, performance=False)
    assert paired.comparison.verdict == stats.NOT_APPLICABLE and paired.comparison.ratio == pytest.approx(0.5)
    assert compare.pair(a, b)[0].comparison.verdict == stats.FASTER


@pytest.mark.parametrize("configs_a,configs_b,differs", [
    ({"k": {"BLOCK": 64}}, {"k": {"BLOCK": 128}}, True),
    ({"k": {"BLOCK": 64}}, {"k": {"BLOCK": 64}}, False),
    ({}, {"k": {"BLOCK": 128}}, False),  # a side without autotune records has nothing to differ
    ({"k": {"BLOCK": 64}}, {}, False),
])
def test_config_differs_compares_the_first_successful_run_of_each_side(tmp_path, configs_a, configs_b, differs):
    a = runs(tmp_path, "a", [row(status="ERROR", configs={"k": "failed"})], [row(configs=configs_a)])
    b = runs(tmp_path, "b", [row(configs=configs_b)], [row(configs={"k": "later"})])
    (paired,) = compare.pair(a, b)
    assert paired.configs_a == configs_a and paired.configs_b == configs_b
    assert paired.config_differs is differs


def test_summary_counts_headline_exclusions_verdicts_and_means(tmp_path):
    a = runs(tmp_path, "a",
             [row(shape=(1,), cand=1.0, base=2.0), row(shape=(2,), cand=1.0, base=2.0, configs={"k": 1}),
              row(op="mm", shape=(3,), cand=4.0, base=1.0), row(op="mm", shape=(4,), markers=["TIMER_FALLBACK"]),
              row(op="mm", shape=(5,))],
             [row(shape=(1,), cand=1.0, base=2.0), row(shape=(2,), cand=1.0, base=2.0, configs={"k": 1}),
              row(op="mm", shape=(3,), cand=4.0, base=1.0), row(op="mm", shape=(4,)),
              row(op="mm", shape=(5,), status="FAILED")])
    b = runs(tmp_path, "b",
             [row(shape=(1,), cand=1.1, base=2.0), row(shape=(2,), cand=0.9, base=2.0, configs={"k": 2}),
              row(op="mm", shape=(3,), cand=2.0, base=1.0), row(op="mm", shape=(4,)), row(op="mm", shape=(5,)),
              row(op="mm", shape=(6,))],
             [row(shape=(1,), cand=1.1, base=2.0), row(shape=(2,), cand=0.9, base=2.0, configs={"k": 2}),
              row(op="mm", shape=(3,), cand=2.0, base=1.0), row(op="mm", shape=(4,)), row(op="mm", shape=(5,)),
              row(op="mm", shape=(6,))])
    rows = compare.pair(a, b)
    s = compare.summarize(rows)
    assert s.rows == 6 and s.headline_rows == 3
    # shape 4: timer fallback; shape 5: A failed once; shape 6: only in B (incomplete and unpaired).
    assert s.excluded == {"timer_fallback": 1, "failed_a": 1, "incomplete_a": 2, "unpaired": 1}
    assert s.verdicts == {stats.SLOWER: 1, stats.FASTER: 2}
    assert s.config_differs == 1
    assert s.per_op["softmax"] == pytest.approx(stats.geomean([1.1, 0.9]))
    # mm has one headline row: its line keeps that row's own interval (equal repeats: a hair wide, as
    # their variance is stats.MIN_VARIANCE).
    mm = next(r for r in rows if r.key == ("mm", "fp16", (3,)))
    assert s.per_op["mm"] == (mm.comparison.ratio, mm.comparison.lo, mm.comparison.hi)
    assert s.per_op["mm"] == pytest.approx((0.5,) * 3, rel=1e-5)
    assert list(s.per_op) == ["softmax", "mm"]
    assert s.overall == pytest.approx(stats.geomean([1.1, 0.9, 0.5]))
    # The torch baseline did not move on any headline row.
    assert s.control[0] == pytest.approx(1.0)
    assert s.control[1:] == pytest.approx((1.0, 1.0))


def test_summary_control_leaves_out_rows_without_baseline_timings(tmp_path):
    a = runs(tmp_path, "a", [row(shape=(1,), base=2.0), row(shape=(2,), base=1.0)])
    b = runs(tmp_path, "b", [row(shape=(1,), base=3.0), row(shape=(2,), base=1.0)])
    rows = compare.pair(a, b)
    rows[1].a_control_ms = []
    assert compare.summarize(rows).control[0] == pytest.approx(1.5)
    rows[0].b_control_ms = []
    assert math.isnan(compare.summarize(rows).control[0])


# reports.stats, beyond tests/test_stats.py: the edges of each rule.

def test_a_side_with_one_latency_takes_the_other_sides_spread_and_one_a_side_is_unbounded():
    # Both sides' spreads are pooled (the same code under the null): B's three repeats say how much
    # a repeat varies, for A's one too.
    a, b = [1.0], [2.0, 2.1, 1.9]
    c = stats.compare(a, b)
    own, dof = stats.residual(a, b)
    assert (c.n_a, c.n_b) == (1, 3) and c.margin == stats.MARGIN
    assert dof == c.dof == 2 and c.sd == pytest.approx(math.sqrt(own))
    assert 1.0 + stats.MARGIN < c.lo < c.ratio < c.hi < math.inf and c.verdict == stats.SLOWER
    # One latency a side and no prior: nothing says how much a repeat varies.
    one = stats.compare([1.0], [2.0])
    assert (one.lo, one.hi) == (0.0, math.inf) and one.verdict == stats.NOISY and one.p == 1.0


def test_two_repeats_a_side_can_call_a_clear_change():
    c = stats.compare([1.0, 1.001], [2.0, 2.002])
    assert c.verdict == stats.SLOWER and 1.9 < c.lo < 2.0 < c.hi < 2.1


def test_sides_without_spread_have_the_smallest_variance_and_a_hair_wide_interval():
    # Repeats equal to the timer's last digit: the variance is MIN_VARIANCE, not 0 (no division by 0).
    c = stats.compare([1.0, 1.0, 1.0], [1.5, 1.5])
    assert c.sd == pytest.approx(math.sqrt(stats.MIN_VARIANCE)) and c.dof == 3
    assert c.lo < c.ratio < c.hi and (c.lo, c.ratio, c.hi) == pytest.approx((1.5,) * 3, rel=1e-5)
    assert c.verdict == stats.SLOWER and c.p < 1e-9


def test_an_empty_side_is_refused():
    for a, b in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match="^both sides need at least one latency$"):
            stats.compare(a, b)


def test_a_given_margin_replaces_the_default_for_calls_and_widens_same():
    a = [1.0, 1.0001, 0.9999, 1.0]
    half = [x * 1.005 for x in a]
    assert stats.compare(a, half).verdict == stats.SLOWER  # beyond the default 0.3%
    c = stats.compare(a, half, margin=compare.SINGLE_RUN_MARGIN)
    assert c.margin == compare.SINGLE_RUN_MARGIN and c.verdict == stats.SAME  # within SAME_MARGIN
    # 2%: short of a 3% margin, and the row cannot tell 1% from nothing: SAME within that margin.
    assert stats.compare(a, [x * 1.02 for x in a], margin=compare.SINGLE_RUN_MARGIN).verdict == stats.SAME
    assert stats.compare(a, [x * 1.04 for x in a], margin=compare.SINGLE_RUN_MARGIN).verdict == stats.SLOWER


def test_two_repeats_a_side_give_the_pooled_t_interval_and_its_two_one_sided_tests():
    from scipy import stats as sps

    a, b = [1.0, 1.1], [1.12, 1.3]
    c = stats.compare(a, b)
    la, lb = np.log(a), np.log(b)
    lo, hi = sps.ttest_ind(lb, la, equal_var=True).confidence_interval(0.95)
    assert (c.lo, c.hi) == pytest.approx((math.exp(lo), math.exp(hi)))
    # p: the more significant of "B/A above 1 + margin" and "below 1 - margin", doubled.
    up = sps.ttest_ind(lb - math.log1p(stats.MARGIN), la, alternative="greater").pvalue
    down = sps.ttest_ind(lb - math.log1p(-stats.MARGIN), la, alternative="less").pvalue
    assert 0.05 < c.p < 1.0 and c.p == pytest.approx(min(1.0, 2 * min(up, down)))


def test_the_spread_of_two_ratios_uses_one_degree_of_freedom():
    assert stats.spread([1.0, math.exp(0.01)]) == pytest.approx(math.expm1(3 * 0.01 / math.sqrt(2)))


def test_delta_is_the_ratio_in_percent():
    assert stats.compare([2.0], [2.1]).delta_pct == pytest.approx(5.0)
    assert stats.compare([2.0], [1.8]).delta_pct == pytest.approx(-10.0)


@pytest.mark.parametrize("lo,hi,verdict", [
    (0.900, 0.995, stats.NOISY), (1.005, 1.100, stats.NOISY),  # touching the margin is not beyond it
    (0.995, 1.005, stats.SAME),                                # the margin itself is within SAME
    (0.990, 1.010, stats.SAME),                                # SAME's width is SAME_MARGIN, not the margin
])
def test_verdict_at_the_margin_itself(lo, hi, verdict):
    assert stats.verdict(lo, hi, 0.005) == verdict


def test_a_wide_margin_still_calls_and_same_claims_the_wider_of_it_and_one_percent():
    # A single-run row's 3% margin: a change beyond it is called either way; SAME claims no change
    # beyond the margin (it cannot tell 1% from nothing), never less than SAME_MARGIN.
    assert stats.verdict(1.5, 2.0, compare.SINGLE_RUN_MARGIN) == stats.SLOWER
    assert stats.verdict(0.5, 0.96, compare.SINGLE_RUN_MARGIN) == stats.FASTER
    assert stats.verdict(0.98, 1.02, compare.SINGLE_RUN_MARGIN) == stats.SAME
    assert stats.verdict(0.96, 1.02, compare.SINGLE_RUN_MARGIN) == stats.NOISY
    assert stats.verdict(0.999, 1.001, compare.SINGLE_RUN_MARGIN) == stats.SAME
    assert (stats.MARGIN, stats.SAME_MARGIN, compare.SINGLE_RUN_MARGIN) == (0.003, 0.01, 0.03)


def test_geomean_interval_is_the_t_interval_of_the_log_ratios():
    from scipy import stats as sps

    ratios = [1.02, 0.97, 1.10, 1.01]
    gm, lo, hi = stats.geomean(ratios)
    logs = [math.log(r) for r in ratios]
    assert gm == pytest.approx(math.exp(sum(logs) / 4))
    ci = sps.ttest_1samp(logs, 0.0).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))


def test_geomean_of_too_few_rows():
    assert all(math.isnan(x) for x in stats.geomean([]))
    gm, lo, hi = stats.geomean([2.0])
    assert gm == pytest.approx(2.0) and math.isnan(lo) and math.isnan(hi)


@pytest.mark.parametrize("ratio,words", [(math.nan, "n/a"), (math.inf, "n/a"), (1.00005, "no change"),
                                         (0.99995, "no change"), (1.0002, "1.000x slower"), (0.9997, "1.000x faster")])
def test_direction_in_words_at_the_edges(ratio, words):
    assert stats.describe(ratio) == words


def test_clock_throttled_rows_leave_the_headline_naming_their_slowdowns_per_side(tmp_path):
    hot = "CLOCK_THROTTLED reasons=sw_power_cap,hw_slowdown kind=slowdown sm_clock_mhz=1980->1500"
    a = runs(tmp_path, "a", [row(), row(shape=(8,))], [row(markers=[hot]), row(shape=(8,))])
    b = runs(tmp_path, "b", [row(markers=["CLOCK_THROTTLED reasons=hw_thermal_slowdown sm_clock_mhz=1->2"]),
                             row(shape=(8,))], [row(), row(shape=(8,))])
    throttled, clean = compare.pair(a, b)
    assert throttled.flags == ["clock_throttled"] and not throttled.in_headline
    assert throttled.throttled == {"a": ["hw_slowdown", "sw_power_cap"], "b": ["hw_thermal_slowdown"]}
    # Fields are split at their first "=" only (a value may hold one); a marker without reasons says "?".
    odd = [ResultRow.from_dict(row(markers=[m]), "test") for m in
           ("CLOCK_THROTTLED detail=clocks=low reasons=hw_slowdown", "CLOCK_THROTTLED sm_clock_mhz=1980->1500")]
    assert compare._slowdowns(odd) == ["?", "hw_slowdown"]
    assert clean.throttled == {} and clean.in_headline
    s = compare.summarize([throttled, clean])
    assert s.headline_rows == 1 and s.excluded == {"clock_throttled": 1}


def test_a_power_cap_on_every_repeat_of_a_side_stays_in_the_headline_else_it_leaves(tmp_path):
    cap = "CLOCK_THROTTLED reasons=sw_power_cap kind=power_cap sm_clock_mhz=1980->1410"
    hot = "CLOCK_THROTTLED reasons=hw_thermal_slowdown kind=slowdown sm_clock_mhz=1980->1500"
    legacy = "CLOCK_THROTTLED reasons=sw_power_cap sm_clock_mhz=1980->1410"  # no kind: not known to be a cap
    shapes = {"steady": (1,), "spared": (2,), "hot": (3,), "legacy": (4,), "a_only": (5,), "a_spared": (6,)}
    a = runs(tmp_path, "a", *[[row(shape=(1,), markers=[cap]), row(shape=(2,), markers=[cap]),
                               row(shape=(3,), markers=[cap]), row(shape=(4,), markers=[cap]),
                               row(shape=(5,), markers=[cap]), row(shape=(6,), markers=[cap] if i else [])]
                              for i in range(3)])
    b = runs(tmp_path, "b", [row(shape=(1,), markers=[cap]), row(shape=(2,), markers=[cap]),
                             row(shape=(3,), markers=[cap, hot]), row(shape=(4,), markers=[legacy]),
                             row(shape=(5,)), row(shape=(6,))],
             [row(shape=(1,), markers=[cap]), row(shape=(2,)),  # one B repeat ran uncapped
              row(shape=(3,), markers=[cap]), row(shape=(4,), markers=[cap]), row(shape=(5,)), row(shape=(6,))],
             [row(shape=(1,), markers=[cap]), row(shape=(2,), markers=[cap]),
              row(shape=(3,), markers=[cap]), row(shape=(4,), markers=[cap]), row(shape=(5,)), row(shape=(6,))])
    got = {r.shape: r for r in compare.pair(a, b)}
    for name in ("steady", "a_only"):  # the cap on every repeat of the side(s) it hit: like for like
        assert got[shapes[name]].flags == [] and got[shapes[name]].in_headline, name
    assert got[shapes["steady"]].throttled == {"a": ["sw_power_cap"], "b": ["sw_power_cap"]}
    assert got[shapes["a_only"]].throttled == {"a": ["sw_power_cap"]}
    for name in ("spared", "hot", "legacy", "a_spared"):
        assert got[shapes[name]].flags == ["clock_throttled"] and not got[shapes[name]].in_headline, name
    lines = ab_report.throttled_lines(list(got.values()))
    assert lines[0].startswith("CLOCK_THROTTLED rows (a thermal or power slowdown hit their measurement; "
                               "out of the headline): 4")
    assert lines[5].startswith("CLOCK_THROTTLED rows kept in the headline (the board's power cap on every "
                               "repeat of the side it hit") and lines[5].endswith(": 2")
    assert lines[6:] == ["  softmax fp16 1: A sw_power_cap; B sw_power_cap", "  softmax fp16 5: A sw_power_cap"]


def test_each_side_keeps_its_first_successful_runs_kernels(tmp_path):
    ka, kb = [{"name": "k", "share": 1.0}], [{"name": "k2", "share": 0.7}, {"name": "k", "share": 0.3}]
    a = runs(tmp_path, "a", [dict(row(status="FAILED"), kernels=[{"name": "x", "share": 1.0}])],
             [dict(row(), kernels=ka)])
    b = runs(tmp_path, "b", [dict(row(), kernels=kb)], [row()])
    (paired,) = compare.pair(a, b)
    assert paired.kernels == {"a": ka, "b": kb}
    assert compare.pair(runs(tmp_path, "c", [row()]), runs(tmp_path, "d", [row()]))[0].kernels == {}


def test_kernels_come_from_each_sides_passes_run_whose_timings_no_verdict_uses(tmp_path):
    ka = [{"name": "k", "share": 1.0}]
    timed_a = runs(tmp_path, "a", [row(cand=1.0)], [row(cand=1.001)], [row(cand=0.999)])
    timed_b = runs(tmp_path, "b", [row(cand=1.0)], [row(cand=1.001)], [row(cand=0.999)])
    # The passes runs are 20% slow (the profiler ran in them): none of that may reach the row.
    passes = (run_dir(tmp_path, "pa", dict(row(cand=1.2), kernels=ka)),
              run_dir(tmp_path, "pb", dict(row(cand=1.2, status="FAILED"), kernels=[{"name": "x", "share": 1.0}])))
    (paired,) = compare.pair(timed_a, timed_b, profiled=passes)
    assert paired.a_ms == [1.0, 1.001, 0.999] and paired.b_ms == [1.0, 1.001, 0.999]
    assert paired.kernels == {"a": ka}  # B's passes row failed: no kernels of its, none from its timed runs
    assert compare.profiled_run({"A": timed_a, "A-passes": [passes[0]]}, "A") == passes[0]
    assert compare.profiled_run({"A": timed_a}, "A") == timed_a[0]  # every step profiled: the first repeat
    assert compare.profiled_run({"A": []}, "A") is None


def test_a_lone_row_keeps_its_own_interval_in_the_per_op_and_overall_lines(tmp_path):
    a = runs(tmp_path, "a", [row(cand=1.0)], [row(cand=1.02)], [row(cand=0.98)])
    b = runs(tmp_path, "b", [row(cand=1.1)], [row(cand=1.13)], [row(cand=1.08)])
    rows = compare.pair(a, b)
    c = rows[0].comparison
    s = compare.summarize(rows)
    assert c.lo < c.ratio < c.hi and math.isfinite(c.hi)
    assert s.per_op["softmax"] == s.overall == (c.ratio, c.lo, c.hi)


# compare.judge: the report's verdicts over all its rows, each row's variance moderated by a prior
# learnt from the unflagged rows of similar latency.

def test_the_prior_is_trended_over_rows_within_2x_latency_either_way_else_the_nearest():
    # Two bands 4x apart, equal variances within each (an exact prior, infinite dof): a row's prior
    # variance is the mean variance of its band.
    v, w = 1e-4, 9e-4
    model = stats.PriorModel([v] * 3 + [w] * 3, [4] * 6, [1.0] * 3 + [4.0] * 3)
    at = {x: model.at(x) for x in (0.4, 1.0, 1.9, 2.0, 2.1, 8.0, 9.0)}
    assert all(p.dof == math.inf for p in at.values())
    assert at[1.0].variance == pytest.approx(v) and at[8.0].variance == pytest.approx(w)
    assert at[1.9].variance == pytest.approx(v) and at[2.1].variance == pytest.approx(w)
    # Exactly 2x either way is within: both bands (their variances averaged).
    assert at[2.0].variance == pytest.approx((v + w) / 2)
    # Nothing within 2x: the nearest MIN_PRIOR_ROWS rows.
    assert at[0.4].variance == pytest.approx(v) and at[9.0].variance == pytest.approx(w)


def test_a_row_whose_two_repeats_agree_by_chance_is_noisy_when_judged_with_its_neighbours(tmp_path):
    # Ten 2.5 us rows whose processes differ by 8% (a bimodal state, as small kernels show on an
    # H200), one whose A repeats happened to agree and whose B repeats landed 7% lower on identical
    # code, and a 1 ms row with a real 3x change.
    slow, fast = 2.6, 2.4
    a = runs(tmp_path, "a", [row(shape=(i,), cand=slow) for i in range(10)]
             + [row(shape=(10,), cand=2.60), row(shape=(11,), cand=1000.0)],
             [row(shape=(i,), cand=fast) for i in range(10)]
             + [row(shape=(10,), cand=2.59), row(shape=(11,), cand=1001.0)])
    b = runs(tmp_path, "b", [row(shape=(i,), cand=fast) for i in range(10)]
             + [row(shape=(10,), cand=2.42), row(shape=(11,), cand=3000.0)],
             [row(shape=(i,), cand=slow) for i in range(10)]
             + [row(shape=(10,), cand=2.41), row(shape=(11,), cand=3003.0)])
    rows = compare.pair(a, b)
    lucky, big = rows[10], rows[11]
    assert lucky.verdict == stats.FASTER and big.verdict == stats.SLOWER  # each row alone
    own = lucky.comparison.sd
    compare.judge(rows)
    # The prior raised the lucky row's variance toward its neighbours': its interval no longer clears
    # the margin (not only its q the FDR).
    assert lucky.verdict == stats.NOISY and lucky.comparison.sd > 5 * own
    assert lucky.comparison.hi > 1 - stats.MARGIN
    assert big.verdict == stats.SLOWER and big.comparison.q <= stats.FDR
    assert all(r.comparison.q is not None for r in rows)


def _rows_of_two_kinds(tmp_path, name, flagged_spreads):
    """Four unflagged rows near 1 ms (spreads 0.2-0.4%, 3 repeats a side) and, after them, one
    TIMER_FALLBACK row per spread in `flagged_spreads`."""
    spreads = [0.002, 0.003, 0.004, 0.0025, *flagged_spreads]
    markers = [None] * 4 + [["TIMER_FALLBACK: graph capture failed"]] * len(flagged_spreads)

    def side(tag, shift):
        cases = list(enumerate(zip(spreads, markers, strict=True)))
        return runs(tmp_path / name, tag, *[[row(shape=(i,), cand=(1.0 + 0.01 * i) * shift * (1 + k * s), markers=m)
                                             for i, (s, m) in cases] for k in (-1, 0, 1)])

    (tmp_path / name).mkdir()
    return compare.pair(side("a", 1.0), side("b", 1.01))


def test_flagged_rows_do_not_feed_the_prior_but_are_judged_by_it(tmp_path):
    alone = _rows_of_two_kinds(tmp_path, "clean", [])
    rows = _rows_of_two_kinds(tmp_path, "with_flagged", [0.03, 0.04, 0.03, 0.05])
    own = [stats.residual(r.a_ms, r.b_ms) for r in rows]
    compare.judge(alone)
    compare.judge(rows)
    assert [r.flags for r in rows] == [[]] * 4 + [["timer_fallback"]] * 4
    # The flagged rows' 3-5% spreads (a fallback timer's, not the machine's) leave the prior as it was.
    assert [r.comparison.sd for r in rows[:4]] == pytest.approx([r.comparison.sd for r in alone])
    assert [r.comparison.dof for r in rows[:4]] == pytest.approx([r.comparison.dof for r in alone])
    for r, (variance, dof) in zip(rows, own, strict=True):
        # Every row is judged with the prior (its dof added to the row's own), none below its own spread.
        assert r.comparison.dof > dof and r.comparison.sd >= math.sqrt(variance) * (1 - 1e-9)
        assert r.comparison.q is not None
    assert all(r.verdict == stats.NOISY for r in rows[4:])


def test_single_run_rows_need_a_change_beyond_3_percent_and_take_no_prior(tmp_path):
    jitter = np.linspace(-0.002, 0.002, 21)  # one process's samples: 0.2%
    # name: (A ms, B ms, how many times the jitter); wild varies 6% within its one process.
    cases = {"steady": (1.0, 0.98, 1), "big": (1.0, 0.95, 1), "wild": (1.0, 1.0, 30)}

    def one_run(tag, col):
        return runs(tmp_path, tag, [row(shape=(i,), cand=v[col], raw=(list(v[col] * (1 + v[2] * jitter)), [2.0]))
                                    for i, v in enumerate(cases.values())])

    def repeats(tag):
        """Four rows of 3 repeats a side at the single rows' latency: a prior to learn from."""
        return compare.pair(*(runs(tmp_path / tag, side, *[[row(shape=(9, i), cand=1.0 + d * (i + 1) * k)
                                                            for i in range(4)] for k in (-1, 0, 1)])
                              for side, d in (("a", 0.001), ("b", 0.002))))

    (tmp_path / "mixed").mkdir(), (tmp_path / "alone").mkdir()
    single, repeated, alone = compare.pair(one_run("sa", 0), one_run("sb", 1)), repeats("mixed"), repeats("alone")
    compare.judge(single + repeated)
    compare.judge(alone)
    steady, big, wild = single
    assert all(r.single and r.comparison.margin == compare.SINGLE_RUN_MARGIN for r in single)
    # A steady 2% from one process each is no call (it would be at the repeats' margin), only SAME
    # within the 3% margin; 5% is.
    assert stats.compare(steady.a_ms, steady.b_ms).verdict == stats.FASTER
    assert steady.verdict == stats.SAME and big.verdict == stats.FASTER
    # The wild row's 21 samples put its mean within 3% too.
    assert wild.verdict == stats.SAME and wild.comparison.hi - wild.comparison.lo > 0.01
    for r in single:  # its own samples' variance, unmoderated, and its q over the whole report
        variance, dof = stats.residual(r.a_ms, r.b_ms)
        assert r.comparison.dof == dof and r.comparison.sd == pytest.approx(math.sqrt(variance))
        assert r.comparison.q is not None
    # The wild single row's 6% did not feed the repeats' prior; the repeats were moderated by one.
    assert [r.comparison.sd for r in repeated] == pytest.approx([r.comparison.sd for r in alone])
    assert all(r.comparison.dof > 4 for r in repeated)
