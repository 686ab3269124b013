"""How a report applies the verdict rule over its rows (reports.compare.judge, summarize, calibration)
and where its false discovery rate comes from (a plan's `fdr`, `--fdr`)."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from harness import cli
from harness.sessions import ab
from reports import compare, stats


def _row(i, a, b, flags=(), single=False, op="op"):
    return compare.PairedRow(op=op, dtype="fp32", shape=(i,), a_ms=list(a), b_ms=list(b), a_control_ms=[],
                             b_control_ms=[], timers={"graph"}, flags=list(flags), configs_a={}, configs_b={},
                             comparison=stats.compare(a, b), single=single)


def _noisy_neighbours(rng, n, latency=0.0025, sd=0.04):
    return [_row(100 + i, latency * np.exp(rng.normal(0, sd, 3)), latency * np.exp(rng.normal(0, sd, 3)))
            for i in range(n)]


def test_a_lucky_row_is_called_alone_and_judged_by_its_band_in_a_report():
    rng = np.random.default_rng(1)
    lucky = _row(0, [0.00250, 0.0025003, 0.0025001], [0.002575, 0.0025752, 0.0025751])
    assert lucky.verdict == stats.SLOWER
    rows = [lucky, *_noisy_neighbours(rng, 30)]
    compare.judge(rows)
    assert lucky.verdict == stats.NOISY and lucky.comparison.dof > 4
    assert lucky.comparison.q is not None


def test_flagged_rows_are_judged_but_do_not_feed_the_prior():
    rng = np.random.default_rng(2)
    quiet = [_row(i, 0.1 * np.exp(rng.normal(0, 0.002, 3)), 0.1 * np.exp(rng.normal(0, 0.002, 3)))
             for i in range(10)]
    # More throttled rows than quiet ones, and not so wild that the fit would drop them as outliers.
    wild = [_row(50 + i, 0.1 * np.exp(rng.normal(0, 0.03, 3)), 0.1 * np.exp(rng.normal(0, 0.03, 3)),
                 flags=["clock_throttled"]) for i in range(30)]
    probe = _row(99, [0.1, 0.1001], [0.1015, 0.10151])  # two repeats a side: the prior weighs
    compare.judge([*quiet, *wild, probe])
    # The prior is the quiet rows' (0.2%), not the throttled ones' (3%): the 1.5% change is called.
    assert probe.verdict == stats.SLOWER and probe.comparison.sd < 0.01
    assert all(r.comparison.q is not None for r in wild)


def test_single_run_rows_need_a_change_beyond_three_percent_and_take_no_prior():
    rng = np.random.default_rng(3)
    samples = list(np.exp(rng.normal(0, 0.001, 50)))
    two = _row(0, samples, [x * 1.02 for x in samples], single=True)
    four = _row(1, samples, [x * 1.04 for x in samples], single=True)
    compare.judge([two, four])
    assert two.comparison.margin == compare.SINGLE_RUN_MARGIN and two.verdict != stats.SLOWER
    assert four.verdict == stats.SLOWER


def test_an_outlier_repeat_is_dropped_and_named():
    rng = np.random.default_rng(4)
    rows = [_row(i, 0.2 * np.exp(rng.normal(0, 0.003, 5)), 0.2 * np.exp(rng.normal(0, 0.003, 5))) for i in range(40)]
    a = list(0.2 * np.exp(rng.normal(0, 0.003, 5)))
    b = [x * 1.02 for x in 0.2 * np.exp(rng.normal(0, 0.003, 5))]
    b[2] *= 1.07
    hit = _row(77, a, b)
    compare.judge([*rows, hit])
    assert hit.dropped == {"b": [b[2]]} and hit.comparison.n_b == 4
    assert hit.verdict == stats.SLOWER
    assert all(not r.dropped for r in rows)


def test_the_report_fdr_decides_which_calls_stand():
    # 19 null rows and one 2% change measured at a p-value near 0.01: called at fdr 0.5, not at 0.05.
    rng = np.random.default_rng(5)
    nulls = [_row(i, 0.1 * np.exp(rng.normal(0, 0.004, 3)), 0.1 * np.exp(rng.normal(0, 0.004, 3)))
             for i in range(19)]
    change = _row(50, [0.1, 0.1012, 0.0994], [0.1024, 0.1016, 0.1030])

    def verdict(fdr):
        rows = [compare.PairedRow(**{**r.__dict__}) for r in (*nulls, change)]
        compare.judge(rows, fdr)
        return rows[-1].verdict, compare.summarize(rows, fdr)

    strict, loose = verdict(0.05), verdict(0.5)
    assert strict[0] != stats.SLOWER and loose[0] == stats.SLOWER
    assert loose[1].fdr == 0.5 and "false discovery rate of 0.5" in loose[1].fdr_line()


def test_resolution_reports_each_band_and_names_the_rows_too_noisy_for_one_percent():
    rng = np.random.default_rng(6)
    big = [_row(i, 0.3 * np.exp(rng.normal(0, 0.002, 5)), 0.3 * np.exp(rng.normal(0, 0.002, 5))) for i in range(10)]
    small = [_row(20 + i, 0.002 * np.exp(rng.normal(0, 0.05, 5)), 0.002 * np.exp(rng.normal(0, 0.05, 5)))
             for i in range(10)]
    rows = [*big, *small]
    compare.judge(rows)
    s = compare.summarize(rows)
    bands = {b["band"]: b for b in s.resolution}
    assert set(bands) == {"< 5 us", "0.1-1 ms"}
    assert bands["0.1-1 ms"]["detectable"] < stats.SAME_MARGIN < bands["< 5 us"]["detectable"]
    assert sorted(bands["< 5 us"]["unresolved"]) == sorted(r.label for r in small)
    assert bands["0.1-1 ms"]["unresolved"] == []
    lines = s.resolution_lines()
    assert "on < 5 us rows (10)" in lines[0] and lines[1].startswith("rows that could not have called a 1% change")


def test_calibration_warns_only_when_identical_ir_rows_got_more_calls_than_the_fdr_allows():
    a = [1.0, 1.0001, 0.9999]
    called = [_row(i, a, [x * 1.05 for x in a]) for i in range(3)]
    quiet = [_row(10 + i, a, a) for i in range(20)]
    for r in (*called, *quiet):
        r.comparison = stats.adjust([r.comparison])[0]
    # 40 calls at fdr 0.05: up to 4 false calls are within the promise (the 95% point of Binomial(40, 0.05)).
    line, alarming = compare.calibration([*called, *quiet], 40, 0.05)
    assert not alarming and line.endswith("23, called FASTER/SLOWER: 3")
    line, alarming = compare.calibration([*called, *quiet], 5, 0.05)
    assert alarming and "more than the 0.05 FDR allows of 5 calls (at most 1)" in line
    assert compare.calibration([], 5, 0.05) is None


def test_a_plans_fdr_is_read_and_checked(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("ops: [add]\nfdr: 0.1\na: {label: A}\nb: {label: B}\n")
    assert ab.load_plan(plan).fdr == 0.1
    plan.write_text("ops: [add]\na: {label: A}\nb: {label: B}\n")
    assert ab.load_plan(plan).fdr == stats.FDR
    for bad in ("0", "1", "-0.1", "'x'", "true"):
        plan.write_text(f"ops: [add]\nfdr: {bad}\na: {{label: A}}\nb: {{label: B}}\n")
        with pytest.raises(ab.PlanError, match="'fdr' must be a number between 0 and 1"):
            ab.load_plan(plan)
    for bad in ("1.5", "0", "nan", "x"):  # the command line's, refused at the door as the option declares
        with pytest.raises(SystemExit) as refused:
            cli.build_parser().parse_args(["ab", "--fdr", bad])
        assert refused.value.code == 2
    assert math.isclose(stats.FDR, 0.05)


def test_the_power_table_uses_the_threshold_a_further_call_would_have_needed():
    a = [0.1, 0.1001, 0.0999, 0.1]
    rows = [_row(i, a, [x * (1.05 if i < 2 else 1.0) for x in a]) for i in range(10)]
    compare.judge(rows)
    assert sum(r.verdict == stats.SLOWER for r in rows) == 2
    # BH's next step: fdr * (calls + 1) / rows judged.
    assert compare.call_threshold(rows, 0.05) == pytest.approx(0.05 * 3 / 10)
    band = compare.resolution(rows, 0.05)[0]
    smallest = [stats.detectable(r.comparison, 0.015) for r in rows]
    assert band["detectable"] == pytest.approx(float(np.median(smallest)))
    assert compare.call_threshold([], 0.05) == 0.05


# A kernel's five repeats a side at 0.3% noise, and where its outlier repeat goes (7%: dropped by the prior).
PROBE_A = [2.0, 2.008, 1.994, 2.004, 1.998]
PROBE_B = [2.002, 1.996, 2.006, 1.997, 2.001]


def _probe_report(scale, outlier, neighbour_effect, fdr):
    """Four 0.2 ms rows changed by `neighbour_effect` and the 2 ms probe row (alone in its latency band)
    with B scaled by `scale`, one repeat of side `outlier` (if any) 7% off, judged at `fdr`."""
    rng = np.random.default_rng(8)
    rows = [_row(i, 0.2 * np.exp(rng.normal(0, 0.003, 5)), 0.2 * neighbour_effect * np.exp(rng.normal(0, 0.003, 5)))
            for i in range(4)]
    a, b = list(PROBE_A), [x * scale for x in PROBE_B]
    if outlier:
        (a if outlier == "a" else b)[1] *= 1.07
    rows.append(_row(99, a, b))
    compare.judge(rows, fdr)
    return rows


@pytest.mark.parametrize("outlier", [None, "a", "b"])
@pytest.mark.parametrize("fdr,neighbour_effect", [
    (0.05, 1.0),  # nothing else called: the probe needs q = 5 p <= 0.05, a p-value threshold of 0.01
    (0.2, 1.05),  # the other four called: q = p <= 0.2, looser than the 95% interval, which then decides
])
def test_a_reports_smallest_change_callable_is_where_its_rows_verdict_turns(outlier, fdr, neighbour_effect):
    uncalled = _probe_report(1.0, outlier, neighbour_effect, fdr)
    probe = uncalled[-1]
    assert probe.verdict != stats.SLOWER and probe.dropped.keys() == ({outlier} if outlier else set())
    assert (probe.comparison.n_a, probe.comparison.n_b) == (4 if outlier == "a" else 5, 4 if outlier == "b" else 5)
    assert sum(r.verdict == stats.SLOWER for r in uncalled) == (4 if neighbour_effect > 1 else 0)
    low, high = 1.0, 1.2
    assert _probe_report(high, outlier, neighbour_effect, fdr)[-1].verdict == stats.SLOWER
    for _ in range(60):
        mid = (low + high) / 2
        if _probe_report(mid, outlier, neighbour_effect, fdr)[-1].verdict == stats.SLOWER:
            high = mid
        else:
            low = mid
    turning_ratio = probe.comparison.ratio * high
    (band,) = [b for b in compare.resolution(uncalled, fdr) if b["band"] == compare.band(2.0)]
    assert band["rows"] == 1 and 1 + band["detectable"] == pytest.approx(turning_ratio, rel=1e-9)


def _two_op_report(x_effects, y_effects):
    # Every row shares one noise pattern (each side's repeats rolled): its B/A is its effect exactly, and
    # its p-value depends on that effect alone.
    pattern = np.array([1.0, 1.003, 0.997, 1.001, 0.999])
    effects = [("x", e) for e in x_effects] + [("y", e) for e in y_effects]
    rows = [_row(i, 0.2 * np.roll(pattern, i), 0.2 * effect * np.roll(pattern, i + 1), op=op)
            for i, (op, effect) in enumerate(effects)]
    compare.judge(rows)
    return rows


@pytest.mark.parametrize("x_effects,y_effects", [
    # Op x's 0.6% change beside a null, among op y's eight 5% ones: ninth of ten over the report (q = 10/9 p),
    # first of two over op x alone (q = 2 p): called over the report, not per op.
    ((1.006, 1.0), (1.05,) * 8),
    # The same change alone in op x, beside op y's nine nulls: q = 10 p over the report, p per op.
    ((1.006,), (1.0,) * 9),
])
def test_the_fdr_is_over_the_whole_report_not_per_op(x_effects, y_effects):
    rows = _two_op_report(x_effects, y_effects)
    p = np.array([r.comparison.p for r in rows])
    whole = sps.false_discovery_control(p, method="bh")
    per_op_x = sps.false_discovery_control(p[:len(x_effects)], method="bh")
    # The change's interval clears the margin (p < 0.05): only the FDR decides its call, and the two ways of
    # adjusting decide it differently.
    assert p[0] < 1 - stats.CONFIDENCE and (whole[0] <= stats.FDR) != (per_op_x[0] <= stats.FDR)
    assert [r.comparison.q for r in rows] == pytest.approx(list(whole), rel=1e-12)
    called = (whole <= stats.FDR) & (p < 1 - stats.CONFIDENCE)
    assert [r.verdict == stats.SLOWER for r in rows] == called.tolist()
