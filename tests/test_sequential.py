"""Sequential repeats (reports.sequential): the schedule's looks and weights, what the runner asks after
each round against what the report computes, and how a report shows a sequential A/B. The rule's
statistical promises are simulated in tests/test_sequential_simulation.py."""

import itertools
import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from reports import ab_report, compare, sequential, stats


def _spent(t):
    """O'Brien-Fleming's spending function at 0.05, as a share of the whole."""
    return 2 * norm.sf(norm.isf(0.025) / math.sqrt(t)) / 0.05


def test_the_weights_spend_alpha_as_obrien_fleming_at_doubling_repeats():
    for cap in (7, 8, 12, 20):
        schedule = sequential.Schedule(cap=cap)
        assert schedule.looks() == list(range(schedule.first, cap + 1))  # the runner asks after every round
        looks = schedule.spending()
        assert looks[0] == schedule.first and looks[-1] == cap
        assert all(b == min(2 * a, cap) for a, b in itertools.pairwise(looks))
        weights = [schedule.weight(n) for n in looks]
        assert sum(weights) == pytest.approx(1.0)
        assert sum(schedule.weight(n) for n in schedule.looks()) == pytest.approx(1.0)  # nothing spent between
        # What the looks up to n have spent is the spending function at n / cap.
        assert np.cumsum(weights) == pytest.approx([_spent(n / cap) for n in looks])
        assert weights[0] == min(weights) < 0.1  # little at the first look, where a row's noise is known worst


def test_a_schedule_refuses_what_the_rule_cannot_use_and_comes_from_the_plan():
    with pytest.raises(ValueError, match="first"):
        sequential.Schedule(first=2)
    with pytest.raises(ValueError, match="first"):
        sequential.Schedule(first=6, cap=5)
    with pytest.raises(ValueError, match="margin"):
        sequential.Schedule(resolve=stats.MARGIN)  # no call can resolve a change the margin swallows
    assert sequential.Schedule.from_plan({"repeats": 5}) is None
    plan = {"repeats": "auto", "max_repeats": 10, "resolve": 0.02, "first": 4}
    assert sequential.Schedule.from_plan(plan) == sequential.Schedule(first=4, cap=10, resolve=0.02)


def _rows(rng, repeats=12, op="op", noise=1.0):
    """One op's rows, timed in `repeats` processes a side: quiet big rows, some changed by 1% or 6%,
    and noisy small ones; `noise` scales every row's."""
    specs = [(0.5, 0.002, 1.0)] * 12 + [(0.3, 0.002, 1.01)] * 4 + [(0.4, 0.002, 1.06)] * 2 + [(0.003, 0.03, 1.0)] * 6
    rows = []
    for i, (latency, sd, effect) in enumerate(specs):
        a = list(latency * np.exp(rng.normal(0, sd * noise, repeats)))
        b = list(latency * effect * np.exp(rng.normal(0, sd * noise, repeats)))
        rows.append(compare.PairedRow(
            op=op, dtype="fp32", shape=(i,), a_ms=a, b_ms=b, a_control_ms=[], b_control_ms=[], timers={"graph"},
            flags=[], configs_a={}, configs_b={}, comparison=stats.compare(a, b),
            a_procs=[f"A-{j}" for j in range(repeats)], b_procs=[f"B-{j}" for j in range(repeats)]))
    return rows


def _as_timed(rows, given):
    """The rows as the runner's rounds left them: `given[label]` repeats each (its incomplete flags too,
    as compare.pair sets them against the op's rounds)."""
    rounds = max(given.values())
    out = []
    for r in rows:
        n = given[r.label]
        cut = sequential._cut(r, n)
        cut.flags = [f"incomplete_{s}({n}/{rounds})" for s in "ab"] if n < rounds else []
        cut.comparison = stats.compare(cut.a_ms, cut.b_ms)
        out.append(cut)
    return out


def test_the_runner_after_each_round_and_the_report_settle_every_row_alike():
    schedule = sequential.Schedule(cap=12)
    full = _rows(np.random.default_rng(5))
    given = {r.label: schedule.first for r in full}
    seen = {}
    for _ in range(schedule.cap - schedule.first + 1):
        reasons = sequential.settle(_as_timed(full, given), schedule, stats.FDR)
        for label, reason in reasons.items():
            # A row the runner let go stays settled for the same reason: nothing after it changes it.
            assert seen.setdefault(label, reason) == reason or seen[label] == sequential.OPEN
            seen[label] = reason
            if reason == sequential.OPEN:
                given[label] += 1
    assert sequential.OPEN not in seen.values()
    rows = _as_timed(full, given)
    sequential.judge(rows, schedule=schedule)
    assert {r.label: r.sequential.reason for r in rows} == seen
    # Each row was timed exactly as far as its schedule asked: none reads as incomplete.
    assert not any(r.flags for r in rows)
    assert {r.label: r.sequential.repeats for r in rows} == {k: min(v, schedule.cap) for k, v in given.items()}
    # Rows called as they stopped stay called in the report.
    called = [r for r in rows if r.sequential.reason == sequential.CALLED]
    assert called and all(r.verdict in (stats.FASTER, stats.SLOWER) for r in called)
    # The quiet big rows stop early, the noisy small ones cannot resolve 1% (futile) and stop too.
    by_label = {r.label: r for r in rows}
    assert all(by_label[f"op fp32 {i}"].sequential.reason == sequential.SAME for i in range(12))
    assert all(by_label[f"op fp32 {i}"].sequential.reason == sequential.FUTILE for i in range(18, 24))
    # Repeats past a row's stop (a runner that replayed it anyway) change nothing.
    again = _rows(np.random.default_rng(5))
    sequential.judge(again, schedule=schedule)
    assert [(r.verdict, r.comparison.ratio, r.sequential.repeats) for r in again] == [
        (r.verdict, r.comparison.ratio, r.sequential.repeats) for r in rows]


def test_a_report_of_several_ops_settles_each_row_where_the_runner_settled_it_op_by_op():
    """The runner looks at each op's rows alone after a round; the report judges every op's at once (its
    FDR holds over the report). A row the runner stopped as SAME must not come back open, short of its
    repeats, because another op's rows changed its look: on an H100 A/A of add and gelu, 11 rows did."""
    schedule = sequential.Schedule(cap=12)
    rng = np.random.default_rng(11)
    full = _rows(rng, op="quiet", noise=0.5) + _rows(rng, op="loud", noise=2.5)
    given = {r.label: schedule.first for r in full}
    seen = {}
    for _ in range(schedule.cap - schedule.first + 1):
        for op in ("quiet", "loud"):
            timed = _as_timed([r for r in full if r.op == op], {k: v for k, v in given.items() if k.startswith(op)})
            for label, reason in sequential.settle(timed, schedule, stats.FDR).items():
                seen[label] = reason
                if reason == sequential.OPEN:
                    given[label] += 1
    rows = []
    for op in ("quiet", "loud"):
        rows += _as_timed([r for r in full if r.op == op], {k: v for k, v in given.items() if k.startswith(op)})
    sequential.judge(rows, schedule=schedule)
    assert {r.label: r.sequential.reason for r in rows} == seen
    assert not any(r.flags for r in rows)
    assert {r.label: r.sequential.repeats for r in rows} == {k: min(v, schedule.cap) for k, v in given.items()}
    # The calls are the report's: Benjamini-Hochberg over every op's rows' p*, not each op's alone.
    assert [r.comparison.q for r in rows] == pytest.approx(stats.bh([r.comparison.p for r in rows]))


def test_failed_flagged_and_not_applicable_rows_stop_with_their_reason_and_a_missing_repeat_shows():
    schedule = sequential.Schedule(cap=8)
    rows = _rows(np.random.default_rng(6), repeats=6)
    rows[0].flags, rows[0].errors = ["failed_b(1/6)"], {"b": "wrong result"}
    rows[1].flags = ["timer_fallback"]
    rows[2].comparison = stats.Comparison(1.0, 0.0, math.inf, stats.MARGIN, stats.NOT_APPLICABLE, 6, 6)
    rows[3].b_ms, rows[3].b_procs = rows[3].b_ms[:2], rows[3].b_procs[:2]  # four of B's steps lost it
    reasons = sequential.settle(rows, schedule, stats.FDR)
    assert [reasons[r.label] for r in rows[:3]] == [sequential.FAILED, sequential.FLAGGED, sequential.NOT_APPLICABLE]
    sequential.judge(rows, schedule=schedule)
    assert rows[2].verdict == stats.NOT_APPLICABLE
    assert rows[3].sequential.reason == sequential.OPEN and "incomplete_b(2/6)" in rows[3].flags
    assert rows[3].verdict not in (stats.FASTER, stats.SLOWER) and rows[3].comparison.q == 1.0  # never looked at
    assert rows[0].comparison.q is not None  # judged, over the report's BH, at its first look


def test_a_sequential_report_names_each_rows_repeats_the_rule_and_the_rows_left_unresolved():
    schedule = sequential.Schedule(cap=12, resolve=0.01)
    rows = _rows(np.random.default_rng(7))
    sequential.judge(rows, schedule=schedule)
    summary = compare.summarize(rows)
    text = ab_report.render(rows, summary, [], {"name": "seq"})
    assert "repeats" in text.splitlines()[next(i for i, line in enumerate(text.splitlines()) if "verdict" in line
                                                 and "B/A" in line)]
    assert "looks at 3, 6, 12 repeats per side" in text
    futile = [r.label for r in rows if r.sequential.reason == sequential.FUTILE]
    line = next(line for line in text.splitlines() if "could not resolve a 1.0% change" in line)
    assert f": {len(futile)} (" in line and all(label in line for label in futile)
    assert summary.sequential["reasons"][sequential.FUTILE] == len(futile)
    assert all("repeats" in band for band in summary.resolution)
    json.dumps(summary.sequential)  # report.json carries it
    assert rows[0].sequential.to_json()["reason"] == sequential.SAME


def test_a_fixed_repeat_report_says_nothing_of_sequential_repeats():
    rows = _rows(np.random.default_rng(8), repeats=5)
    compare.judge(rows)
    summary = compare.summarize(rows)
    assert summary.sequential is None and all(r.sequential is None for r in rows)
    assert all("repeats" not in band for band in summary.resolution)
    assert "sequential" not in "\n".join(ab_report.headline(summary, [], {}, rows=rows))
