"""A chunk's records and B's passes, --record-jobs at a time, before its repeats (harness.sessions.ab.runner
_Records): they run beside each other sharing the device through the gate, nothing is timed meanwhile, a step
that failed beside others runs again alone, a stop ends every job's step, and a corpus A/B charges a wait to
the op whose step holds the device. The steps are real processes on the interpreter."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import AB_SHAPES, REPO, ab_dir_in, ab_request, exits_of, harness_env, load, wait_for

from harness import cli
from harness.core import abstate, options
from harness.core.errors import UsageError
from harness.measure import device_gate
from harness.sessions import ab
from harness.sessions.ab.plan import PlanError, plan_from_data
from harness.sessions.corpus_ab import _charged

# ab.json rounds a step's start and its seconds to 0.1 s each: an end read from them can be 0.1 s late and the
# next step's start 0.05 s early (CI read a start 0.1 s before an end it followed), and the sums are floats.
ROUNDED_S = 0.15 + 1e-6

CHUNK_OPS = REPO / "tests" / "resources" / "chunk_ops"




def _gate_facts(step: dict) -> dict | None:
    return load(Path(step["run_dir"]) / "run.json")["observed"].get("device_gate")


@pytest.mark.e2e
def test_records_run_together_before_the_repeats_and_one_that_crashed_beside_others_runs_again_alone(tmp_path,
                                                                                                     capsys):
    flag = tmp_path / "crashed"
    code = ab.run_from_args(ab_request(tmp_path, ["crash_once", "add", "softmax"], "--ops-path", str(CHUNK_OPS),
                                     "--a-env", f"ZL_TEST_CRASH_ONCE={flag}", "--repeats", "2", "--chunk", "3",
                                     "--record-jobs", "2"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert flag.exists()
    d = ab_dir_in(out)
    state = load(d / "ab.json")
    steps = state["steps"]
    records = [s for s in steps if s["step"].endswith("/A-record")]
    # crash_once's record died beside another's, then ran again alone, after the jobs had ended.
    crashed, again = [s for s in records if s["step"] == "crash_once/A-record"]
    assert not crashed["usable"] and crashed.get("beside") and again["usable"] and not again.get("beside")
    assert "crash_once] its record or B's passes failed beside others'" in out
    together = [s for s in steps if s.get("beside")]
    assert again["started"] >= max(s["started"] + s["seconds"] for s in together) - ROUNDED_S
    # Two jobs: the first two ops' records began before either ended.
    first, second = sorted(together, key=lambda s: s["started"])[:2]
    assert {first["step"], second["step"]} == {"crash_once/A-record", "add/A-record"}
    assert second["started"] < first["started"] + first["seconds"]
    # Each step run together held the A/B's one gate while its cases ran; no repeat was timed meanwhile, nor
    # through the gate after (nothing beside them then).
    repeats = [s for s in steps if s["step"].split("/")[1] in ("A-1", "B-1", "A-2", "B-2")]
    assert len(repeats) == 12 and min(s["started"] for s in repeats) >= again["started"] + again["seconds"] - ROUNDED_S
    assert all(_gate_facts(s)["role"].startswith("beside") for s in together if s["usable"])
    assert len({_gate_facts(s)["path"] for s in together if s["usable"]}) == 1
    assert all(_gate_facts(s) is None for s in repeats)
    assert "device_gate" not in state and not abstate.running_steps(state)
    rows = load(d / "report.json")["rows"]
    assert {r["op"] for r in rows} == {"crash_once", "add", "softmax"}
    assert all(len(r["a_ms"]) == 2 and len(r["b_ms"]) == 2 for r in rows)
    # Not the A/B's failures: the steps run again say so, and the report names them.
    assert crashed.get("run_again") and not again.get("run_again")
    assert "1 step(s) ran again alone after failing beside other ops'" in out and "step(s) failed" not in out


@pytest.mark.e2e
def test_a_stop_while_records_run_together_stops_every_jobs_step_and_reports_what_completed(tmp_path):
    # hang_op's record hangs in its first case holding the device; fp32_op's, beside it, waits for it or has
    # ended. A SIGINT stops every job's step, each writing its outcome; nothing is left (the autouse fixture).
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(AB_SHAPES)
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ab", "--ops", "hang_op", "fp32_op", "--ops-path",
                             str(REPO / "tests" / "resources" / "batch_ops"), "--backend", "interpreter", "--shapes",
                             str(shapes), "--dtypes", "fp32", "--repeats", "2", "--chunk", "2", "--record-jobs", "2",
                             "--out", str(tmp_path / "runs")], cwd=REPO, env=harness_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        def hanging() -> bool:
            for path in (tmp_path / "runs").glob("ab_*/ab.json"):
                state = json.loads(path.read_text() or "{}")
                for step in abstate.running_steps(state):
                    if step["what"].endswith("hang_op] A records"):
                        run_json = Path(step["run_dir"]) / "run.json"
                        held = device_gate.holder(state.get("device_gate"))
                        return run_json.is_file() and held is not None and held[1] == step["run_dir"]
            return False

        assert wait_for(hanging, 180)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode in exits_of(signal.SIGINT), out
    assert "INCOMPLETE" in out
    state = load(ab_dir_in(out) / "ab.json")
    stopped = [s for s in abstate.running_steps(state) if s["what"].endswith("hang_op] A records")]
    assert len(stopped) == 1 and "hang_op/A-record" not in [s["step"] for s in state["steps"]]
    outcome = load(Path(stopped[0]["run_dir"]) / "run.json")["observed"]["outcome"]
    assert outcome["status"] == "INCOMPLETE" and "interrupted" in outcome["reason"]
    assert not any(s["step"].split("/")[1] in ("A-1", "B-1") for s in state["steps"])


def test_the_running_steps_are_the_main_threads_then_each_record_jobs_in_order():
    state = {"running_beside_10": {"n": 10}, "running_beside": {"n": 1}, "running": {"n": 0},
             "running_beside_2": {"n": 2}, "running_besides": {"n": -1}, "running_beside_x": {"n": -2}}
    assert [abstate.beside_key(j) for j in range(3)] == ["running_beside", "running_beside_2", "running_beside_3"]
    assert [s["n"] for s in abstate.running_steps(state)] == [0, 1, 2, 10]
    step = {"what": "x", "side": "A", "args": ["record"], "run_dir": None, "started": 1.0}
    assert abstate.problem({"plan": {"backend": "interpreter", "repeats": 2}, "steps": [],
                            "running_beside_2": step}) is None
    assert "running_beside_3" in abstate.problem({"plan": {"backend": "interpreter", "repeats": 2}, "steps": [],
                                                  "running_beside_3": {**step, "args": "record"}})


def _step(run_dir: Path, started: float) -> dict:
    return {"what": "w", "side": "A", "args": ["record"], "run_dir": str(run_dir), "started": started}


def test_a_wait_is_charged_to_the_op_whose_step_holds_the_device_else_to_each_step_beside(tmp_path):
    gate_path = tmp_path / "device.gate"
    now = time.time()
    main = _step(tmp_path / "c" / "A-1" / "c_1", now)
    first = _step(tmp_path / "a" / "A-record" / "a_1", now)
    second = _step(tmp_path / "b" / "B-passes" / "b_1", now)
    state = {"device_gate": str(gate_path), "running": main, "running_beside": first, "running_beside_2": second}
    assert _charged(state) == [first, second]  # none holds it: each beside its own time
    gate = device_gate.DeviceGate(gate_path, role=device_gate.BESIDE, owner=second["run_dir"])
    with gate.held():
        assert device_gate.holder(gate_path) == (device_gate.BESIDE, second["run_dir"])
        assert _charged(state) == [second]  # the others wait for it
    gate.close()
    timed = device_gate.DeviceGate(gate_path, role=device_gate.TIMED)
    with timed.held():
        assert device_gate.holder(gate_path) == (device_gate.TIMED, None)
        assert _charged(state) == [main]
    timed.close()
    assert _charged({"running": main}) == [main] and _charged({}) == []


@pytest.mark.parametrize("jobs", [0, options.MAX_RECORD_JOBS + 1, "2", 1.5])
def test_a_plans_record_jobs_outside_its_range_is_refused_in_one_line(tmp_path, jobs):
    with pytest.raises(PlanError, match=r"'record_jobs' must be an integer from 1 to \d+, not"):
        plan_from_data({"ops": ["add"], "record_jobs": jobs}, tmp_path / "p.yaml")


def test_the_command_lines_record_jobs_is_the_plans_and_round_trips_through_its_stored_form(tmp_path):
    plan = ab.resolve_plan(ab_request(tmp_path, ["add", "softmax"], "--chunk", "2", "--record-jobs", "3"))
    assert plan.record_jobs == 3
    assert plan_from_data(plan.to_dict(), "stored", Path("/")).record_jobs == 3
    assert ab.resolve_plan(ab_request(tmp_path, ["add"])).record_jobs == options.DEFAULT_RECORD_JOBS
    with pytest.raises(SystemExit):
        cli.parse_request(["ab", "--ops", "add", "--record-jobs", "0"])


@pytest.mark.parametrize("extra", [(), ("--chunk", "1"), ("--chunk", "2", "--step-start", "fresh")])
def test_record_jobs_where_no_chunk_records_together_is_refused_not_ignored(tmp_path, extra):
    with pytest.raises(UsageError, match="--record-jobs 2: a chunk's ops record together"):
        ab.resolve_plan(ab_request(tmp_path, ["add", "softmax"], "--record-jobs", "2", *extra))


class _StandInRunner:
    """What _Records asks of the runner: each op's record and passes, as a stand-in that records which job ran
    it and, for `blocks`, waits until the jobs are stopped."""

    def __init__(self, raises: str | None = None, blocks: str | None = None):
        import threading

        self._job = threading.local()
        self.raises, self.blocks = raises, blocks
        self.ran: list[tuple[str, int]] = []
        self.saw_stop: list[str] = []

    def _record_and_passes(self, i, op, beside):
        self.ran.append((op, self._job.number))
        if op == self.raises:
            raise OSError(f"{op}: a write failed")
        if op == self.blocks:
            assert beside.wait(60)
            self.saw_stop.append(op)
            from harness.sessions.ab.steps import StepInterrupted

            raise StepInterrupted(signal.SIGINT)
        return None if op == "no_record" else f"timed {op}"


def test_record_jobs_take_the_chunks_ops_in_turn_each_in_its_own_job_and_yield_each_as_it_ends():
    from harness.sessions.ab.runner import _Records

    runner = _StandInRunner()
    chunk = [(1, "a"), (2, "no_record"), (3, "c"), (4, "d"), (5, "e")]
    records = _Records(runner, chunk, jobs=3)
    try:
        got = dict(records)
    finally:
        records.close()
    assert got == {1: "timed a", 2: None, 3: "timed c", 4: "timed d", 5: "timed e"}
    assert sorted(op for op, _ in runner.ran) == ["a", "c", "d", "e", "no_record"]
    assert {job for _, job in runner.ran} <= {0, 1, 2} and len(records.threads) == 3
    assert len(_Records(_StandInRunner(), chunk[:2], jobs=8).threads) == 2  # no more jobs than ops


def test_a_job_that_raises_stops_the_others_steps_and_the_error_reaches_the_main_thread_once_all_ended():
    from harness.sessions.ab.runner import _Records

    runner = _StandInRunner(raises="a", blocks="b")
    records = _Records(runner, [(1, "b"), (2, "a"), (3, "c")], jobs=2)
    try:
        with pytest.raises(OSError, match="a: a write failed"):
            list(records)
    finally:
        records.close()
    assert runner.saw_stop == ["b"]  # stopped, not waited for to its end
    assert "c" not in [op for op, _ in runner.ran]  # no step started after the error
    assert not any(t.is_alive() for t in records.threads)


def test_a_corpus_ab_records_4_at_a_time_unless_its_plan_or_command_line_names_how_many_or_it_records_beside(
        tmp_path):
    from harness.sessions.corpus_ab import CORPUS_CHUNK, CORPUS_RECORD_JOBS

    def jobs(*extra, plan=None):
        request = ab_request(tmp_path, ["add", "softmax"], *extra)
        if plan is not None:
            path = tmp_path / "plan.yaml"
            path.write_text(plan)
            request = cli.parse_request(["ab", str(path), "--backend", "interpreter", "--out", str(tmp_path / "r")])
        return ab.resolve_plan(request, CORPUS_CHUNK, CORPUS_RECORD_JOBS).record_jobs

    assert CORPUS_RECORD_JOBS == 4 and jobs() == 4
    assert jobs("--record-jobs", "2") == 2 and jobs("--chunk", "1") == 1
    assert jobs("--chunk-records", "beside") == 1  # beside the repeats: one record at a time unless asked
    assert jobs("--step-start", "fresh") == 1
    assert jobs(plan="ops: [add, softmax]\nrecord_jobs: 1\n") == 1 and jobs(plan="ops: [add, softmax]\n") == 4
    assert ab.resolve_plan(ab_request(tmp_path, ["add", "softmax"], "--chunk", "4")).record_jobs == 1  # not a corpus
