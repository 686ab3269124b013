"""Corpus A/B (`python -m harness ab` with batch options): each op's whole single-op A/B as one batch
job on one device, on the interpreter with 2 virtual devices and tiny shapes; the Ray executor's
device choice (a fake runtime context) and a Slurm task's (the Slurm executor on a real Slurm: test_slurm_executor)."""

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from batch_fakes import HangingOp
from conftest import REPO, exits_of, harness_env, in_a_case, load, pids_mentioning, wait_for
from result_rows import result_row

import backends
from harness import cli
from harness.core import batchdir, opguard
from harness.core.commands import CorpusABRequest
from harness.core.errors import UsageError
from harness.core.options import BatchOptions, CorpusOptions, RunOptions, declared
from harness.providers import catalog
from harness.sessions import ab, batch, corpus_ab, ray_executor, slurm_executor
from harness.sessions.batch import executor as batch_executor
from harness.sessions.batch import facts as batch_facts

OPS = REPO / "tests" / "resources" / "batch_ops"
STEPS = ("A-record", "B-passes", "A-1", "B-1", "A-2", "B-2")  # an A/B of 2 repeats, in order


def statuses(batch_dir: Path) -> dict[str, dict]:
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r for r in csv.DictReader(f)}


@pytest.fixture
def corpus(tmp_path):
    """`python -m harness ab ARGS` (a corpus A/B) in its own session; killed at teardown if a failed
    test left it running."""
    started = []

    def start(*args) -> subprocess.Popen:
        env = harness_env()
        env["ZL_TEST_STATE_DIR"] = str(tmp_path)
        started.append(subprocess.Popen(
            [sys.executable, "-m", "harness", "ab", "--backend", "interpreter", "--repeats", "2",
             "--b-env", "ZL_SIDE=b", "--ops-path", str(OPS), "--dtypes", "fp32", "--out", str(tmp_path / "out"),
             *map(str, args)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)  # a pipe a leftover still holds fails the test, not hangs it


def _batch_dir(out_dir: Path, timeout: float = 120) -> Path:
    assert wait_for(lambda: out_dir.is_dir() and any(out_dir.iterdir()), timeout)
    return next(out_dir.iterdir())


def _step_devices(ab_dir: Path) -> dict[str, int]:
    """The device each step of a single-op A/B ran on, from its run.json."""
    return {step.name: load(next(step.glob("*/run.json")))["spec"]["device"] for step in ab_dir.glob("*/*")
            if step.is_dir() and any(step.glob("*/run.json"))}


@pytest.mark.e2e
def test_each_op_runs_its_whole_ab_on_its_own_device(corpus, tmp_path):
    # add shards to device 0 and softmax to device 1 (stable hash over 2 devices): two A/Bs side by side.
    assert [batch.shard(k, 2) for k in ("builtin:add@add", "builtin:softmax@softmax")] == [0, 1]
    proc = corpus("--ops", "builtin:add", "softmax", "--devices", "0,1")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    d = next((tmp_path / "out").iterdir())
    st = statuses(d)
    for op, device in (("add", 0), ("softmax", 1)):
        assert st[op]["status"] == "PASS" and st[op]["device"] == str(device) and st[op]["verdicts"] == "n/a 2"
        ab_dir = d / st[op]["run_dir"]
        assert ab_dir.parent.name == "attempt1" and ab_dir.parent.parent == d / "ops" / f"builtin__{op}"
        # Today's single-op A/B dir, every step on the op's device.
        assert (ab_dir / "report.json").is_file() and load(ab_dir / "ab.json")["complete"]
        assert _step_devices(ab_dir) == dict.fromkeys(STEPS, device)
        assert f"PASS     builtin:{op} device={device}" in out
    assert "[n/a 2]" in out and "done: PASS 2; verdicts: n/a 4; report: " in out
    report = load(d / "report.json")  # the corpus report, over both ops' A/B dirs
    assert report["summary"]["ops_compared"] == 2
    assert load(d / "batch.json")["request"]["plan"]["b"]["env"] == {"ZL_SIDE": "b"}


@pytest.mark.e2e
def test_an_op_past_its_timeout_is_killed_with_its_steps(corpus, tmp_path):
    # Long enough for A's record to reach its first case on a loaded 2-core box (two processes start
    # before it: the op's guard and the record's child), so the timeout names the case it killed.
    proc = corpus("--ops", "hang_op", "--devices", "1", "--op-timeout", "60")
    # Its timeout, and room for start-up and the corpus report: a timeout not taken fails the test, in 3 minutes.
    out, _ = proc.communicate(timeout=60 + 120)
    assert proc.returncode == 1, out
    d = next((tmp_path / "out").iterdir())
    st = statuses(d)["hang_op"]
    assert st["status"] == "TIMEOUT" and st["device"] == "1" and st["attempts"] == "1"
    assert st["notes"].startswith("timeout after 60 s during case fp32-")
    assert st["notes"].endswith("(killed, not retried)")
    hang_ab = next((d / "ops" / "path__hang_op" / "attempt1").glob("ab_*"))
    assert _step_devices(hang_ab) == {"A-record": 1}
    assert "TIMEOUT  path:hang_op device=1" in out
    assert [u["op"] for u in load(d / "report.json")["unpaired_ops"]] == ["path:hang_op"]
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))


@pytest.mark.e2e
def test_kill_9_then_resume_continues_where_it_stopped(corpus, tmp_path):
    # An op a process (--chunk 1): the kill lands between two ops' A/Bs (a chunk's: tests/test_corpus_chunks.py).
    proc = corpus("--ops", "builtin:add", "fp32_op", "--devices", "0", "--chunk", "1")
    d = _batch_dir(tmp_path / "out")
    assert wait_for(lambda: (d / "ops_status.csv").is_file() and "PASS" in (d / "ops_status.csv").read_text(), 400)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)  # a pipe a leftover still holds fails the test, not hangs it
    # The op that was running dies with its corpus A/B (its guard saw the driver go), steps included.
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))
    done = {op: r for op, r in statuses(d).items() if r["status"] == "PASS"}
    assert len(done) == 1
    (op, row), = done.items()
    marker = d / "ops" / f"{row['repo']}__{op}" / ".complete"
    mtime = marker.stat().st_mtime

    resumed = corpus("--resume", "--batch-dir", d)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 2 and "--resume continues the A/B stored in the batch dir" in out, out
    env = harness_env()
    resumed = subprocess.run([sys.executable, "-m", "harness", "ab", "--resume", "--batch-dir", str(d)], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "2 selected, 1 already done" in resumed.stdout
    st = statuses(d)
    assert {r["status"] for r in st.values()} == {"PASS"} and marker.stat().st_mtime == mtime  # not rerun
    assert load(d / "report.json")["summary"]["ops_compared"] == 2


@pytest.mark.e2e
def test_ctrl_c_stops_every_step_and_reports_what_completed(corpus, tmp_path):
    proc = corpus("--ops", "hang_op", "--devices", "1", "--op-timeout", "300")
    d = _batch_dir(tmp_path / "out")
    # Inside the A record's case: its pytest child runs.
    assert wait_for(lambda: in_a_case(d), 240)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in exits_of(signal.SIGINT), out
    assert (f"interrupted (SIGINT): every running op was killed (path:hang_op); resume with --resume --batch-dir "
            f"{d}") in out
    assert (d / "report.json").is_file()
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))


def _args(*argv):
    return cli.parse_request(["ab", *argv])


def prepare(args, stored: dict):
    """CorpusAB.prepare as the batch calls it: over the options the command line gives."""
    return corpus_ab.CorpusAB.prepare(CorpusABRequest.of(args), stored, args.run)


def test_a_single_op_without_corpus_options_is_todays_ab():
    assert not corpus_ab.wanted(_args("--ops", "softmax"))
    assert not corpus_ab.wanted(_args("ops/ab_f32_ieee.yaml", "--device", "1", "--repeats", "5"))
    assert not corpus_ab.wanted(_args("--compare", "a", "b"))
    # The parser's own defaults given again are not corpus options.
    assert not corpus_ab.wanted(_args("--ops", "softmax", "--executor", "local", "--sample-seed", "0"))
    # Every option `ab` takes from the batch's sets makes it a corpus A/B, each alone: derived from the
    # declarations, so an option added to them is covered.
    examples = {"--devices": "0,1", "--op-timeout": "5", "--executor": "ray", "--sample-seed": "7"}
    taken = [meta for option_set in (BatchOptions, CorpusOptions) for _, meta in declared(option_set)
             if "ab" in meta.commands]
    assert {m.flag for m in taken} >= {"--all", "--devices", "--executor", "--resume", "--op-timeout", "--ops-file",
                                       "--repos", "--batch-dir", "--sample", "--ray-address", "--slurm-param"}
    for meta in taken:
        extra = [meta.flag] if meta.flag_only else [meta.flag, examples.get(meta.flag, "3")]
        assert corpus_ab.wanted(_args("--ops", "softmax", *extra)), extra


def test_a_corpus_ab_times_its_ops_in_chunks_unless_its_plan_or_command_line_names_another(tmp_path):
    """Each chunk pays its A/B's start once (5-7 s on an H100 with FlagGems): a corpus A/B run as the README
    shows it, without --chunk, takes CORPUS_CHUNK; a plan's or the command line's chunk wins, 1 included, and
    the remote executors (an op a task) and every-step passes (no hosts) keep one op a process."""
    def chunk(*argv, plan_text=None):
        if plan_text is not None:
            (tmp_path / "plan.yaml").write_text(plan_text)
            argv = (str(tmp_path / "plan.yaml"), *argv)
        (extra, _, _) = prepare(_args(*argv, "--all", "--backend", "interpreter"), {})
        return extra["plan"]["chunk"]

    assert corpus_ab.CORPUS_CHUNK == 8
    assert chunk() == chunk("--ops", "add", "gelu") == chunk(plan_text="ops: [add]\n") == 8
    assert chunk("--chunk", "1") == 1 and chunk("--chunk", "3") == 3
    assert chunk(plan_text="ops: [add]\nchunk: 1\n") == 1
    assert chunk("--chunk", "2", plan_text="ops: [add]\nchunk: 1\n") == 2
    assert chunk("--executor", "slurm") == 1
    assert chunk(plan_text="ops: [add]\nstep_passes: every\n") == 1


def test_the_op_job_runs_the_plan_on_its_device(tmp_path):
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    plan.options = dataclasses.replace(plan.options, timer="profiler", l2="cold")
    opts = corpus_ab.ABOptions(RunOptions(backend="interpreter"), [0, 1], plan=plan.to_dict())
    runner = corpus_ab.CorpusAB(tmp_path, opts, {})
    op_dir = tmp_path / "ops" / "flaggems__mm"
    op_dir.mkdir(parents=True)
    entry = catalog.Entry("flaggems", "mm", "blas", "benchmark/test_blas.py")
    ab_dir = runner._run_dir(entry, op_dir / "attempt1")
    assert ab_dir.parent == op_dir / "attempt1" and re.fullmatch(r"ab_f32-ieee_\d{8}-\d{6}", ab_dir.name)
    cmd = runner._command(entry, 1, ["fp32"], ab_dir)
    assert cmd == ["ab", str(op_dir / "plan.yaml"), "--ops", "flaggems:mm@blas", "--device", "1",
                   "--color", "never", "--run-dir", str(ab_dir), "--dtypes", "fp32"]
    again = ab.load_plan(op_dir / "plan.yaml")  # the plan each op's A/B reads back
    assert again.b.env == {"TRITON_F32_DEFAULT": "ieee"} and again.repeats == 3 and again.options.device is None
    assert again.options.shapes == REPO / "shapes" / "default.yaml"
    assert again.options.measurement() == RunOptions(timer="profiler", l2="cold")  # how A records, with the plan


def _run(run_dir: Path, observed: dict, rows: int = 0) -> str:
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"observed": observed}))
    (run_dir / "results.json").write_text(json.dumps({"format": 1, "rows": [result_row(timer="host")] * rows}))
    return str(run_dir)


def test_an_ops_ab_is_read_back_from_the_dirs_it_named_never_a_stray_one(tmp_path):
    """The attempt's A/B dir is the one the batch named; its steps' run dirs are the ones its
    ab.json names (the running step's too): nothing else in the attempt dir is looked at."""
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    runner = corpus_ab.CorpusAB(tmp_path, corpus_ab.ABOptions(RunOptions(backend="interpreter"), [0],
                                                              plan=plan.to_dict()), {})
    attempt = tmp_path / "ops" / "builtin__add" / "attempt1"
    stray = attempt / "ab_f32-ieee_19990101-000000"  # a passed A/B left in the attempt dir
    stray.mkdir(parents=True)
    (stray / "ab.json").write_text(json.dumps({"steps": [], "complete": True}))
    (stray / "report.json").write_text(json.dumps({"rows": [{"comparison": {"verdict": "SAME"}}]}))
    ab_dir = runner._run_dir(catalog.Entry("builtin", "add", "add", "ops/add.py"), attempt)
    assert ab_dir != stray and not runner._wrote(ab_dir) and not runner._passed(0, ab_dir)
    assert runner._stopped_in(ab_dir) == ab_dir and runner._facts(ab_dir)["rows"] == 0
    ab_dir.mkdir()
    record = {"what": "A records", "args": ["record", "add"],
              "run_dir": _run(ab_dir / "add" / "A-record" / "add_1", {"dtype_rejected": True}, rows=2)}
    state = {"steps": [], "running": record}  # killed during A's record
    (ab_dir / "ab.json").write_text(json.dumps(state))
    assert runner._wrote(ab_dir) and runner._stopped_in(ab_dir) == Path(record["run_dir"])
    assert runner._facts(ab_dir)["timer"] == "host"  # A's record's, read where ab.json says it is
    assert not runner._rejected(4, ab_dir)  # not ended yet
    state = {"steps": [{**record, "exit": 4}], "running": {"what": "A replays", "args": ["replay", "x"],
                                                          "run_dir": str(ab_dir / "add" / "A-1" / "add_2")}}
    (ab_dir / "ab.json").write_text(json.dumps(state))
    assert runner._rejected(4, ab_dir)  # the child's own dtype_rejected, in the run dir the step named
    assert runner._stopped_in(ab_dir) == ab_dir / "add" / "A-1" / "add_2"  # not claimed yet: said as such
    assert batch_facts.killed_during(runner._stopped_in(ab_dir)).startswith("before its run dir was written")
    (ab_dir / "ab.json").write_text(json.dumps({"steps": [{**record, "exit": 4}]}))  # between steps
    assert runner._stopped_in(ab_dir) == Path(record["run_dir"])


def test_relative_paths_reach_each_ops_ab_as_the_user_meant_them(tmp_path, monkeypatch):
    """Each op's A/B reads the plan written into its own dir and runs from elsewhere: a relative
    checkout, python or LibTuner cache on the command line is the current directory's, one in a plan
    file is the plan's folder's."""
    resources = REPO / "tests" / "resources"
    monkeypatch.chdir(resources)
    args = _args("--backend", "interpreter", "--ops", "flaggems:abs", "--devices", "0", "--flaggems-dir",
                 "flaggems_checkout", "--a-python", os.path.relpath(sys.executable), "--libtuner-cache", "tuned.db")
    written = tmp_path / "ops" / "flaggems__abs" / "plan.yaml"
    written.parent.mkdir(parents=True)
    written.write_text(corpus_ab.yaml.safe_dump(ab.resolve_plan(args).to_dict()))
    monkeypatch.chdir(tmp_path)
    again = ab.load_plan(written)
    assert again.options.flaggems_dirs == (f"flaggems={resources / 'flaggems_checkout'}",)
    assert again.a.python == os.path.abspath(sys.executable)  # a venv's python stays the venv's link
    assert again.options.libtuner_cache == str(resources / "tuned.db")

    (tmp_path / "envs" / "b" / "bin").mkdir(parents=True)
    (tmp_path / "envs" / "b" / "bin" / "python").touch(0o755)  # a side's python is a program
    plan = tmp_path / "plans" / "p.yaml"
    plan.parent.mkdir()
    plan.write_text("ops: [abs]\nflaggems_dirs: [../checkout]\nlibtuner_cache: tuned.db\n"
                    "b: {env: {X: '1'}, python: ../envs/b/bin/python}\n")
    monkeypatch.chdir(resources)
    loaded = ab.load_plan(plan)
    assert loaded.options.flaggems_dirs == (f"flaggems={tmp_path / 'checkout'}",)
    assert loaded.b.python == str(tmp_path / "envs" / "b" / "bin" / "python")
    assert loaded.options.libtuner_cache == str(tmp_path / "plans" / "tuned.db")


def test_a_resume_keeps_the_stored_plan_and_refuses_a_new_measurement(tmp_path):
    stored = {"plan": ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml").to_dict()}
    # Every experiment option (harness.core.options.ExperimentOptions): --fdr was once taken and ignored.
    for flags in (["--timer", "direct"], ["--seed", "0"], ["--repeats", "4", "--l2", "cold"], ["--fdr", "0.1"],
                  ["--a-env", "X=1", "--step-start", "fork"], ["--b-python", "/x", "--step-passes", "every"],
                  ["--a-python", "/y", "--b-env", "Y=2"],
                  ["--repeats", "auto", "--max-repeats", "8", "--resolve", "2%"]):
        args = _args("--resume", "--batch-dir", str(tmp_path), *flags)
        dropped = " ".join(f for f in flags if f.startswith("--"))
        with pytest.raises(UsageError, match="--resume continues the A/B stored in the batch dir, whose plan "
                                                   f"it keeps: drop {dropped}"):
            prepare(args, stored)
    # A plan file given again is refused by its place, PLAN, alone or beside an option.
    plan = str(REPO / "ops" / "ab_default.yaml")
    for flags, dropped in (([], "PLAN"), (["--repeats", "4"], "PLAN --repeats")):
        with pytest.raises(UsageError, match=f"whose plan it keeps: drop {dropped}$"):
            prepare(_args(plan, "--resume", "--batch-dir", str(tmp_path), *flags), stored)


# --- a finished op's A/B, as the batch reads it ---------------------------------------------------------
def _runner(tmp_path, backend="cuda"):
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    return corpus_ab.CorpusAB(tmp_path, corpus_ab.ABOptions(RunOptions(backend=backend), [0], plan=plan.to_dict()),
                              {})


def _finished(ab_dir: Path, report_rows: list | None, record_statuses=("SUCCESS",), complete=True) -> Path:
    """An op's A/B dir: A's record step (its run's rows of these statuses), ab.json, and its report.json."""
    record = ab_dir / "add" / "A-record" / "add_1"
    record.mkdir(parents=True)
    (record / "results.json").write_text(json.dumps({"format": 1, "rows": [
        result_row(status=s, timer="graph") for s in record_statuses]}))
    steps = [{"what": "A records", "args": ["record", "add"], "exit": 0, "run_dir": str(record)}]
    (ab_dir / "ab.json").write_text(json.dumps({"steps": steps, "complete": complete}))
    if report_rows is not None:
        (ab_dir / "report.json").write_text(json.dumps({"rows": report_rows}))
    return ab_dir


def _report_row(verdict, flags=(), timers=("graph",)):
    """A row of a single-op A/B's report.json (comparison None: a row one side lacks)."""
    return {"comparison": None if verdict is None else {"verdict": verdict}, "flags": list(flags),
            "timers": list(timers)}


def test_a_finished_ops_facts_are_its_reports_rows_flags_timers_and_verdicts(tmp_path):
    runner = _runner(tmp_path)
    ab_dir = _finished(tmp_path / "ops" / "builtin__add" / "attempt1" / "ab_t", [
        _report_row("SAME"), _report_row("FASTER", ["timer_fallback"], ["direct", "graph"]),
        _report_row(None, ["replay_fallback"]), _report_row("SAME", ["timer_fallback", "replay_fallback"])])
    facts = runner._facts(ab_dir)
    assert (facts["rows"], facts["timer"], facts["timer_fallback_rows"], facts["replay_fallback_rows"]) == (
        4, "direct+graph", 2, 2)
    assert facts["verdicts"] == {"SAME": 2, "FASTER": 1, "UNPAIRED": 1}
    assert facts["statuses"] == {"SUCCESS": 1}  # A's record's cases
    assert runner._columns(facts) == {"verdicts": "FASTER 1, SAME 2, UNPAIRED 1"}
    assert runner._passed(0, ab_dir)
    row = batchdir.StatusRow.from_csv({
        "status": "PASS", "repo": "builtin", "op": "add", "device": "1", "elapsed_s": "2.5", "rows": "4",
        "run_dir": str(ab_dir.relative_to(tmp_path)), "verdicts": "FASTER 1, SAME 2, UNPAIRED 1", "notes": ""})
    assert runner.tally(row) == {"PASS": 1, "SAME": 2, "FASTER": 1, "UNPAIRED": 1}
    assert runner.done_line(row) == "PASS     builtin:add device=1 2.5 s rows=4 [FASTER 1, SAME 2, UNPAIRED 1]"
    failed = dataclasses.replace(row, status="FAIL", run_dir="", rows=0, notes="exit 1", extra={"verdicts": ""})
    assert runner.tally(failed) == {"FAIL": 1}
    assert runner.done_line(failed) == "FAIL     builtin:add device=1 2.5 s rows=0  exit 1"
    assert runner._facts(None)["verdicts"] == {} and runner._facts(None)["rows"] == 0


def test_an_op_passes_with_a_complete_report_over_rows_or_over_every_case_skipped(tmp_path):
    runner = _runner(tmp_path)
    assert runner._passed(0, _finished(tmp_path / "ok", [_report_row("SAME")]))
    assert not runner._passed(0, _finished(tmp_path / "stopped", [_report_row("SAME")], complete=False))
    assert not runner._passed(0, _finished(tmp_path / "no_report", None))
    # A report with no row: the op's cases all skipped (an op for another device) passes; otherwise not.
    assert runner._passed(0, _finished(tmp_path / "skipped", [], record_statuses=("SKIPPED", "SKIPPED")))
    assert not runner._passed(0, _finished(tmp_path / "lost", [], record_statuses=("SKIPPED", "SUCCESS")))
    # A record step that wrote no run dir: no record facts, the A/B dir still read.
    ab_dir = tmp_path / "norecord"
    ab_dir.mkdir()
    (ab_dir / "ab.json").write_text(json.dumps({"steps": [{"what": "A records", "args": ["record", "add"], "exit": 1,
                                                           "run_dir": None}]}))
    assert corpus_ab._record_dir(ab_dir) is None and runner._facts(ab_dir)["statuses"] == {}
    assert runner._stopped_in(ab_dir) == ab_dir


def test_a_fresh_corpus_ab_takes_what_and_where_from_its_plan(tmp_path, capsys):
    args = _args(str(REPO / "ops" / "ab_f32_ieee.yaml"), "--devices", "0", "--backend", "interpreter",
                 "--batch-dir", str(tmp_path))
    stored, run, ops = prepare(args, {})
    plan = corpus_ab._plan_of(stored["plan"])  # stored whole, as the ops' A/Bs will read it
    assert (plan.name, plan.options.backend, plan.repeats, plan.b.env) == ("f32-ieee", "interpreter", 3,
                                                                            {"TRITON_F32_DEFAULT": "ieee"})
    # The batch runs what and where the plan says (the interpreter's tiny shapes in place of a GPU's), not how
    # A records (each op's A/B reads that from the plan).
    assert (run.backend, ops, run.dtypes, run.shapes) == ("interpreter", ["mm"], ("fp32",), plan.options.shapes)
    assert run.shapes.name == "tiny.yaml"
    assert run == dataclasses.replace(plan.options.without_measurement(), device=None)
    out = capsys.readouterr().out.splitlines()
    assert (f"A/B f32-ieee: A = {plan.a.describe()}; B = {plan.b.describe()}; 3 repeats interleaved; "
            "each op's whole A/B on one device") in out
    assert any(line.startswith("NOTE: backend 'interpreter'") for line in out)  # no performance numbers
    assert corpus_ab.CorpusAB.dir_prefix(stored) == "ab-corpus_f32-ieee"
    # Ops named on the command line are the ones run, not the plan's.
    chosen = _args(str(REPO / "ops" / "ab_f32_ieee.yaml"), "--ops", "add", "--devices", "0", "--backend", "interpreter")
    assert prepare(chosen, {})[2] == ["add"]


def test_each_ops_ab_names_its_op_as_its_repo_does_and_every_dtype_asked(tmp_path):
    runner = _runner(tmp_path, backend="interpreter")
    cases = [(catalog.Entry("builtin", "add", "add", "ops/add.py"), "add"),
             (catalog.Entry("path", "myop", "myop", str(tmp_path / "myop.py")), "myop"),  # found in --ops-path
             (catalog.Entry("flaggems", "mm", "blas", "benchmark/test_blas.py"), "flaggems:mm@blas")]  # a checkout's
    for entry, target in cases:
        ab_dir = tmp_path / "ops" / entry.op / "attempt1" / "ab_t"
        ab_dir.parent.mkdir(parents=True)
        cmd = runner._command(entry, 0, ["fp16", "fp32"], ab_dir)
        assert cmd[cmd.index("--ops") + 1] == target and cmd[-2:] == ["--dtypes", "fp16,fp32"], cmd
        assert "--dtypes" not in runner._command(entry, 0, None, ab_dir)  # the plan's dtypes


def test_only_a_record_that_failed_for_its_dtypes_is_a_dtype_rejection(tmp_path):
    from harness.core.errors import DtypeRejected

    runner = _runner(tmp_path)

    def ab_dir_whose_record(name, code, rejected_in_run_json):
        ab_dir = tmp_path / name
        record = ab_dir / "add" / "A-record" / "add_1"
        record.mkdir(parents=True)
        (record / "run.json").write_text(json.dumps({"observed": {"dtype_rejected": rejected_in_run_json}}))
        steps = [{"what": "A records", "args": ["record", "add"], "exit": code, "run_dir": str(record)}]
        (ab_dir / "ab.json").write_text(json.dumps({"steps": steps}))
        return ab_dir

    assert runner._rejected(1, ab_dir_whose_record("flaggems_said", 1, True))  # FlagGems' own, in its run.json
    assert not runner._rejected(1, ab_dir_whose_record("crashed", 1, False))
    # A record that ran (some dtypes taken, others not): the op is no rejection.
    assert not runner._rejected(0, ab_dir_whose_record("ran", 0, True))
    # Ours, said by the exit code before the record wrote a run dir.
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "ab.json").write_text(json.dumps({"steps": [{"what": "A records", "args": ["record", "add"],
                                                         "exit": DtypeRejected.exit_code, "run_dir": None}]}))
    assert runner._rejected(DtypeRejected.exit_code, ours)


def test_a_failed_op_tallies_its_status_alone_beside_an_earlier_report_in_the_batch_dir(tmp_path):
    # A resumed corpus A/B: the batch dir holds the report its first run wrote.
    (tmp_path / "report.json").write_text(json.dumps({"rows": [{"comparison": {"verdict": "SAME"}}]}))
    row = batchdir.StatusRow(op="add", repo="builtin", status="FAIL", device=0, elapsed_s=1.0, rows=0,
                             extra={"verdicts": ""})
    assert _runner(tmp_path).tally(row) == {"FAIL": 1}


def test_ab_with_batch_options_runs_the_corpus_ab_job(monkeypatch):
    seen = []
    monkeypatch.setattr(batch, "run_from_args", lambda args, job: seen.append((args, job)) or 0)
    assert cli.main(["ab", "--ops", "add", "--devices", "0", "--backend", "interpreter"]) == 0
    ((args, job),) = seen
    assert job is corpus_ab.CorpusAB and (args.selection.ops, args.how.devices) == (("add",), "0")  # the batch request


def test_a_resumed_corpus_ab_runs_the_plan_stored_in_its_batch_dir(tmp_path, capsys):
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    stored = {"plan": {**plan.to_dict(), "backend": "interpreter", "repeats": 5}}
    args = _args("--resume", "--batch-dir", str(tmp_path), "--backend", "interpreter")  # as the batch restores it
    assert prepare(args, stored)[0] == stored  # kept as it was, not resolved again
    assert f"; B = {plan.b.describe()}; 5 repeats interleaved; " in capsys.readouterr().out
    # A plain batch's dir, or a plan the batch.json holds corrupt: one line saying which and what to do.
    with pytest.raises(UsageError, match=re.escape(
            f"--resume --batch-dir {tmp_path}: a batch, not a corpus A/B: resume it with nox -s batch -- --resume "
            "--batch-dir DIR")):
        prepare(args, {"backend": "interpreter"})
    with pytest.raises(UsageError, match=re.escape(f"stored in {tmp_path / batchdir.BATCH_JSON}") + ".*"
                       + re.escape("(a corrupt batch.json: start a new --batch-dir)")):
        prepare(args, {"plan": {**stored["plan"], "repeats": 1}})


def test_a_corrupt_stored_plan_is_one_line_naming_where_it_was_stored():
    data = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml").to_dict()
    assert corpus_ab._plan_of(data) == ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")  # paths absolute
    with pytest.raises(UsageError) as refused:
        corpus_ab._plan_of({**data, "repeats": 1})
    assert str(refused.value).startswith("plan stored in batch.json: 'repeats' must be an integer from 2 to 100")
    assert str(refused.value).endswith(" (a corrupt batch.json: start a new --batch-dir)")


def test_a_selection_on_the_command_line_replaces_the_plans_ops(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("ops: [add]\n")  # no shape file: each op's own
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text("mm\n")
    for selection in (["--all"], ["--ops-file", str(ops_file)], ["--repos", "builtin"]):
        args = _args(str(plan_file), "--backend", "interpreter", "--devices", "0", *selection)
        _, run, ops = prepare(args, {})
        # The plan's ops go to the batch, which selects them only when the command line names no selection.
        assert run.shapes is None and ops == ["add"], selection
    args = _args(str(plan_file), "--backend", "interpreter", "--devices", "0")
    assert prepare(args, {})[2] == ["add"]


def test_a_sides_pip_env_is_built_once_before_any_op_runs(tmp_path, monkeypatch):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("ops: [add]\nb: {requirements: [tabulate==0.9.0]}\n")
    built = []
    monkeypatch.setattr(corpus_ab, "build_side_env", lambda side, log: built.append((side.name, side.requirements,
                                                                                         log)))
    prepare(_args(str(plan_file), "--backend", "interpreter", "--devices", "0"), {})
    assert built == [("B", ["tabulate==0.9.0"], sys.stdout)]  # A has no requirements: nothing to build


def test_an_ab_that_wrote_no_report_has_no_rows_whatever_its_record_ran(tmp_path):
    ab_dir = _finished(tmp_path / "ab", None, record_statuses=("SUCCESS", "SUCCESS"))
    facts = _runner(tmp_path)._facts(ab_dir)
    assert (facts["rows"], facts["verdicts"], facts["statuses"]) == (0, {}, {"SUCCESS": 2})


# --- the op timeout over a whole A/B, on real processes --------------------------------------------------
def test_a_hanging_ops_whole_ab_is_ended_at_its_op_timeout_and_is_a_timeout(tmp_path, monkeypatch):
    """The corpus A/B's own path (the op's A/B started fresh under its guard, the batch's --op-timeout
    over it) with an A/B that hangs in A's record: ended, its whole process group, within the timeout
    and its grace, and a TIMEOUT that names the case it hung in. A timeout not taken fails in seconds."""
    monkeypatch.setattr(batch_executor, "KILL_GRACE_S", 1)
    runner = _runner(tmp_path, backend="interpreter")
    runner.opts = dataclasses.replace(runner.opts, op_timeout=1.0)

    def hangs_in_its_record(ab_argv):  # where the A/B and its record's child say they are as they hang
        ab_dir = Path(ab_argv[ab_argv.index("--run-dir") + 1])
        record = ab_dir / "hang_op" / "A-record" / "hang_op_1"
        record.mkdir(parents=True)
        (record / "run.json").write_text(json.dumps({"observed": {"running_case": "fp32 [300]"}}))
        running = {"what": "A records", "args": ["record", "hang_op"], "run_dir": str(record)}
        (ab_dir / corpus_ab.AB_JSON).write_text(json.dumps({"steps": [], "running": running}))

    entry = catalog.Entry("path", "hang_op", "misbehaving", str(OPS / "misbehaving.py"))
    with HangingOp(tmp_path, monkeypatch, on_start=hangs_in_its_record) as hanging:
        row = hanging.ended_by_its_timeout(runner, runner.measure_op, entry, 0)
        what = "timeout after 1 s during case fp32 [300]"
        assert (row.status, row.exit_code, row.attempts, row.notes) == ("TIMEOUT", None, 1,
                                                                        f"{what} (killed, not retried)")
        assert hanging.left() == []
        op_dir = batchdir.op_dir(tmp_path, entry.key)
        assert Path(row.run_dir).parent == (op_dir / "attempt1").relative_to(tmp_path)
        assert re.fullmatch(r"ab_f32-ieee_\d{8}-\d{6}", Path(row.run_dir).name)
        assert (op_dir / "batch.log").read_text().endswith(f"\nkilled by the batch's --op-timeout: {what}\n")
        assert runner.children == {} and not (op_dir / opguard.RUNNING).exists()
        assert not (op_dir / batchdir.COMPLETE).exists()  # a resume runs it again


# --- Ray: the device a task runs on ----------------------------------------------------------------
class FakeContext:
    def __init__(self, ids):
        self.ids = ids

    def get_accelerator_ids(self):
        return self.ids


@pytest.mark.parametrize("name, resource", [("cuda", "GPU"), ("rocm", "GPU"), ("musa", "GPU"), ("ascend", "NPU")])
def test_a_ray_task_runs_on_the_accelerator_id_ray_gave_it(name, resource, monkeypatch):
    assert backends.get(name).ray_resource == resource
    # Ray set no CUDA_VISIBLE_DEVICES for this vendor (or a stale one): the id is what counts.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    ctx = FakeContext({resource: ["3"], "neuron_cores": []})
    assert ray_executor.task_device(resource, 0, ctx) == 3
    with pytest.raises(ray_executor.NoAcceleratorId, match=f"no {resource} id"):
        ray_executor.task_device(resource, 0, FakeContext({}))


def test_a_ray_task_of_the_interpreter_runs_on_its_shard():
    assert backends.get("interpreter").ray_resource is None
    assert ray_executor.task_device(None, 1, FakeContext({"GPU": ["3"]})) == 1


def test_the_remote_op_gets_its_device_from_the_runtime_context(monkeypatch, tmp_path):
    seen = {}

    class FakeRay:
        @staticmethod
        def get_runtime_context():
            return FakeContext({"NPU": ["5"]})

    class Runner:
        def __init__(self, scratch, opts, op_dtypes):
            self.scratch = scratch

        def measure_op(self, entry, device):
            seen["device"] = device
            (self.scratch / "ops" / "x").mkdir(parents=True)
            return {"op": entry.op}

    monkeypatch.setitem(sys.modules, "ray", FakeRay)
    entry = {"repo": "builtin", "op": "add", "op_file": "add", "file": "ops/add.py"}
    opts = batch.Options(RunOptions(backend="ascend"), [0])
    row, payload, scratch = ray_executor._run_remote(Runner, opts, entry, {}, "NPU", 0, False)
    assert seen["device"] == 5 and row == {"op": "add"} and payload
    ray_executor._run_remote(Runner, opts, entry, {}, "NPU", 0, True)  # a local instance
    assert seen["device"] == 0  # its own shard: --devices is the local instance's resources
    assert ray_executor._resources("NPU", 2, local=False) == {"resources": {"NPU": 1}}
    assert ray_executor._resources("GPU", 2, local=True) == {"num_cpus": 1, "resources": {"zl_device_2": 1}}


# --- Slurm ---------------------------------------------------------------------------------------
def test_a_slurm_task_runs_on_the_one_device_its_allocation_shows():
    cuda = backends.get("cuda")
    assert slurm_executor.task_device(cuda, 0, {"CUDA_VISIBLE_DEVICES": "3"}) == 3
    with pytest.raises(slurm_executor.TaskDeviceError, match="sees 2 cuda devices"):
        slurm_executor.task_device(cuda, 0, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert slurm_executor.task_device(backends.get("interpreter"), 1, {}) == 1


def test_a_chunks_own_bound_leaves_its_ops_their_timeouts_and_room_for_its_start(tmp_path, monkeypatch):
    # Behind each op's --op-timeout (overdue), the chunk's A/B as a whole is bounded: past its ops' timeouts
    # added up, by one more for its start, which no op's steps hold (its workers' imports on a loaded host).
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    opts = corpus_ab.ABOptions(RunOptions(backend="interpreter"), [0], plan=plan.to_dict(), op_timeout=40)
    runner = corpus_ab.CorpusAB(tmp_path, opts, {})
    bounds = []

    def attempt(argv, log_path, device, timeout=None, overdue=None):
        bounds.append(timeout)
        raise corpus_ab.NotStarted

    monkeypatch.setattr(runner, "_run_attempt", attempt)
    chunk = [catalog.Entry("builtin", op, op, f"ops/{op}.py") for op in ("add", "softmax", "mm")]
    assert runner._run_chunk(chunk, 0) == {}
    assert bounds == [40 * 4]
