"""The single-op A/B in this process, from its command line (`ab.run_from_args`) to its exit code, with
every step's process stood in for: the fake writes the run dir the step would have (run.json and one
row in results.json) and records what the step was told. So the promises of the session itself are
checked per step and fast: the schedule (A records, each side's untimed passes step, then A and B
replay A's record interleaved), what
each step is told (its run dir, its target, which steps carry the one-off passes, its side's
interpreter, environment and cache), ab.json as the steps land, the warnings and the exit code of an
A/B whose steps fail, die or are stopped. The real processes are in tests/test_ab.py (e2e)."""

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ab_dir_in, load
from result_rows import result_row

from harness import cli
from harness.core import deps, forkserver, launch, paths
from harness.core.errors import UsageError
from harness.core.spec import RunSpec
from harness.sessions import ab
from harness.sessions.ab import runner as ab_runner
from harness.sessions.ab import sides as ab_sides
from harness.sessions.ab import steps as ab_steps
from reports import table


def _only(argv: list[str]) -> list[str]:
    """What the step is for, where not everything: its --*-only flags."""
    return [a for a in argv if a.startswith("--") and a.endswith("-only")]


class Steps:
    """Stands in for launch.run (the step's process) and forkserver.Worker (a side's warm worker).
    `fate(side_dir, attempt)` says how the step in the step dir named `side_dir` (`A-record`, `B-2`)
    ends: ok, rows (went through, some rows failed), fails, dies (its worker died under it), lost (the
    worker never came up), stopped (a SIGTERM went on to it) or ctrl_c (a Ctrl-C between steps)."""

    def __init__(self, monkeypatch, fate=lambda side_dir, attempt: "ok", ms=None):
        self.fate = fate
        self.ms = ms or {"A": 2.0, "B": 2.0}
        self.told: list[dict] = []
        self.workers: list[FakeWorker] = []
        self.begun_when_identified: list[list[bool]] = []  # the workers begun as each side's Triton was identified
        monkeypatch.setattr(launch, "run", self.run)
        monkeypatch.setattr(forkserver, "Worker", self.worker)
        monkeypatch.setattr(ab_runner, "side_compiler_key", self.key)

    def key(self, side):
        self.begun_when_identified.append([w.begun for w in self.workers])
        if side.python == "/bin/false":
            raise ab.SideUnidentified("/bin/false exited 1")
        return {"python": side.python or sys.executable, "env": side.env, "digest": f"d{side.name.lower()}"}

    def worker(self, python, log, env, pythonpath, cache_root, backend, preload=None):
        made = FakeWorker(python, log, env, pythonpath, cache_root, backend, preload)
        self.workers.append(made)
        return made

    def run(self, argv, **how):
        python = None
        if argv[1:3] == ["-m", "harness"]:  # a fresh process: the whole command line
            python, argv = argv[0], argv[3:]
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        attempt = sum(1 for t in self.told if t["run_dir"] == run_dir) + 1
        self.told.append({"python": python, "argv": argv, "run_dir": run_dir, "side": run_dir.parent.name[0],
                          "begun": [w.begun for w in self.workers],
                          "imported": [getattr(w, "imported", False) for w in self.workers],
                          "closed": {id(w) for w in self.workers if w.closed}, **how})
        if "starter" in how:
            how["starter"].__self__.died = False  # as a worker's start does for each step
        fate = self.fate(run_dir.parent.name, attempt)
        if fate == "ctrl_c":
            raise KeyboardInterrupt
        if fate == "lost":
            raise forkserver.WorkerDied("it never came up")
        how["on_stdout"]("[1/1] add fp32-300 SUCCESS\n")
        if fate == "stopped":
            how["on_stop"](signal.SIGTERM)
            return -signal.SIGTERM, signal.SIGTERM
        if fate == "dies":
            (run_dir / "half").mkdir(parents=True)  # what the dead attempt wrote
            how["starter"].__self__.died = True
            return -signal.SIGKILL, None
        if fate == "fails":
            return 3, None
        if fate == "broke":  # claimed its run dir, then stopped short of its cases
            run_dir.mkdir(parents=True)
            (run_dir / "run.json").write_text(json.dumps({"spec": {}, "observed": {"outcome": {"status": "FAILED"}}}))
            return 3, None
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = RunSpec("add", "interpreter", argv[0], 0, ["fp32"], "default").to_json()
        (run_dir / "run.json").write_text(json.dumps({"spec": spec, "observed": {"outcome": {"status": "COMPLETE"}}}))
        row = result_row(shape=[300], baseline_ms=1.0, candidate_ms=self.ms[run_dir.parent.name[0]], timer="graph")
        (run_dir / "results.json").write_text(json.dumps({"format": 1, "rows": [row]}))
        return (1 if fate == "rows" else 0), None

    def schedule(self):
        return [t["run_dir"].parent.name for t in self.told]


class FakeWorker:
    def __init__(self, python, log, env, pythonpath, cache_root, backend, preload=None):
        self.python, self.log, self.env, self.pythonpath = python, log, env, pythonpath
        self.cache_root = cache_root
        self.backend = backend
        self.preload = preload
        self.died = False
        self.closed = False

        self.begun = False
        self.reaped = False

    def begin(self):
        self.begun = True
        self.imported = False

    def wait_ready(self):
        assert self.begun, "waited for before it was begun"
        self.imported = True

    def start(self, argv, **kw):  # launch.run is faked: it never starts anything
        raise AssertionError("not reached")

    def release(self):
        self.closed = True

    def ended(self):
        return self.closed

    def reap(self):
        assert self.closed, "reaped before it was told to end"
        self.reaped = True


def _ab(tmp_path, plan_text, *argv):
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text)
    out = [] if "--run-dir" in argv else ["--out", str(tmp_path / "runs")]
    return cli.parse_request(["ab", str(plan), "--backend", "interpreter", *out, *argv])



def test_a_records_once_then_the_sides_replay_its_record_interleaved_and_the_ab_passes(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    args = _ab(tmp_path, "name: t\nops: [builtin:add, mm@mm]\nrepeats: 2\nfdr: 0.2\nb: {label: new, env: {X: '1'}}\n")
    assert ab.run_from_args(args) == 0
    out = capsys.readouterr().out
    ab_dir = ab_dir_in(out)
    assert ab_dir.parent == tmp_path / "runs" and ab_dir.name.startswith("ab_t_")
    assert out.startswith("A/B t: A = as is; B = new X=1; ops builtin:add mm@mm; 2 repeats interleaved\n"
                          f"ab dir: {ab_dir}\n")
    assert steps.schedule() == ["A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"] * 2
    # Each op's steps in a dir of its own, named so a path can hold it; each step's run dir named there.
    dirs = [t["run_dir"] for t in steps.told]
    assert {d.parent.parent for d in dirs[:6]} == {ab_dir / "builtin-add"}
    assert {d.parent.parent for d in dirs[6:]} == {ab_dir / "mm-mm"}
    assert all(d.name.startswith(f"{d.parent.parent.name}_") for d in dirs)
    # A's record measures the op; every replay replays that record, of that op.
    argvs = [t["argv"] for t in steps.told]
    assert argvs[0][:2] == ["record", "builtin:add"] and argvs[6][:2] == ["record", "mm@mm"]
    assert [a[:2] for a in argvs[1:6]] == [["replay", str(dirs[0])]] * 5
    assert [a[:2] for a in argvs[7:]] == [["replay", str(dirs[6])]] * 5
    # The one-off passes (IR, attribution) run once per side and op, timed at a token budget (no verdict
    # reads their timings): A's in its record, B's in its passes step; every repeat times only.
    assert [a[-1] for a in (_only(argv) for argv in argvs[:6])] == [
        "--passes-only", "--passes-only", "--timing-only", "--timing-only", "--timing-only", "--timing-only"]
    lines = out.splitlines()
    assert "[1/2 builtin:add] A records ... 1/1 ok (0 s)" in lines
    assert "[2/2 mm@mm] repeat 2/2: B replays A ... 1/1 ok (0 s)" in lines
    # ab.json: the plan, every step as it landed, complete.
    state = load(ab_dir / "ab.json")
    assert state["complete"] is True and "running" not in state and state["plan"]["name"] == "t"
    assert state["plan"]["device"] is None  # where it ran: the plan's yaml has no device (a corpus A/B sets one)
    assert [s["what"] for s in state["steps"][:4]] == [
        "[1/2 builtin:add] A records", "[1/2 builtin:add] B's IR and kernels (not timed for the verdict)",
        "[1/2 builtin:add] repeat 1/2: A replays A", "[1/2 builtin:add] repeat 1/2: B replays A"]
    # A's record carries A's passes, B's passes step B's: each marked so (the reports read their IR and kernels).
    assert [s.get("passes", False) for s in state["steps"][:6]] == [True, True, False, False, False, False]
    first = state["steps"][2]
    assert (first["side"], first["args"], first["exit"], first["usable"], first["run_dir"]) == (
        "A", argvs[2], 0, True, str(dirs[2]))
    assert 0 <= first["seconds"] < 0.5  # a stand-in step takes milliseconds
    report = load(ab_dir / "report.json")
    assert report["context"]["name"] == "t" and report["context"]["repeats"] == 2 and report["summary"]["fdr"] == 0.2
    assert report["context"]["ir"] == {"builtin:add": "IR not collected", "mm@mm": "IR not collected"}
    assert (report["context"]["a"], report["context"]["b"]) == ("as is", "new X=1")
    assert len(report["rows"]) == 2 and all(len(r["a_ms"]) == 2 == len(r["b_ms"]) for r in report["rows"])
    assert f"report: {ab_dir / 'report.md'}, {ab_dir / 'report.csv'}, {ab_dir / 'report.json'}, " in out


def test_each_step_is_told_its_sides_interpreter_environment_cache_and_how_to_stop(tmp_path, monkeypatch, capsys):
    """A side's steps are forked by its own warm worker, started with the side's interpreter and
    environment (and the backend's) and the side's Triton cache; a Ctrl-C or SIGTERM goes on to the
    running step, which has STEP_GRACE_S to write what it has."""
    steps = Steps(monkeypatch)
    built = str(tmp_path / "env" / "bin" / "python")
    monkeypatch.setattr(ab_runner, "build_side_env", lambda side, log: built)
    args = _ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: fork\nb: {env: {X: '1'}, requirements: [triton]}\n")
    assert ab.run_from_args(args) == 0
    ab_dir = ab_dir_in(capsys.readouterr().out)
    a, b = steps.workers
    state = load(ab_dir / "ab.json")
    caches = {name: state["triton_caches"][name]["dir"] for name in "AB"}
    # Each worker knows the side caches' root, which it removes if the A/B dies before it.
    root = str(Path(caches["A"]).parent)
    assert (a.python, a.env, a.pythonpath, a.cache_root) == (sys.executable, {"TRITON_INTERPRET": "1"}, None, root)
    # A pip-built side's worker runs its env's interpreter with the checkout alone on its path (build_side_env).
    assert (b.python, b.env, b.pythonpath, b.cache_root) == (built, {"X": "1", "TRITON_INTERPRET": "1"},
                                                             str(paths.REPO_ROOT), root)
    assert a.log is b.log is steps.told[0]["log"]  # what the workers say goes to ab.log too
    assert a.backend == b.backend == "interpreter"  # whose warm_fork they do
    assert Path(caches["A"]).name == "A-da" and Path(caches["B"]).name == "B-db"
    # A private dir of this process, which the next run removes if the A/B dies first (paths.remove_abandoned).
    assert Path(caches["A"]).parent.name.startswith(f"zl_ab_triton_cache.{os.getpid()}.")
    assert state["triton_caches"]["B"]["env"] == {"X": "1"}
    assert state["triton_caches"]["A"]["removed"] == "as the A/B ends (if it died first: by the next run)"
    # Both workers were started before A's record (B's imports while A records).
    assert steps.told[0]["begun"] == [True, True]
    # Ended with the A/B: the workers closed (both told before either is waited for), the caches removed.
    assert a.reaped and b.reaped and not Path(caches["A"]).parent.exists()
    for told in steps.told:
        worker = a if told["side"] == "A" else b
        assert told["starter"] == worker.start and told["argv"][-2:] == ["--triton-cache", caches[told["side"]]]
        assert (told["grace_s"], told["forward"], told["log"].name) == (
            ab.STEP_GRACE_S, (signal.SIGINT, signal.SIGTERM), str(ab_dir / "ab.log"))
        assert told["on_stdout"] is ab_steps.case_progress


def test_a_fresh_step_is_a_process_of_its_sides_interpreter_with_its_sides_environment(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    built = tmp_path / "env" / "bin" / "python"
    logs = []

    def build(side, log):  # only a side that names requirements gets an env of its own
        logs.append((side.name, log.name))
        return str(built)

    monkeypatch.setattr(ab_runner, "build_side_env", build)
    args = _ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: fresh\nb: {env: {X: '1'}, requirements: [triton]}\n")
    assert ab.run_from_args(args) == 0
    assert steps.workers == [] and logs == [("B", str(ab_dir_in(capsys.readouterr().out) / "ab.log"))]
    for told in steps.told:
        if told["side"] == "A":
            assert (told["python"], told["env"], told["pythonpath"]) == (sys.executable, {}, None)
        else:  # a pip-built side sees its own packages first, then the base's: it gets the checkout alone
            assert (told["python"], told["env"], told["pythonpath"]) == (str(built), {"X": "1"},
                                                                        str(paths.REPO_ROOT))
        assert told["argv"][-1].endswith(f"{told['side']}-d{told['side'].lower()}")  # its side's cache
        assert "starter" not in told and told["grace_s"] == ab.STEP_GRACE_S


def test_a_side_whose_env_does_not_build_stops_the_ab_before_any_step(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)

    def build(side, log):
        raise subprocess.CalledProcessError(1, ["pip", "install"])

    monkeypatch.setattr(ab_runner, "build_side_env", build)
    args = _ab(tmp_path, "ops: [add]\nb: {requirements: [triton]}\n")
    with pytest.raises(UsageError) as refused:
        ab.run_from_args(args)
    ab_dir = ab_dir_in(capsys.readouterr().out)
    assert str(refused.value) == (f"side B: building its env failed (Command '['pip', 'install']' returned non-zero "
                                  f"exit status 1.); see {ab_dir / 'ab.log'}")
    assert steps.told == []


def test_a_side_whose_triton_is_unidentified_compiles_into_its_steps_own_caches(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    plan = ab.plan_from_data({"ops": ["add"], "repeats": 2, "backend": "interpreter", "step_start": "fork",
                              "a": {"python": "/bin/false"}}, tmp_path / "p.yaml")
    runner = ab.Runner(plan, tmp_path)
    try:
        runner.run()
    finally:
        runner.close()
    assert set(runner.state["triton_caches"]) == {"B"}  # A's failure skips A only
    assert all(w.cache_root == str(runner.caches["B"].parent) for w in steps.workers)
    assert [t["argv"][-2] == "--triton-cache" for t in steps.told] == [False, True, False, True, False, True]
    assert "side A: no kernel reuse across its steps: its Triton could not be identified (/bin/false exited 1)\n" \
        in (tmp_path / "ab.log").read_text()


def test_a_failed_repeat_fails_the_ab_and_no_timed_step_takes_on_the_passes(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch, fate=lambda side_dir, attempt: {"A-1": "broke", "B-1": "rows"}.get(side_dir, "ok"))
    args = _ab(tmp_path, "ops: [add]\nrepeats: 2\n")
    assert ab.run_from_args(args) == 1
    out = capsys.readouterr().out
    ab_dir = ab_dir_in(out)
    assert "[1/1 add] repeat 1/2: A replays A ... 1/1 FAILED (exit 3) (0 s)" in out.splitlines()
    assert "[1/1 add] repeat 1/2: B replays A ... 1/1 finished with failed rows (exit 1) (0 s)" in out.splitlines()
    # A's first repeat failed: its second still times only (the passes ran in A's record); B's went through
    # (failed rows are results).
    assert [_only(t["argv"]) for t in steps.told] == [["--passes-only"], ["--passes-only"], *[["--timing-only"]] * 4]
    state = load(ab_dir / "ab.json")
    assert [(s["exit"], s["usable"], s["run_dir"] is None) for s in state["steps"]] == [
        (0, True, False), (0, True, False), (3, False, False), (1, True, False), (0, True, False), (0, True, False)]
    report = load(ab_dir / "report.json")
    assert "1 step(s) failed (see ab.log): [1/1 add] repeat 1/2: A replays A" in report["warnings"]
    assert not any(w.startswith("INCOMPLETE") for w in report["warnings"])
    assert len(report["rows"][0]["a_ms"]) == 1 and len(report["rows"][0]["b_ms"]) == 2
    assert "incomplete_a(1/2)" in report["rows"][0]["flags"]  # short of the repeats planned, so flagged


def test_an_op_whose_record_fails_has_no_rows_and_the_next_op_still_runs(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch, fate=lambda side_dir, attempt: "fails" if side_dir == "A-record" and
                  len(steps.told) == 1 else "ok")
    args = _ab(tmp_path, "ops: [add, softmax]\nrepeats: 2\n")
    assert ab.run_from_args(args) == 1
    report = load(ab_dir_in(capsys.readouterr().out) / "report.json")
    assert steps.schedule() == ["A-record", "A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    assert steps.told[1]["argv"][:2] == ["record", "softmax"]
    assert "no rows to compare for add: a side has no completed run" in report["warnings"]
    assert "1 step(s) failed (see ab.log): [1/2 add] A records" in report["warnings"]


def test_a_side_with_no_usable_replay_leaves_the_ab_failed_without_a_failed_step_being_hidden(tmp_path, monkeypatch,
                                                                                               capsys):
    Steps(monkeypatch, fate=lambda side_dir, attempt: "fails" if side_dir.startswith("B") else "ok")
    assert ab.run_from_args(_ab(tmp_path, "ops: [add, softmax]\nrepeats: 2\n")) == 1
    report = load(ab_dir_in(capsys.readouterr().out) / "report.json")
    assert report["warnings"][-2:] == [
        "6 step(s) failed (see ab.log): [1/2 add] B's IR and kernels (not timed for the verdict); [1/2 add] repeat "
        "1/2: B replays A; [1/2 add] repeat 2/2: B replays A; [2/2 softmax] B's IR and kernels (not timed for the "
        "verdict); [2/2 softmax] repeat 1/2: B replays A; [2/2 softmax] repeat 2/2: B replays A",
        "no rows to compare for add, softmax: a side has no completed run"]
    row = report["rows"][0]  # A's rows still shown, flagged
    assert len(row["a_ms"]) == 2 and row["b_ms"] == [] and "incomplete_b(0/2)" in row["flags"]


def test_a_step_whose_warm_worker_died_is_retried_once_in_a_clean_run_dir(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch, fate=lambda side_dir, attempt: "dies" if side_dir == "B-1" and attempt == 1 else "ok")
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: fork\n")) == 0
    out = capsys.readouterr().out
    ab_dir = ab_dir_in(out)
    assert steps.schedule() == ["A-record", "B-passes", "A-1", "B-1", "B-1", "A-2", "B-2"]
    retried = steps.told[4]
    assert retried["argv"] == steps.told[3]["argv"] and retried["starter"] == steps.told[3]["starter"]
    assert not (retried["run_dir"] / "half").exists()  # nothing of the dead attempt stays
    assert "[1/1 add] repeat 1/2: B replays A ... 1/1 (its warm worker died: restarted, the step retried) 1/1 ok" \
        in out
    assert "side B: the warm worker died during the step: restarting it, retrying\n" in (ab_dir / "ab.log").read_text()
    assert [s["usable"] for s in load(ab_dir / "ab.json")["steps"]] == [True] * 6


def test_a_worker_that_never_comes_up_fails_the_step_after_one_retry(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch, fate=lambda side_dir, attempt: "lost" if side_dir == "B-1" else "ok")
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: fork\n")) == 1
    ab_dir = ab_dir_in(capsys.readouterr().out)
    assert steps.schedule() == ["A-record", "B-passes", "A-1", "B-1", "B-1", "A-2", "B-2"]
    step = load(ab_dir / "ab.json")["steps"][3]
    assert (step["what"], step["exit"], step["usable"]) == ("[1/1 add] repeat 1/2: B replays A", 1, False)
    assert (ab_dir / "ab.log").read_text().count("side B: it never came up\n") == 2


def test_a_sigterm_during_a_step_stops_the_ab_and_reports_what_completed(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch, fate=lambda side_dir, attempt: "stopped" if side_dir == "A-2" else "ok")
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 3\n")) == 128 + signal.SIGTERM
    out = capsys.readouterr().out
    ab_dir = ab_dir_in(out)
    assert steps.schedule() == ["A-record", "B-passes", "A-1", "B-1", "A-2"]
    assert "\ninterrupted (SIGTERM): stopping the running side and reporting what completed\n" in out
    assert "reporting what completed\n\ninterrupted" not in out  # said once, by the step
    state = load(ab_dir / "ab.json")
    assert state["complete"] is False and state["running"]["what"] == "[1/1 add] repeat 2/3: A replays A"
    assert (state["running"]["side"], state["running"]["args"], state["running"]["run_dir"]) == (
        "A", steps.told[4]["argv"], str(steps.told[4]["run_dir"]))
    report = load(ab_dir / "report.json")
    assert report["warnings"][0] == "INCOMPLETE: interrupted after 4 completed steps; rows below cover only those"
    assert len(report["rows"][0]["a_ms"]) == 1 and not any("failed" in w for w in report["warnings"])
    assert not Path(state["triton_caches"]["A"]["dir"]).parent.exists()


def test_a_ctrl_c_between_steps_stops_the_ab_and_says_so(tmp_path, monkeypatch, capsys):
    Steps(monkeypatch, fate=lambda side_dir, attempt: "ctrl_c" if side_dir == "B-2" else "ok")
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: fork\n")) == 128 + signal.SIGINT
    out = capsys.readouterr().out
    assert "\ninterrupted (SIGINT): reporting what completed\n" in out
    report = load(ab_dir_in(out) / "report.json")
    assert report["warnings"][0] == "INCOMPLETE: interrupted after 5 completed steps; rows below cover only those"


def test_a_second_ctrl_c_during_the_cleanup_lets_it_end_whole_then_stops(tmp_path, monkeypatch, pythons_ctrl_c):
    """The first Ctrl-C stopped a step; a second one, while the A/B ends its workers and removes its side
    caches, waits for that to end (nothing left running, no cache left), then stops the A/B there."""
    Steps(monkeypatch, fate=lambda side_dir, attempt: "ctrl_c" if side_dir == "B-2" else "ok")
    close = ab.Runner.close
    closed = []

    def close_as_a_second_ctrl_c_comes(runner):
        os.kill(os.getpid(), signal.SIGINT)
        close(runner)
        closed.append(runner)

    monkeypatch.setattr(ab.Runner, "close", close_as_a_second_ctrl_c_comes)
    with pytest.raises(KeyboardInterrupt):
        ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: fork\n"))
    [runner] = closed  # the close ran to its end before the second Ctrl-C was taken
    assert runner.log.closed and runner.workers == {} and runner._cache_root is None
    assert not Path(runner.state["triton_caches"]["A"]["dir"]).parent.exists()


def test_the_ab_dir_is_the_one_named_and_an_a_a_run_says_it_measures_noise(tmp_path, monkeypatch, capsys):
    Steps(monkeypatch)
    named = tmp_path / "named"
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\n", "--run-dir", str(named))) == 0
    out = capsys.readouterr().out
    assert ab_dir_in(out) == named and (named / "report.json").is_file() and not (tmp_path / "runs").exists()
    assert out.startswith("note: sides A and B are identical: this is an A/A run (measures noise)\n")
    assert out.splitlines()[3] == table.not_performance_note("interpreter")  # said before any step


def _single_run(path: Path, candidate_ms: float) -> Path:
    path.mkdir(parents=True)
    spec = RunSpec("add", "interpreter", "record", 0, ["fp32"], "default").to_json()
    (path / "run.json").write_text(json.dumps({"spec": spec, "observed": {"outcome": {"status": "COMPLETE"}}}))
    row = result_row(shape=[300], baseline_ms=1.0, candidate_ms=candidate_ms, timer="graph")
    (path / "results.json").write_text(json.dumps({"format": 1, "rows": [row]}))
    return path


def test_compare_reports_two_single_runs_and_refuses_a_dir_that_is_no_run(tmp_path, capsys):
    a, b = _single_run(tmp_path / "a", 2.0), _single_run(tmp_path / "b", 2.2)
    parse = cli.parse_request
    assert ab.run_from_args(parse(["ab", "--compare", str(a), str(b), "--out", str(tmp_path / "out")])) == 0
    (out_dir,) = (tmp_path / "out").iterdir()
    assert out_dir.name.startswith("compare_")
    report = load(out_dir / "report.json")
    assert report["context"] == {"name": "a vs b", "a": str(a), "b": str(b),
                                 "note": "single runs: each run's raw samples stand in for repeats"}
    assert report["measures_performance"] is False
    assert report["rows"][0]["a_ms"] and report["rows"][0]["b_ms"]
    assert "IR was not collected on some ops" in " ".join(report["warnings"])
    (b / "results.json").write_text('{"rows": [')
    with pytest.raises(UsageError, match=rf"^--compare: {b / 'results.json'} does not read as results: not JSON"):
        ab.run_from_args(parse(["ab", "--compare", str(a), str(b), "--out", str(tmp_path / "out2")]))
    with pytest.raises(UsageError, match=r"^--compare: "):
        ab.run_from_args(parse(["ab", "--compare", str(tmp_path / "none"), str(a), "--out", str(tmp_path / "out2")]))
    assert ab.run_from_args(parse(["ab", "--compare", str(a), str(_single_run(tmp_path / "c", 2.2)), "--fdr", "0.2",
                                   "--out", str(tmp_path / "out3")])) == 0
    assert load(next((tmp_path / "out3").iterdir()) / "report.json")["summary"]["fdr"] == 0.2  # judged at the FDR given
    with pytest.raises(SystemExit):  # refused at the door, before a dir is claimed
        parse(["ab", "--compare", str(a), str(tmp_path / "c"), "--fdr", "2", "--out", str(tmp_path / "out4")])
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out4").exists()


class Pip:
    """Stands in for subprocess.run in build_side_env: `python -m venv`, the site-dir probes and pip
    install, each as the real one would answer (output to the stream it was given, check raising)."""

    def __init__(self, monkeypatch, tmp_path, pip_fails=False, fails=None):
        self.calls: list[list[str]] = []
        self.fails = fails  # the stage that exits 1: venv, sites, own_site or pip
        self.base_site = tmp_path / "base" / "site-packages"
        self.base_site.mkdir(parents=True)
        self.pip_fails = pip_fails
        monkeypatch.setattr(subprocess, "run", self.run)

    def run(self, argv, check=False, stdout=None, stderr=None, capture_output=False, text=False):
        self.calls.append(argv)
        code, said, err = 0, "", ""
        if argv[1] == "-c":
            try:
                compile(argv[2], "<string>", "exec")
            except SyntaxError:
                return self._end(argv, check, 1)
        stage = ("venv" if argv[1:3] == ["-m", "venv"] else "sites" if argv[2:] == [ab_sides._SITE_DIRS]
                 else "own_site" if argv[1] == "-c" else "pip")
        if stage == self.fails:
            return self._end(argv, check, 1)
        if argv[1:3] == ["-m", "venv"]:
            env = Path(argv[3])
            (env / "bin").mkdir(parents=True)
            (env / "bin" / "python").write_text("")
            (env / "lib" / "site-packages").mkdir(parents=True)
            err = "venv: made\n"
        elif argv[1:] == ["-c", ab_sides._SITE_DIRS]:
            said = json.dumps([str(self.base_site), str(self.base_site.parent / "gone"), "/nonexistent/user"])
        elif argv[1] == "-c":
            said = str(Path(argv[0]).parent.parent / "lib" / "site-packages") + "\n"
        else:
            code, err = (1, "pip: no such package\n") if self.pip_fails else (0, "pip: installed\n")
        if stdout is not None and not capture_output:
            stdout.write(said + (err if stderr == subprocess.STDOUT else ""))
        out = (said if text else said.encode()) if capture_output else None
        return self._end(argv, check, code, out)

    @staticmethod
    def _end(argv, check, code, out=""):
        if check and code:
            raise subprocess.CalledProcessError(code, argv)
        return subprocess.CompletedProcess(argv, code, out, None)


def test_a_sides_requirements_build_one_env_over_the_base_envs_packages_once(tmp_path, monkeypatch, capsys):
    pip = Pip(monkeypatch, tmp_path)
    extra = tmp_path / "extra"
    extra.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{extra}:{tmp_path / 'not_there'}")
    monkeypatch.setattr(deps, "DEPS_DIR", tmp_path / "no_deps")
    side = ab.Side("B", "", python="/base/bin/python", requirements=["triton==3.1", "numpy"])
    log = tmp_path / "ab.log"
    with open(log, "w") as f:
        python = ab.build_side_env(side, f, tmp_path / "nox" / "envs")
    env = Path(python).parent.parent
    assert env.parent == tmp_path / "nox" / "envs" and Path(python) == env / "bin" / "python"
    assert capsys.readouterr().out == f"building side B's env (triton==3.1 numpy) in {env} ...\n"
    assert pip.calls[0] == ["/base/bin/python", "-m", "venv", str(env)]  # over the side's own interpreter
    assert pip.calls[-1] == [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                             "triton==3.1", "numpy"]
    # The base's packages, then the PYTHONPATH the harness runs with, after the env's own; only dirs there are.
    assert (env / "lib" / "site-packages" / "zz_zl_base_env.pth").read_text() == f"{pip.base_site}\n{extra}\n"
    assert log.read_text() == "venv: made\npip: installed\n"  # what building said goes to ab.log
    assert (env / ".complete").read_text() == "triton==3.1\nnumpy\n"
    # Cached by interpreter and requirement set, in any order; another set or interpreter is another env.
    pip.calls.clear()
    with open(log, "a") as f:
        again = ab.build_side_env(ab.Side("B", "", python="/base/bin/python", requirements=["numpy", "triton==3.1"]),
                                  f, tmp_path / "nox" / "envs")
        assert again == python and pip.calls == []
        other = ab.build_side_env(ab.Side("A", "", python="/base/bin/python", requirements=["numpy"]), f,
                                  tmp_path / "nox" / "envs")
        base = ab.build_side_env(ab.Side("A", "", requirements=["numpy"]), f, tmp_path / "nox" / "envs")
    assert len({python, other, base}) == 3 and pip.calls[-4][:3] == [sys.executable, "-m", "venv"]


def test_a_side_env_whose_install_failed_is_built_afresh_next_time(tmp_path, monkeypatch, capsys):
    pip = Pip(monkeypatch, tmp_path, pip_fails=True)
    side = ab.Side("B", "", requirements=["nonesuch"])
    log = tmp_path / "ab.log"
    with open(log, "w") as f, pytest.raises(subprocess.CalledProcessError):
        ab.build_side_env(side, f, tmp_path / "envs")
    (env,) = (tmp_path / "envs").iterdir()
    assert not (env / ".complete").exists() and "pip: no such package\n" in log.read_text()
    (env / "stale").write_text("")
    pip.pip_fails = False
    with open(log, "a") as f:
        assert ab.build_side_env(side, f, tmp_path / "envs") == str(env / "bin" / "python")
    assert not (env / "stale").exists() and (env / ".complete").is_file()


def _refused(args) -> str:
    with pytest.raises(UsageError) as refused:
        ab.run_from_args(args)
    return str(refused.value)


def test_a_plan_whose_ops_or_shape_file_do_not_resolve_is_refused_before_any_step(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    assert _refused(_ab(tmp_path, "ops: [add]\nshapes: nowhere.yaml\n")) == \
        f"shape file {tmp_path / 'nowhere.yaml'} does not exist"
    assert _refused(_ab(tmp_path, "ops: [add, nonesuch]\n")) == (
        "unknown operator 'nonesuch'; built-in: add, gelu, mm, rms_norm, softmax; add your own with --ops-path DIR")
    assert _refused(_ab(tmp_path, "ops: [sofmax]\n")) == (
        "unknown operator 'sofmax' (did you mean softmax?); built-in: add, gelu, mm, rms_norm, softmax; add your own "
        "with --ops-path DIR")
    assert _refused(_ab(tmp_path, "ops: [add, 'flaggems:mm']\n")) == (
        "'flaggems:mm': no checkout for repo 'flaggems'; give --flaggems-dir flaggems=PATH (given: none)")
    (tmp_path / "fg" / "benchmark").mkdir(parents=True)
    assert _refused(_ab(tmp_path, "ops: ['flaggems:nope']\nflaggems_dirs: [fg]\n")) == (
        f"'flaggems:nope': benchmark file {tmp_path / 'fg' / 'benchmark' / 'test_nope.py'} does not exist; if the "
        "op lives in another file, give flaggems:nope@<file> or a pytest node")
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "scale.py").write_text((Path(__file__).parent / "resources" / "user_ops" / "scale.py")
                                              .read_text())
    assert _refused(_ab(tmp_path, "ops: [scale3, 'path:nonesuch']\nops_paths: [ops]\n")).startswith(
        "unknown operator 'nonesuch'")
    assert steps.told == [] and not (tmp_path / "runs").exists()


def test_a_record_takes_the_backend_and_flaggems_options_and_each_replay_keeps_them(tmp_path, monkeypatch, capsys):
    """Both sides run the level, switch, tuning space and checkouts A recorded with: the replays get the
    checkouts and op paths (to find the op again), never the record's choices."""
    steps = Steps(monkeypatch)
    (tmp_path / "fg" / "benchmark").mkdir(parents=True)
    (tmp_path / "fg" / "benchmark" / "test_mm.py").write_text("def test_mm():\n    pass\n")
    (tmp_path / "mine").mkdir()
    args = _ab(tmp_path, "ops: ['flaggems:mm']\nrepeats: 2\nflaggems_dirs: [fg]\nops_paths: [mine]\nlevel: core\n"
                         "flagtune: 1\nlibtuner_cache: user\ndtypes: [fp16]\n",
               "--ops-path", str(tmp_path), "--flaggems-dir", f"other={tmp_path / 'fg'}")
    assert ab.run_from_args(args) == 0
    dirs = ["--flaggems-dir", f"flaggems={tmp_path / 'fg'}", "--flaggems-dir", f"other={tmp_path / 'fg'}"]
    paths_ = ["--ops-path", str(tmp_path / "mine"), "--ops-path", str(tmp_path)]
    record = steps.told[0]["argv"]
    assert record[:12] == ["record", "flaggems:mm", "--level", "core", "--flagtune", "1", "--libtuner-cache", "user",
                           "--backend", "interpreter", "--dtypes", "fp16"]
    assert record[12:20] == paths_ + dirs
    for told in steps.told[1:]:
        assert told["argv"][2:12] == ["--dtypes", "fp16", *paths_, *dirs]
        assert not {"--level", "--flagtune", "--libtuner-cache", "--backend"} & set(told["argv"])
    # Every worker imports the op's checkout once, under the switch its steps run with; the device's facts
    # are read once a side, kept for its other workers in the A/B's cache root.
    assert steps.workers and {dataclasses.replace(w.preload, facts_file=None) for w in steps.workers} == {
        forkserver.Preload((str(tmp_path / "fg"),), "1", None)}
    kept = {Path(w.preload.facts_file) for w in steps.workers}
    assert {p.name for p in kept} == {"A-device-facts.json", "B-device-facts.json"}
    assert {p.parent for p in kept} == {Path(w.cache_root) for w in steps.workers}


def test_the_command_line_picks_how_steps_start_and_which_carry_the_passes(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\n", "--step-start", "fork", "--step-passes",
                                "every")) == 0
    assert len(steps.workers) == 2 and not any(_only(t["argv"]) for t in steps.told)
    assert all(t["python"] is None for t in steps.told)  # each forked by its side's worker
    # An A/B without a plan file: its ops from the command line, A as is, B as switched there.
    steps.told.clear()
    args = cli.parse_request(["ab", "--ops", "add", "--backend", "interpreter", "--b-env", "X=1",
                              "--repeats", "2", "--out", str(tmp_path / "adhoc")])
    assert ab.run_from_args(args) == 0
    out = capsys.readouterr().out
    assert "A/B adhoc: A = as is; B = X=1; ops add; 2 repeats interleaved\n" in out
    assert steps.schedule() == ["A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    # Prewarmed by default: a worker of its own a step (6 more), B's in B's environment.
    mine = [t["starter"].__self__ for t in steps.told]
    assert len(steps.workers) == 2 + 6 and len({id(w) for w in mine}) == 6
    assert all(t["python"] is None for t in steps.told)
    assert [bool(w.env.get("X")) for w in mine] == [False, True, False, True, False, True]
    with pytest.raises(UsageError, match=r"^--b-env 'novalue': expected KEY=VAL$"):
        ab.run_from_args(_ab(tmp_path, "ops: [add]\n", "--b-env", "novalue"))


def test_a_timer_or_l2_mode_the_backend_lacks_is_refused_before_any_step(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    assert _refused(_ab(tmp_path, "ops: [add]\ntimer: profiler\n")) == (
        "backend 'interpreter' has no device profiler for --timer profiler; use --timer auto or host")
    assert _refused(_ab(tmp_path, "ops: [add]\nl2: cold\n")).startswith("--l2 cold: backend 'interpreter' has no "
                                                                         "device cache")
    assert steps.told == []


def test_an_op_named_by_its_pytest_node_keeps_its_steps_in_theab_dir_in(tmp_path, monkeypatch, capsys):
    steps = Steps(monkeypatch)
    node = tmp_path / "fg" / "benchmark" / "test_mm.py"
    node.parent.mkdir(parents=True)
    node.write_text("def test_mm():\n    pass\n")
    assert ab.run_from_args(_ab(tmp_path, f"ops: ['{node}::test_mm']\nflaggems_dirs: [fg]\n")) == 0
    ab_dir = ab_dir_in(capsys.readouterr().out)
    op_dir = ab_dir / f"{node}::test_mm".replace(":", "-").replace("/", "-")
    assert {t["run_dir"].parent.parent for t in steps.told} == {op_dir} and op_dir.parent == ab_dir


@pytest.mark.parametrize("stage", ["venv", "sites", "own_site"])
def test_a_side_env_a_step_of_whose_build_failed_is_not_used(tmp_path, monkeypatch, stage):
    Pip(monkeypatch, tmp_path, fails=stage)
    with open(tmp_path / "ab.log", "w") as f, pytest.raises(subprocess.CalledProcessError):
        ab.build_side_env(ab.Side("B", "", requirements=["triton"]), f, tmp_path / "envs")
    assert not list((tmp_path / "envs").glob("*/.complete"))


def test_an_op_one_side_has_no_run_of_is_still_reported_with_a_verdict_backend(tmp_path, capsys):
    """On a backend that measures (the identical-IR and what-changed passes run), an op whose B has no
    run is reported from A's rows, flagged, and the report fails."""
    a = [_single_run(tmp_path / f"a{i}", 2.0) for i in range(2)]
    assert ab.report(tmp_path / "out", [{"A": a, "B": []}], {"name": "t"}, [], {"cuda"}, expected=2) == 1
    (row,) = load(tmp_path / "out" / "report.json")["rows"]
    assert len(row["a_ms"]) == 2 and row["b_ms"] == [] and "incomplete_b(0/2)" in row["flags"]


def test_an_ab_calls_a_row_only_at_the_false_discovery_rate_it_was_given(tmp_path, capsys):
    # B 5% slower, 2% apart between repeats: called SLOWER at the default 0.05, its q (about 0.049) above 0.01.
    a = [_single_run(tmp_path / f"a{i}", 2.0 * s) for i, s in enumerate((0.98, 1.0, 1.02))]
    b = [_single_run(tmp_path / f"b{i}", 2.1 * s) for i, s in enumerate((1.02, 0.98, 1.0))]
    verdicts = {}
    for fdr in (0.05, 0.01):
        ab.report(tmp_path / f"out{fdr}", [{"A": a, "B": b}], {"name": "t"}, [], {"cuda"}, expected=3, fdr=fdr)
        (row,) = load(tmp_path / f"out{fdr}" / "report.json")["rows"]
        verdicts[fdr] = row["comparison"]["verdict"], row["comparison"]["q"]
    assert verdicts[0.05][0] == "SLOWER" and 0.01 < verdicts[0.05][1] <= 0.05
    assert verdicts[0.01][0] != "SLOWER"


def test_prewarmed_steps_each_get_a_worker_of_their_own_begun_before_the_step_before_theirs(tmp_path, monkeypatch):
    """prewarmed: a fresh interpreter per step, as fresh, without its imports on the step's clock: the
    workers of the first A record and B's passes step begun before A records, the repeats' and the next
    op's record's as the record ends (importing beside B's untimed passes step), each forking one step and
    told to end right after it; the rest ended with the A/B."""
    steps = Steps(monkeypatch)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add, gelu]\nrepeats: 2\nstep_start: prewarmed\n")) == 0
    per_op = 6  # A: record (carrying A's passes), 2 repeats; B: passes, 2 repeats
    assert len(steps.told) == 2 * per_op
    assert steps.schedule()[:per_op] == ["A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    starters = [t["starter"].__self__ for t in steps.told]
    assert len({id(w) for w in starters}) == len(steps.told)  # no worker forks two steps
    # Before the first record: its worker and B's passes step's, begun; no repeat's yet. The second op's
    # record's was begun with the first op's repeats': as many workers by then, none begun for it.
    for first in (0, per_op):
        assert steps.told[first]["begun"] == [True] * (first + 2)
    # Before B's passes step (the record done): every repeat's too, and the next op's record's where one follows.
    assert steps.told[1]["begun"] == [True] * per_op + [True]
    assert steps.told[per_op + 1]["begun"] == [True] * (2 * per_op)
    second_record = steps.told[per_op]["starter"].__self__
    assert steps.workers.index(second_record) < len(steps.told[1]["begun"])  # begun before the first op's B-passes
    # Before each op's first timed step, every worker begun had its imports done: none imports beside it.
    for first_timed in (2, per_op + 2):
        imported = steps.told[first_timed]["imported"][first_timed:]  # the workers of the steps to come
        assert len(imported) >= per_op - 2 and all(imported), imported
    # Each step's worker was told to end as its step did: before the next step started.
    assert all(id(before) in told["closed"] for before, told in zip(starters[:-1], steps.told[1:], strict=True))
    # Each step ran on its own side's worker (the side's environment and cache).
    for told, worker in zip(steps.told, starters, strict=True):
        assert told["argv"][-1].endswith(f"{told['side']}-d{told['side'].lower()}")
        assert worker.cache_root == str(Path(told["argv"][-1]).parent)
    # The first op's first workers import while the sides' Triton is identified (a subprocess each), not after.
    assert steps.begun_when_identified == [[True] * 2] * 2
    assert all(w.closed for w in steps.workers)


def test_prewarmed_workers_are_a_bounded_pool_whatever_the_repeats(tmp_path, monkeypatch):
    """prewarmed, 40 repeats: at no step more than PREWARM_MAX_PER_SIDE workers a side begun and not ended
    (not two per repeat at once); every step still forks from a worker of its own, those past the pool's
    begun as their step starts."""
    steps = Steps(monkeypatch)
    plan = "ops: [add]\nrepeats: 40\nstep_start: prewarmed\nb: {env: {SIDE: b}}\n"
    assert ab.run_from_args(_ab(tmp_path, plan)) == 0
    assert len(steps.told) == 1 + 1 + 2 * 40
    # Each forked step waits at its start gate: a stop during its worker's start runs nothing of it.
    assert all(t["gated"] for t in steps.told)
    starters = [t["starter"].__self__ for t in steps.told]
    assert len({id(w) for w in starters}) == len(steps.told)
    for told in steps.told:
        made = steps.workers[:len(told["begun"])]  # those made by the time of that step
        alive = collections.Counter(w.env.get("SIDE", "a") for w, begun in zip(made, told["begun"], strict=True)
                                    if begun and id(w) not in told["closed"])
        assert max(alive.values(), default=0) <= ab.PREWARM_MAX_PER_SIDE, alive
    assert all(w.closed for w in steps.workers)


def test_prewarmed_workers_of_an_op_whose_record_failed_serve_the_next_op(tmp_path, monkeypatch):
    """A record that failed leaves its op's passes worker unused: the next op's passes step takes it (no
    more begun than its steps need), its repeats' come as its record ends."""
    steps = Steps(monkeypatch, fate=lambda side_dir, attempt: "fails" if side_dir == "A-record" and
                  not any(t["run_dir"].parent.name == "A-record" for t in steps.told[:-1]) else "ok")
    assert ab.run_from_args(_ab(tmp_path, "ops: [add, gelu]\nrepeats: 2\nstep_start: prewarmed\n")) == 1
    assert steps.schedule() == ["A-record", "A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    assert len(steps.workers) == 7  # the failed record's, then the 6 of the second op's steps
    assert steps.told[1]["begun"] == [True] * 3


def test_the_reports_modules_are_imported_beside_the_first_steps_and_done_before_any_timed_one(tmp_path, monkeypatch):
    """The A/B's parent imports none of the report's modules before it begins its first workers: neither ours
    (numpy, jinja2) nor scipy and matplotlib (1-2.5 s and 0.3-1 s on an H200 host); a thread imports them as
    the steps begin, joined before the first timed repeat (no import of ours beside a measuring step), and the
    report then imports nothing more of them."""
    probe = ("import sys\n"
             "from harness import cli\n"
             "from harness.sessions import ab, corpus_ab  # what `python -m harness ab` imports first\n"
             "heavy = lambda: sorted(m for m in sys.modules\n"
             "                       if m.split('.')[0] in ('scipy', 'matplotlib', 'numpy', 'jinja2', 'reports'))\n"
             "print(heavy() == [] or heavy())\n"
             "ab.preload_reports().join()\n"
             "print(all(m in sys.modules for m in ('scipy.stats', 'matplotlib.figure', 'matplotlib.ticker',\n"
             "                                     'reports.ab_report', 'reports.corpus', 'reports.explain')))\n"
             "preloaded = set(heavy())\n"
             "import pathlib\n"
             "from reports import ab_report, compare, stats\n"
             "a, b = [1.0, 1.01, 0.99], [[1.0, 1.02, 0.98], [0.8, 0.81, 0.79]]\n"
             "rows = [compare.PairedRow(op='op', dtype='fp32', shape=(i,), a_ms=a, b_ms=bi, a_control_ms=[],\n"
             "                          b_control_ms=[], timers={'graph'}, flags=[], configs_a={}, configs_b={},\n"
             "                          comparison=stats.compare(a, bi)) for i, bi in enumerate(b)]\n"
             "compare.judge(rows, 0.05)\n"
             "files = ab_report.write(pathlib.Path(sys.argv[1]), rows, compare.summarize(rows, 0.05), [], {})\n"
             "print(sorted(set(heavy()) - preloaded), [f.name for f in files][-1])\n")
    done = subprocess.run([sys.executable, "-c", probe, tmp_path / "report"], cwd=paths.REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "True", "[] ratios.png"], done.stdout
    steps = Steps(monkeypatch)
    events = []

    class Preload:
        def join(self):
            events.append(("joined", len(steps.told)))

    monkeypatch.setattr(ab_runner, "preload_reports", lambda: events.append(("begun", len(steps.told))) or Preload())
    assert ab.run_from_args(_ab(tmp_path, "ops: [add, gelu]\nrepeats: 2\n")) == 0
    # Begun before A's record; joined after each op's record and passes step (A-record, B-passes), before A-1.
    assert events == [("begun", 0), ("joined", 2), ("joined", 8)]
    assert [t["run_dir"].parent.name for t in steps.told][2] == "A-1"


def test_prewarmed_steps_that_all_carry_the_passes_begin_no_worker_for_a_passes_step(tmp_path, monkeypatch):
    """--step-passes every: no passes steps, so an op's workers are A's record and repeats, B's repeats: none
    begun and left unused."""
    steps = Steps(monkeypatch)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 3\nstep_start: prewarmed\nstep_passes: every\n")) == 0
    assert steps.schedule() == ["A-record", "A-1", "B-1", "A-2", "B-2", "A-3", "B-3"]
    assert len(steps.workers) == 7 and steps.told[0]["begun"] == [True] * 7
    assert {id(t["starter"].__self__) for t in steps.told} == {id(w) for w in steps.workers}


def test_a_worker_that_died_importing_before_the_first_timed_step_is_said_and_its_step_begins_another(
        tmp_path, monkeypatch):
    steps = Steps(monkeypatch)
    waited = []

    def wait_ready(worker):
        waited.append(worker)
        if len(waited) == 1:
            raise forkserver.WorkerDied("the warm worker of /x did not start (exit 1; see the log)")
        worker.imported = True

    monkeypatch.setattr(FakeWorker, "wait_ready", wait_ready)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\nstep_start: prewarmed\n")) == 0
    assert len(waited) == 4  # each repeat's worker, before the first repeat
    assert steps.schedule() == ["A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    log = next((tmp_path / "runs").glob("ab_*/ab.log")).read_text()
    assert "the warm worker of /x did not start (exit 1; see the log): its step begins another\n" in log


def test_each_op_dir_of_a_chunk_holds_its_whole_ab_json_from_its_claim(tmp_path):
    """A corpus A/B reads an op's ab.json while the chunk runs (its steps, its timeout's charge): from the
    moment the chunk claims the op's dir it is the op's plan and no step yet, never an empty file."""
    from harness.core import abstate

    plan = ab.plan_from_data({"ops": ["add", "softmax"], "repeats": 2, "backend": "interpreter"}, tmp_path / "p.yaml")
    chunk = tmp_path / "chunk"
    chunk.mkdir()
    runner = ab.Runner(plan, chunk, op_dirs={"add": tmp_path / "add", "softmax": tmp_path / "softmax"})
    try:
        for op in ("add", "softmax"):
            state = abstate.read(tmp_path / op / "ab.json")
            assert (state["plan"]["ops"], state["steps"], state["chunk"]) == ([op], [], str(chunk))
            assert [p.name for p in (tmp_path / op).iterdir()] == ["ab.json"]
    finally:
        runner.close()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(UsageError, match="exists and is not an empty dir"):
        ab.Runner(plan, chunk, op_dirs={"add": tmp_path / "taken"})
