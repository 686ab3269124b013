"""The run outcome record (harness.core.outcome): its JSON, what it refuses, and how it is said."""

import pytest

from harness.core.outcome import Outcome


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
