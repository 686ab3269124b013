"""Pairing A and B rows from run dirs written by hand (reports.compare): which latencies a row
gets, which flags keep it out of the headline, and what the summary counts."""

import json
import math

import numpy as np
import pytest

from reports import ab_report, compare, stats


def row(op="softmax", dtype="fp16", shape=(4, 16), status="SUCCESS", cand=1.0, base=2.0, timer="graph",
        markers=None, configs=None, raw=None, error=None):
    r = {"op": op, "dtype": dtype, "shape": list(shape) if shape is not None else None, "status": status,
         "candidate_ms": cand, "baseline_ms": base, "timer": timer, "markers": markers, "configs": configs or {}}
    if error is not None:
        r["error"] = error
    if raw is not None:
        r["samples"] = {"candidate": {"raw": raw[0]}, "baseline": {"raw": raw[1]}}
    return r


def run_dir(tmp_path, name, *rows):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"rows": list(rows)}))
    return d


def runs(tmp_path, side, *per_run_rows):
    return [run_dir(tmp_path, f"{side}{i}", *rows) for i, rows in enumerate(per_run_rows)]


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
    # mm has one headline row: its line keeps that row's own interval.
    mm = next(r for r in rows if r.key == ("mm", "fp16", (3,)))
    assert s.per_op["mm"] == (mm.comparison.ratio, mm.comparison.lo, mm.comparison.hi) == pytest.approx((0.5,) * 3)
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

def test_a_side_with_one_latency_gives_an_unbounded_interval_and_the_minimum_floor():
    c = stats.compare([1.0], [2.0, 2.1, 1.9])
    assert (c.lo, c.hi) == (0.0, math.inf) and c.verdict == stats.NOISY
    assert (c.n_a, c.n_b) == (1, 3) and c.floor == stats.MIN_EFFECT
    assert stats.compare([2.0, 2.1], [1.0]).verdict == stats.NOISY


def test_two_repeats_a_side_can_call_a_clear_change():
    c = stats.compare([1.0, 1.001], [2.0, 2.002])
    assert c.verdict == stats.SLOWER and 1.9 < c.lo < 2.0 < c.hi < 2.1


def test_sides_without_spread_give_a_point_interval():
    c = stats.compare([1.0, 1.0, 1.0], [1.5, 1.5])
    assert c.ratio == pytest.approx(1.5) and c.lo == pytest.approx(1.5) and c.hi == pytest.approx(1.5)
    assert c.verdict == stats.SLOWER


def test_an_empty_side_is_refused():
    for a, b in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match="^both sides need at least one latency$"):
            stats.compare(a, b)


def test_a_given_floor_replaces_the_one_from_a():
    a = [1.0, 1.0001, 0.9999, 1.0]
    b = [x * 1.01 for x in a]
    assert stats.compare(a, b).verdict == stats.SLOWER
    c = stats.compare(a, b, floor=0.02)
    assert c.floor == 0.02 and c.verdict == stats.SAME


def test_welch_interval_with_two_repeats_a_side():
    from scipy import stats as sps

    a, b = [1.0, 1.1], [2.0, 2.3]
    c = stats.compare(a, b)
    lo, hi = sps.ttest_ind(np.log(b), np.log(a), equal_var=False).confidence_interval(0.95)
    assert (c.lo, c.hi) == pytest.approx((math.exp(lo), math.exp(hi)))


def test_the_floor_is_three_a_a_standard_deviations():
    # log-scale values -s, 0, s: their sample standard deviation is s.
    s = 0.01
    assert stats.noise_floor([math.exp(-s), 1.0, math.exp(s)]) == pytest.approx(math.expm1(3 * s))
    assert stats.noise_floor([1.0]) == stats.MIN_EFFECT
    assert stats.noise_floor([1.0, math.exp(0.01)]) == pytest.approx(math.expm1(3 * 0.01 / math.sqrt(2)))


def test_delta_is_the_ratio_in_percent():
    assert stats.compare([2.0], [2.1]).delta_pct == pytest.approx(5.0)
    assert stats.compare([2.0], [1.8]).delta_pct == pytest.approx(-10.0)


@pytest.mark.parametrize("lo,hi,verdict", [
    (0.900, 0.995, stats.NOISY), (1.005, 1.100, stats.NOISY),  # touching the floor is not beyond it
    (0.995, 1.005, stats.SAME),                                # the floor itself is within it
])
def test_verdict_at_the_floor_itself(lo, hi, verdict):
    assert stats.verdict(lo, hi, 0.005) == verdict


def test_a_floor_of_exactly_5_percent_still_calls():
    assert stats.verdict(1.5, 2.0, stats.MAX_FLOOR) == stats.SLOWER
    assert stats.verdict(0.999, 1.001, stats.MAX_FLOOR) == stats.SAME
    assert stats.MAX_FLOOR == 0.05


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
    odd = [{"markers": ["CLOCK_THROTTLED detail=clocks=low reasons=hw_slowdown"]},
           {"markers": ["CLOCK_THROTTLED sm_clock_mhz=1980->1500"]}]
    assert compare._slowdowns(odd) == ["?", "hw_slowdown"]
    assert clean.throttled == {} and clean.in_headline
    s = compare.summarize([throttled, clean])
    assert s.headline_rows == 1 and s.excluded == {"clock_throttled": 1}


def test_a_power_cap_on_every_repeat_of_both_sides_stays_in_the_headline_else_it_leaves(tmp_path):
    cap = "CLOCK_THROTTLED reasons=sw_power_cap kind=power_cap sm_clock_mhz=1980->1410"
    hot = "CLOCK_THROTTLED reasons=hw_thermal_slowdown kind=slowdown sm_clock_mhz=1980->1500"
    legacy = "CLOCK_THROTTLED reasons=sw_power_cap sm_clock_mhz=1980->1410"  # no kind: not known to be a cap
    shapes = {"steady": (1,), "spared": (2,), "hot": (3,), "legacy": (4,)}
    a = runs(tmp_path, "a", *[[row(shape=(1,), markers=[cap]), row(shape=(2,), markers=[cap]),
                               row(shape=(3,), markers=[cap]), row(shape=(4,), markers=[cap])]] * 3)
    b = runs(tmp_path, "b", [row(shape=(1,), markers=[cap]), row(shape=(2,), markers=[cap]),
                             row(shape=(3,), markers=[cap, hot]), row(shape=(4,), markers=[legacy])],
             [row(shape=(1,), markers=[cap]), row(shape=(2,)),  # one B repeat ran uncapped
              row(shape=(3,), markers=[cap]), row(shape=(4,), markers=[cap])],
             [row(shape=(1,), markers=[cap]), row(shape=(2,), markers=[cap]),
              row(shape=(3,), markers=[cap]), row(shape=(4,), markers=[cap])])
    got = {r.shape: r for r in compare.pair(a, b)}
    assert got[shapes["steady"]].flags == [] and got[shapes["steady"]].in_headline
    assert got[shapes["steady"]].throttled == {"a": ["sw_power_cap"], "b": ["sw_power_cap"]}
    for name in ("spared", "hot", "legacy"):
        assert got[shapes[name]].flags == ["clock_throttled"] and not got[shapes[name]].in_headline, name
    lines = ab_report.throttled_lines(list(got.values()))
    assert lines[0].startswith("CLOCK_THROTTLED rows (a thermal or power slowdown hit their measurement; "
                               "out of the headline): 3")
    assert lines[4].startswith("CLOCK_THROTTLED rows kept in the headline (the board's power cap on every "
                               "repeat of both sides") and lines[4].endswith(": 1")
    assert lines[5] == "  softmax fp16 1: A sw_power_cap; B sw_power_cap"


def test_each_side_keeps_its_first_successful_runs_kernels(tmp_path):
    ka, kb = [{"name": "k", "share": 1.0}], [{"name": "k2", "share": 0.7}, {"name": "k", "share": 0.3}]
    a = runs(tmp_path, "a", [dict(row(status="FAILED"), kernels=[{"name": "x", "share": 1.0}])],
             [dict(row(), kernels=ka)])
    b = runs(tmp_path, "b", [dict(row(), kernels=kb)], [row()])
    (paired,) = compare.pair(a, b)
    assert paired.kernels == {"a": ka, "b": kb}
    assert compare.pair(runs(tmp_path, "c", [row()]), runs(tmp_path, "d", [row()]))[0].kernels == {}


def test_a_lone_row_keeps_its_own_interval_in_the_per_op_and_overall_lines(tmp_path):
    a = runs(tmp_path, "a", [row(cand=1.0)], [row(cand=1.02)], [row(cand=0.98)])
    b = runs(tmp_path, "b", [row(cand=1.1)], [row(cand=1.13)], [row(cand=1.08)])
    rows = compare.pair(a, b)
    c = rows[0].comparison
    s = compare.summarize(rows)
    assert c.lo < c.ratio < c.hi and math.isfinite(c.hi)
    assert s.per_op["softmax"] == s.overall == (c.ratio, c.lo, c.hi)


# The pooled floor: A's spread over the rows of similar latency.

def test_the_pooled_floor_is_the_spread_of_the_repeats_of_rows_within_2x_latency():
    s = 0.02
    pool = [[math.exp(-s), math.exp(s)],            # center 1: squared log deviations 2 s^2
            [1.8 * math.exp(-2 * s), 1.8 * math.exp(2 * s)],  # center 1.8: 8 s^2
            [10 * math.exp(-0.1), 10 * math.exp(0.1)]]  # center 10: far from both
    floors = stats.pooled_floors([1.0, 1.5, 3.0, 10.0, 5.5, 25.0], pool)
    near = math.expm1(3 * math.sqrt(10 * s * s / 2))  # 2 rows, 1 degree of freedom each
    assert floors[0] == pytest.approx(near) and floors[1] == pytest.approx(near)
    assert floors[2] == pytest.approx(math.expm1(3 * 2 * s * math.sqrt(2)))  # 1.8 alone is within 2x of 3
    assert floors[3] == pytest.approx(math.expm1(3 * 0.1 * math.sqrt(2)))
    assert floors[4] == pytest.approx(math.expm1(3 * 0.1 * math.sqrt(2)))   # 10 is within 2x of 5.5
    assert floors[5] == stats.MIN_EFFECT                                   # nothing within 2x
    # Exactly 2x either way is within.
    wide = math.expm1(3 * math.log(2) * math.sqrt(2))  # repeats 0.5 and 2: their center is exactly 1
    assert stats.pooled_floors([0.5, 2.0, 0.49, 2.01], [[0.5, 2.0]]) == pytest.approx([wide, wide, 0.005, 0.005])


def test_a_row_whose_two_a_repeats_agree_by_chance_is_judged_by_its_neighbours_spread(tmp_path):
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
    own = big.comparison.floor
    compare.pool_floors(rows)
    assert lucky.verdict == stats.NOISY and lucky.comparison.floor > 0.08
    # The 1 ms row's neighbours are none but itself: its floor and verdict are its own.
    assert big.comparison.floor == own and big.verdict == stats.SLOWER


def test_the_pool_leaves_out_flagged_rows_and_never_lowers_a_floor(tmp_path):
    a = runs(tmp_path, "a", [row(shape=(1,), cand=1.0), row(shape=(2,), cand=1.0, markers=["TIMER_FALLBACK"]),
                             row(shape=(3,), cand=1.0)],
             [row(shape=(1,), cand=1.001), row(shape=(2,), cand=1.5), row(shape=(3,), cand=1.1)])
    b = runs(tmp_path, "b", [row(shape=(1,), cand=0.9), row(shape=(2,), cand=1.0), row(shape=(3,), cand=1.0)],
             [row(shape=(1,), cand=0.901), row(shape=(2,), cand=1.0), row(shape=(3,), cand=1.0)])
    rows = compare.pair(a, b)
    before = [r.comparison.floor for r in rows]
    compare.pool_floors(rows)
    # Shapes 1 and 3 pool (the flagged 50% spread of shape 2 does not): shape 3's own floor is the larger.
    pooled = stats.pooled_floors([1.0], [[1.0, 1.001], [1.0, 1.1]])[0]
    assert before[0] < pooled < before[2]
    assert rows[0].comparison.floor == pytest.approx(pooled)
    assert rows[2].comparison.floor == before[2]
    assert rows[1].comparison.floor == pytest.approx(max(before[1], pooled))
