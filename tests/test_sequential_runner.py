"""Sequential repeats in the A/B runner (`--repeats auto`): the rounds, the replay of the open rows only
(`replay --case`), the cap, ab.json's record of each round, and going on from an interrupted A/B
(`--continue`, which a corpus A/B's resume gives each op). The steps are real processes on the
interpreter, whose verdicts are n/a: a stand-in `reports.sequential.settle` closes rows round by round
as each test wants; what the rule itself decides is tests/test_sequential.py's."""

import json
import signal
from pathlib import Path

import pytest
import yaml
from conftest import REPO, ab_dir_in, load, run_dir_of

from harness import cli
from harness.core import options
from harness.providers import catalog
from harness.sessions import ab, corpus_ab
from harness.sessions.ab import session as ab_session
from reports import sequential, stats

CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"
SHAPES = "add:\n  shapes: [[300], [2, 700], [64]]\n  dtypes: [fp32]\n"
LABELS = ["add fp32 300", "add fp32 2x700", "add fp32 64"]


def _args(tmp_path, *extra):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(SHAPES)
    return cli.parse_request(["ab", "--ops", "add", "--backend", "interpreter", "--shapes", str(shapes),
                                          "--out", str(tmp_path / "runs"), *extra])



class StandIn:
    """settle as a test wants it: `closes[label] = (look, reason)` settles the row at the look with that
    many repeats per side; every call's rows (label -> repeats per side it was given) are kept."""

    def __init__(self, monkeypatch, closes):
        self.closes = closes
        self.seen: list[dict[str, tuple[int, int]]] = []
        monkeypatch.setattr(sequential, "settle", self)

    def __call__(self, rows, schedule, fdr):
        self.seen.append({r.label: (len(r.a_ms), len(r.b_ms)) for r in rows})
        look = max(len(r.a_ms) for r in rows)
        return {r.label: self.closes[r.label][1] if r.label in self.closes and look >= self.closes[r.label][0]
                else sequential.OPEN for r in rows}


def _cases(step_dir: Path) -> list[str]:
    """The case ids of the one run in a step dir (`A-4`)."""
    (run_dir,) = step_dir.iterdir()
    return [row["case"] for row in load(run_dir / "results.json")["rows"]]


def _outcome(step_dir: Path) -> dict:
    (run_dir,) = step_dir.iterdir()
    return load(run_dir / "run.json")["observed"]["outcome"]


# --- the rounds ------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_later_rounds_replay_only_the_open_rows_until_none_is_open(tmp_path, monkeypatch, capsys):
    """Round 1 times every row 3 times a side; then one repeat a side per round of the rows still open, in
    run dirs that hold those rows alone (each COMPLETE: its selected cases all reported), until none is
    open, short of the cap."""
    rule = StandIn(monkeypatch, {"add fp32 300": (3, "same"), "add fp32 2x700": (4, "called"),
                                 "add fp32 64": (5, "same")})
    ab.run_from_args(_args(tmp_path, "--repeats", "auto", "--max-repeats", "7"))
    out = capsys.readouterr().out
    d = ab_dir_in(out)
    op_dir = d / "add"
    state = load(d / "ab.json")
    assert state["complete"] and state["plan"]["repeats"] == "auto" and state["plan"]["max_repeats"] == 7
    assert (state["plan"]["first"], state["plan"]["resolve"]) == (3, 0.01)
    assert sorted(p.name for p in op_dir.iterdir()) == ["A-1", "A-2", "A-3", "A-4", "A-5", "A-record",
                                                       "B-1", "B-2", "B-3", "B-4", "B-5", "B-passes"]
    for side in "AB":
        assert _cases(op_dir / f"{side}-3") == ["fp32-300", "fp32-2x700", "fp32-64"]
        assert _cases(op_dir / f"{side}-4") == ["fp32-2x700", "fp32-64"]
        assert _cases(op_dir / f"{side}-5") == ["fp32-64"]
        outcome = _outcome(op_dir / f"{side}-5")
        assert (outcome["status"], outcome["rows_planned"], outcome["rows_done"]) == ("COMPLETE", 1, 1)
    assert state["rounds"]["add"] == [
        {"repeats": 3, "timed": None, "open": LABELS[1:], "settled": {LABELS[0]: "same"}},
        {"repeats": 4, "timed": LABELS[1:], "open": LABELS[2:], "settled": {LABELS[0]: "same", LABELS[1]: "called"}},
        {"repeats": 5, "timed": LABELS[2:], "open": [], "settled": {LABELS[0]: "same", LABELS[1]: "called",
                                                                     LABELS[2]: "same"}}]
    # Each look saw every run so far: a row's repeats are those of the rounds it was open for.
    assert rule.seen == [dict.fromkeys(LABELS, (3, 3)), {LABELS[0]: (3, 3), LABELS[1]: (4, 4), LABELS[2]: (4, 4)},
                         {LABELS[0]: (3, 3), LABELS[1]: (4, 4), LABELS[2]: (5, 5)}]
    assert "[1/1 add] round 2: 1 of 3 rows open (2 settled: 1 same, 1 called)" in out
    assert "[1/1 add] round 3: 0 of 3 rows open (3 settled: 2 same, 1 called)" in out
    # The report pairs the rows of different repeat counts: none is left out or unpaired.
    assert [(r["shape"], len(r["a_ms"]), len(r["b_ms"])) for r in load(d / "report.json")["rows"]] == [
        ([300], 3, 3), ([2, 700], 4, 4), ([64], 5, 5)]


# --- going on from an interrupted A/B ---------------------------------------------------------------
@pytest.mark.e2e
def test_an_ab_interrupted_mid_round_goes_on_from_its_last_completed_step_running_none_twice(tmp_path, monkeypatch,
                                                                                           capsys):
    """The step a stop cut short (B's fourth repeat) is rerun; every step that completed is taken over, not
    run again; the rounds are looked at again from the same runs and go on, to the cap, where the rows
    still open are said unresolved."""
    StandIn(monkeypatch, {"add fp32 300": (3, "same")})
    real_launch = ab.Runner._launch
    launched: list[str] = []

    def launch(runner, side, request, host=None):
        launched.append(request.run_dir.parent.name)
        code, interrupted = real_launch(runner, side, request, host)
        if request.run_dir.parent.name == "B-4" and runner.earlier == {}:
            return code, signal.SIGINT  # stopped as it ran: its rows, if any, are not the A/B's
        return code, interrupted

    monkeypatch.setattr(ab.Runner, "_launch", launch)
    args = _args(tmp_path, "--repeats", "auto", "--max-repeats", "5")
    assert ab.run_from_args(args) == 128 + signal.SIGINT
    first = ab_dir_in(capsys.readouterr().out)
    before = load(first / "ab.json")
    assert before["running"]["run_dir"].startswith(str(first / "add" / "B-4"))
    assert launched[-2:] == ["A-4", "B-4"] and not before["complete"]
    launched.clear()
    ab.run_from_args(_args(tmp_path, "--repeats", "auto", "--max-repeats", "5", "--continue", str(first)))
    out = capsys.readouterr().out
    second = ab_dir_in(out)
    assert launched == ["B-4", "A-5", "B-5"]
    state = load(second / "ab.json")
    assert state["complete"]
    taken = [s for s in state["steps"] if s.get("taken_over")]
    assert [s["step"] for s in taken] == [s["step"] for s in before["steps"]]
    assert [s["run_dir"] for s in taken] == [s["run_dir"] for s in before["steps"]]
    assert all(s["run_dir"].startswith(str(second)) for s in state["steps"] if not s.get("taken_over"))
    assert [(r["repeats"], r["open"]) for r in state["rounds"]["add"]] == [(3, LABELS[1:]), (4, LABELS[1:]),
                                                                          (5, LABELS[1:])]
    assert "[1/1 add] round 3: 2 of 3 rows open (1 settled: 1 same); at --max-repeats: add fp32 2x700, " \
           "add fp32 64 not resolved" in out
    assert not (second / "add" / "A-6").exists()
    assert _cases(second / "add" / "B-4") == ["fp32-2x700", "fp32-64"]
    assert [(r["shape"], len(r["a_ms"]), len(r["b_ms"])) for r in load(second / "report.json")["rows"]] == [
        ([300], 3, 3), ([2, 700], 5, 5), ([64], 5, 5)]


def test_a_continuation_takes_over_no_step_of_an_ab_of_another_plan(tmp_path, monkeypatch, capsys):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    step = {"what": "[1/1 add] A records", "step": "add/A-record", "side": "A", "args": ["record", "add"],
            "exit": 0, "usable": True, "run_dir": str(tmp_path / "r"), "seconds": 1.0}
    other = {"name": "other", "ops": ["add"], "repeats": 3, "backend": "interpreter"}
    (earlier / "ab.json").write_text(json.dumps({"plan": other, "steps": [step], "complete": False}))
    plan = ab.resolve_plan(_args(tmp_path, "--repeats", "auto"))
    assert ab_session._continued(earlier, plan) == []
    assert "that A/B ran another plan: none of its steps is taken over" in capsys.readouterr().out


def test_a_corpus_ab_resumes_each_op_from_its_last_interrupted_ab_and_reruns_one_that_ended(tmp_path):
    """The op's A/B is told to go on (--continue) from its newest A/B dir that stopped short; one that ran
    to its end (and failed) is a retry: run afresh."""
    plan = ab.plan_from_data({"ops": ["add"], "repeats": "auto"}, "p")
    runner = corpus_ab.CorpusAB(tmp_path, corpus_ab.ABOptions(options.RunOptions(backend="interpreter"), [0],
                                                              plan=plan.to_dict()), {})
    entry = catalog.Entry("builtin", "add", "", "")
    op_dir = tmp_path / "ops" / "builtin__add"
    older, newer = op_dir / "attempt1" / "ab_p_1", op_dir / "attempt2" / "ab_p_2"
    for d, complete in ((older, True), (newer, False)):
        d.mkdir(parents=True)
        (d / "ab.json").write_text(json.dumps({"complete": complete, "steps": []}))
    run_dir = op_dir / "attempt1" / "ab_p_3"
    assert runner._command(entry, 0, None, run_dir)[-2:] == ["--continue", str(newer)]
    (newer / "ab.json").write_text(json.dumps({"complete": True, "steps": []}))
    assert "--continue" not in runner._command(entry, 0, None, run_dir)


# --- options and plans ------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "refused"), [
    (["--max-repeats", "8"], "--max-repeats: only with --repeats auto (this A/B's repeats are 3)"),
    (["--repeats", "4", "--resolve", "2%"], "--resolve: only with --repeats auto (this A/B's repeats are 4)"),
])
def test_the_sequential_options_are_refused_with_fixed_repeats_in_one_line(tmp_path, extra, refused, capsys):
    shapes = tmp_path / "s.yaml"
    shapes.write_text(SHAPES)
    code = cli.main(["ab", "--ops", "add", "--backend", "interpreter", "--shapes", str(shapes), "--out",
                     str(tmp_path), *extra])
    assert code == 2 and capsys.readouterr().err == f"error: {refused}\n"
    assert not list(tmp_path.glob("ab_*"))


def test_a_sequential_plan_round_trips_through_its_stored_form_and_a_fixed_one_refuses_its_fields(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("ops: [add]\nrepeats: auto\nmax_repeats: 8\nresolve: 0.5%\n")
    loaded = ab.load_plan(plan)
    assert (loaded.repeats, loaded.first, loaded.max_repeats, loaded.resolve) == ("auto", 3, 8, 0.005)
    stored = json.loads(json.dumps(loaded.to_dict()))
    assert (stored["repeats"], stored["first"], stored["max_repeats"], stored["resolve"]) == ("auto", 3, 8, 0.005)
    assert ab.plan_from_data(yaml.safe_load(yaml.safe_dump(stored)), "stored", Path("/")).to_dict() == stored
    assert sequential.Schedule.from_plan(stored) == sequential.Schedule(first=3, cap=8, resolve=0.005)
    fixed = ab.plan_from_data({"ops": ["add"], "repeats": 4}, "p").to_dict()
    assert fixed["repeats"] == 4 and not {"first", "max_repeats", "resolve"} & set(fixed)
    for data, refused in (({"repeats": 4, "max_repeats": 8}, "max_repeats: only with repeats: auto"),
                          ({"repeats": "auto", "resolve": "0.2%"}, "'resolve' must be a percentage above 0.3%"),
                          ({"repeats": "auto", "resolve": 1}, "'resolve' must be a percentage above 0.3%"),
                          ({"repeats": "auto", "first": 2}, "'first' must be an integer from 3"),
                          ({"repeats": "some"}, "'repeats' must be an integer from 2 to 100")):
        with pytest.raises(ab.PlanError, match=refused):
            ab.plan_from_data({"ops": ["add"], **data}, "p")


def test_the_command_line_sets_the_sequential_fields_over_the_plan(tmp_path):
    plan = ab.resolve_plan(_args(tmp_path, "--repeats", "auto", "--max-repeats", "6", "--resolve", "2%"))
    assert (plan.repeats, plan.max_repeats, plan.resolve) == ("auto", 6, 0.02)
    given = options.ExperimentOptions(repeats="auto", max_repeats=6, resolve=0.02)
    assert given.to_argv() == ["--repeats", "auto", "--max-repeats", "6", "--resolve", "2%"]
    assert given.flags() == ["--repeats", "--max-repeats", "--resolve"]  # what a corpus A/B's resume refuses


def test_the_least_resolve_is_the_margin_a_call_must_clear():
    assert options.MIN_RESOLVE == stats.MARGIN and options.DEFAULT_RESOLVE == sequential.Schedule.resolve
    assert (options.FIRST_REPEATS, options.DEFAULT_MAX_REPEATS) == (sequential.Schedule.first,
                                                                   sequential.Schedule.cap)


# --- a replay of some cases ---------------------------------------------------------------------------
@pytest.mark.e2e
def test_a_replay_of_some_cases_times_those_alone_and_is_complete(tmp_path, harness):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(SHAPES)
    record = harness("record", "add", "--backend", "interpreter", "--shapes", shapes, "--out", tmp_path)
    assert record.returncode == 0, record.stdout + record.stderr
    source = run_dir_of(record)
    replay = harness("replay", source, "--case", "fp32-64", "--case", "fp32-300", "--out", tmp_path / "r")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    run_dir = run_dir_of(replay)
    assert [row["case"] for row in load(run_dir / "results.json")["rows"]] == ["fp32-300", "fp32-64"]
    observed = load(run_dir / "run.json")
    assert observed["spec"]["cases"] == ["fp32-64", "fp32-300"]
    assert observed["observed"]["outcome"]["status"] == "COMPLETE"
    assert observed["observed"]["outcome"]["rows_planned"] == 2
    refused = harness("replay", source, "--case", "fp32-9", "--out", tmp_path / "r")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: --case 'fp32-9': not a case of this replay of")


@pytest.mark.e2e
def test_a_flaggems_replay_of_some_cases_gives_upstreams_loop_those_alone(tmp_path, harness):
    """A FlagGems benchmark yields its cases inside one test: the cases not named are built (so the ids and
    seeds of the rest stay the record's) but never timed; a named case that never comes is INCOMPLETE."""
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("softmax:\n  shapes: [[2, 8], [3, 16], [4, 8]]\n  dtypes: [fp32]\n")
    record = harness("record", "flaggems:softmax", "--flaggems-dir", CHECKOUT, "--backend", "interpreter",
                     "--shapes", shapes, "--out", tmp_path)
    assert record.returncode == 0, record.stdout + record.stderr
    source = run_dir_of(record)
    digests = {row["case"]: row["input_sha256"] for row in load(source / "results.json")["rows"]}
    assert list(digests) == ["fp32-2x8", "fp32-3x16", "fp32-4x8"]
    replay = harness("replay", source, "--case", "fp32-4x8", "--out", tmp_path / "r")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    run_dir = run_dir_of(replay)
    rows = load(run_dir / "results.json")["rows"]
    assert [(row["case"], row["input_sha256"]) for row in rows] == [("fp32-4x8", digests["fp32-4x8"])]
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert (outcome["status"], outcome["rows_planned"], outcome["rows_done"]) == ("COMPLETE", 1, 1)
    missing = harness("replay", source, "--case", "fp32-9x9", "--out", tmp_path / "r")
    assert missing.returncode != 0
    outcome = load(run_dir_of(missing) / "run.json")["observed"]["outcome"]
    assert outcome["status"] == "INCOMPLETE" and "1 planned case(s) never reported (fp32-9x9)" in outcome["reason"]
