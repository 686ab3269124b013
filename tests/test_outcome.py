"""The run outcome record (harness.core.outcome): its JSON, what it refuses, and how it is said; and how the
child decides it (harness.child.plugins.runinfo.outcome): its rows against its planned cases."""

import types

import pytest

from harness.child.context import Case
from harness.child.plugins.runinfo import outcome
from harness.core import rundir
from harness.core.outcome import COMPLETE, INCOMPLETE, Outcome


def test_an_outcome_round_trips_through_its_json_in_one_key_order():
    stopped = Outcome("INCOMPLETE", rows_done=3, rows_planned=8, reason="interrupted (SIGINT)",
                      running_case="fp16-4", exit_code=130)
    data = stopped.to_json()
    assert list(data) == ["status", "rows_done", "rows_planned", "reason", "running_case", "exit_code"]
    assert Outcome.from_json(data) == stopped and not stopped.complete
    assert Outcome.from_json({"status": "COMPLETE", "exit_code": 0}) == Outcome("COMPLETE", exit_code=0)


@pytest.mark.parametrize("data", [None, [], "COMPLETE", {}, {"status": "complete"}, {"running_case": "x"}])
def test_what_is_not_an_outcome_is_refused(data):
    with pytest.raises(ValueError, match="is not an outcome \\(status COMPLETE or INCOMPLETE\\)"):
        Outcome.from_json(data)


def test_rows_and_the_case_it_stopped_in_are_said_as_the_run_says_them():
    assert Outcome("INCOMPLETE", rows_done=1, rows_planned=None).rows() == "1/?"
    assert Outcome("INCOMPLETE", rows_done=1, rows_planned=None).rows(4) == "1/4"
    assert Outcome("INCOMPLETE", rows_done=1, rows_planned=2).rows(4) == "1/2"
    assert Outcome("INCOMPLETE", running_case="fp32-8").during() == " during case fp32-8"
    assert Outcome("INCOMPLETE", running_case="").during() == ""


# --- the child's account: every planned case reported once, by its id -------------------------------------
PLANNED = [Case("add", "fp32", (8,)), Case("add", "fp32", (16,)), Case("add", "fp16", (8,))]  # fp32-8 fp32-16 fp16-8


def planned(cases) -> list[str] | None:
    """What RunContext.planned_ids says of these cases (None: known only as they run)."""
    return [case.id for case in cases] or None


def session_end(cases: list[Case], reported: list[str], statuses: dict[str, str] | None = None) -> Outcome:
    """The outcome of a session that ran to its end (pytest's exit OK) with a row for each id `reported`."""
    rows = [{"case": case, "status": (statuses or {}).get(case, "SUCCESS")} for case in reported]
    ctx = types.SimpleNamespace(planned_ids=planned(cases), rows=rows, stop_reason=None, stop_code=None,
                                running_case=None)
    return outcome(ctx, types.SimpleNamespace(shouldstop=False), pytest.ExitCode.OK)


def test_a_row_for_each_planned_case_is_complete_and_exits_on_whether_a_row_failed():
    ids = [case.id for case in PLANNED]
    assert session_end(PLANNED, ids[::-1]) == Outcome("COMPLETE", rows_done=3, rows_planned=3, exit_code=0)
    failed = session_end(PLANNED, ids, {"fp32-16": "FAILED"})
    assert failed.complete and failed.exit_code == rundir.EXIT_FAILED_ROWS


@pytest.mark.parametrize(("reported", "reason"), [
    (["fp32-8", "fp32-16"], "1 planned case(s) never reported (fp16-8)"),
    ([], "3 planned case(s) never reported (fp32-8, fp32-16, fp16-8)"),
    (["fp32-8", "fp32-16", "fp16-8", "fp16-16"], "1 unplanned case(s) reported (fp16-16)"),
    (["fp32-8", "fp32-16", "fp16-8", "fp32-8"], "1 case(s) reported more than once (fp32-8)"),
    (["fp32-8", "fp32-8", "fp32-16"],  # as many rows as planned cases
     "1 planned case(s) never reported (fp16-8); 1 case(s) reported more than once (fp32-8)"),
    (["fp32-8", "fp32-16", "test_op[fp16-8x1]"],  # as many rows, one under another name
     "1 planned case(s) never reported (fp16-8); 1 unplanned case(s) reported (test_op[fp16-8x1])"),
], ids=["fewer", "none", "more", "duplicated", "duplicated-for-a-missing-one", "renamed"])
def test_rows_that_disagree_with_the_planned_cases_are_incomplete_and_say_how(reported, reason):
    assert session_end(PLANNED, reported) == Outcome("INCOMPLETE", rows_done=len(reported), rows_planned=3,
                                                     reason=reason, exit_code=rundir.EXIT_INCOMPLETE)


def test_more_than_three_cases_are_named_three_and_the_rest_counted():
    cases = [Case("add", "fp32", (n,)) for n in range(1, 6)]
    assert session_end(cases, []).reason == "5 planned case(s) never reported (fp32-1, fp32-2, fp32-3, ...)"


def test_a_flaggems_benchmark_whose_cases_are_known_only_as_they_run_is_complete_on_whatever_it_reported():
    assert session_end([], ["fp16-4", "fp16-4#2"]) == Outcome("COMPLETE", rows_done=2, rows_planned=None,
                                                              exit_code=0)


@pytest.mark.parametrize(("shouldstop", "exitstatus", "reason"), [
    ("poisoned capture", pytest.ExitCode.INTERRUPTED, "stopped: poisoned capture"),  # before INTERRUPTED
    (False, pytest.ExitCode.INTERRUPTED, "interrupted"),
    (False, pytest.ExitCode.INTERNAL_ERROR, "internal error (traceback in run.log)"),
    (False, pytest.ExitCode.USAGE_ERROR, "pytest refused its arguments (see run.log)"),
    (False, pytest.ExitCode.NO_TESTS_COLLECTED, "pytest collected no test (see run.log)"),
])
def test_a_session_that_stopped_is_incomplete_in_the_case_it_was_in_whatever_its_rows(shouldstop, exitstatus, reason):
    """Every planned case reported, yet the session says it stopped: the run is INCOMPLETE, exit 3, with
    pytest's reason and the case it was in; a run stopped by its own plugin keeps that plugin's reason."""
    cases = [types.SimpleNamespace(id="fp32-8")]
    rows = [{"case": "fp32-8", "status": "SUCCESS"}]
    ctx = types.SimpleNamespace(planned_ids=planned(cases), rows=rows, stop_reason=None, stop_code=None,
                                running_case="fp32-8")
    said = outcome(ctx, types.SimpleNamespace(shouldstop=shouldstop), exitstatus)
    assert (said.status, said.reason, said.exit_code, said.running_case) == (INCOMPLETE, reason, rundir.EXIT_INCOMPLETE,
                                                                              "fp32-8")
    ctx.stop_reason, ctx.stop_code = "no space left on device", 75
    assert outcome(ctx, types.SimpleNamespace(shouldstop=shouldstop), exitstatus).reason == "no space left on device"


def test_a_complete_run_names_no_running_case_and_a_failed_or_errored_row_exits_one():
    cases = [types.SimpleNamespace(id=i) for i in ("a", "b")]
    for status, code in (("SUCCESS", 0), ("FAILED", rundir.EXIT_FAILED_ROWS), ("ERROR", rundir.EXIT_FAILED_ROWS)):
        rows = [{"case": "a", "status": "SUCCESS"}, {"case": "b", "status": status}]
        ctx = types.SimpleNamespace(planned_ids=planned(cases), rows=rows, stop_reason=None, stop_code=None,
                                    running_case="b")
        said = outcome(ctx, types.SimpleNamespace(shouldstop=False), pytest.ExitCode.OK)
        assert (said.status, said.exit_code, said.running_case) == (COMPLETE, code, None), status
