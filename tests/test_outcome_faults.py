"""Faults injected for real (interpreter backend) whose truth must reach the exit code and the
terminal in our words: a child that exits on its own mid-run, with any exit code; operator modules
that exit, hang or raise a BaseException while they import; stored fields of the wrong type (a
batch.json, a plan, autotune records); an operator that changes torch's process-wide state; a
Ctrl-C during start-up; a run dir deleted while its run is going."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, exits_of, load, pids_mentioning, run_dir_of, wait_for, wait_gone

pytestmark = pytest.mark.e2e
FAULT_OPS = REPO / "tests" / "resources" / "fault_ops"
IMPORT_FAULTS = REPO / "tests" / "resources" / "import_faults"
MODULE = IMPORT_FAULTS / "at_import.py"


def env(**extra) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ZL_TEST_IMPORT_FAULT")}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH")) if p)
    environ.update(extra)
    return environ


def harness(*args, timeout=600, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, env=env(**extra),
                          capture_output=True, text=True, timeout=timeout)


def start(*args, sigint_ignored: bool = False, **extra) -> subprocess.Popen:
    """In its own session, as a terminal's foreground job is its own process group. `sigint_ignored`:
    started as nohup or a script's background job start it, with SIGINT ignored (Python keeps that)."""
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, env=env(**extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=ignore)


def _maps(pid: int) -> str:
    """What the process has mapped (its loaded libraries)."""
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def shapes_file(tmp_path: Path, op: str, shapes=((4,), (8,))) -> Path:
    path = tmp_path / f"{op}.yaml"
    path.write_text(f"{op}:\n  shapes: {[list(s) for s in shapes]}\n")
    return path


def record_args(tmp_path: Path, op: str, *more) -> list:
    return ["record", op, "--backend", "interpreter", "--ops-path", FAULT_OPS, "--shapes", shapes_file(tmp_path, op),
            "--out", tmp_path / "runs", "--color", "never", *more]


def no_traceback(text: str) -> None:
    for noise in ("Traceback", "  File ", "INTERNALERROR", "  | "):
        assert noise not in text, f"{noise!r} in:\n{text}"


# --- 1. the exit code follows the recorded outcome ------------------------------------------------
@pytest.mark.parametrize("child_code", [0, 75])
def test_a_child_that_exits_on_its_own_mid_run_is_incomplete_whatever_its_code(tmp_path, child_code):
    proc = harness(*record_args(tmp_path, "exit_op"), ZL_TEST_EXIT_CODE=str(child_code))
    assert proc.returncode == 3, proc.stdout + proc.stderr  # INCOMPLETE: never 0, never "the disk filled"
    run_dir = run_dir_of(proc)
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert outcome == {"status": "INCOMPLETE", "rows_done": 1, "rows_planned": 2, "running_case": "fp32-8",
                       "reason": f"child exited {child_code} unexpectedly (no outcome recorded)", "exit_code": 3}
    assert proc.stdout.splitlines()[-1] == (
        f"record INCOMPLETE: 1/2 rows, child exited {child_code} unexpectedly (no outcome recorded) during case "
        f"fp32-8; run dir: {run_dir}")
    assert "no space left" not in proc.stdout + proc.stderr
    assert not (run_dir / ".space_reserve").exists()  # held for a full disk while the child ran, then freed


def test_a_batch_op_whose_child_exits_2_is_retried_not_taken_for_bad_input(tmp_path):
    d = tmp_path / "batch"
    proc = harness("batch", "--backend", "interpreter", "--ops-path", FAULT_OPS, "--ops", "exit_op", "--shapes",
                   shapes_file(tmp_path, "exit_op"), "--batch-dir", d, ZL_TEST_EXIT_CODE="2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(d / "ops_status.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert (row["status"], row["exit_code"], row["attempts"]) == ("FAIL", "3", "2")
    said = "exit 3 (INCOMPLETE 1/2 rows: child exited 2 unexpectedly (no outcome recorded) during case fp32-8)"
    assert row["notes"] == f"retry after {said}; exit 3 twice in a row the same way: deterministic, not retried further"
    assert "bad input" not in row["notes"]


# --- 1, 4, 6. operator modules that exit, hang or raise a BaseException at import -----------------
@pytest.mark.parametrize("fault,story", [("sys_exit", "SystemExit: 0"), ("base", "Abort: refusing to import")])
def test_a_module_that_exits_or_raises_a_base_exception_at_import_is_one_line(tmp_path, fault, story):
    proc = harness("record", "import_fault_op", "--backend", "interpreter", "--ops-path", IMPORT_FAULTS,
                   "--out", tmp_path / "runs", ZL_TEST_IMPORT_FAULT=fault)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {MODULE}:")
    assert f": {story} (operator 'import_fault_op' is defined nowhere else" in line
    assert not (tmp_path / "runs").exists()


def test_a_module_that_ends_its_process_at_import_is_one_line_even_for_a_builtin_op(tmp_path):
    proc = harness("record", "add", "--backend", "interpreter", "--ops-path", IMPORT_FAULTS, "--out", tmp_path / "runs",
                   ZL_TEST_IMPORT_FAULT="os_exit")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: --ops-path module {MODULE} ended its process while importing (exited 0); an operator module must "
        "not exit or kill its process at import"]
    assert proc.stdout == "" and not (tmp_path / "runs").exists()


def test_a_batch_whose_module_hangs_at_import_stops_at_its_import_budget(tmp_path):
    d = tmp_path / "batch"
    proc = harness("batch", "--backend", "interpreter", "--ops-path", IMPORT_FAULTS, "--ops", "import_fault_op",
                   "--op-timeout", 2, "--batch-dir", d, timeout=240, ZL_TEST_IMPORT_FAULT="sleep")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [  # --op-timeout 2, but no import budget is below 30 s
        f"error: --ops-path module {MODULE} did not finish importing in 30 s (does it wait or loop at import?); "
        "nothing was run"]
    assert not list(d.glob("ops/*"))
    assert wait_gone(str(IMPORT_FAULTS), 10) == []  # this test's probe: its command line names the module


def test_ctrl_c_while_a_module_imports_is_one_line(tmp_path):
    proc = start("record", "add", "--backend", "interpreter", "--ops-path", IMPORT_FAULTS, "--out", tmp_path / "runs",
                 ZL_TEST_IMPORT_FAULT="sleep")
    probe = f"{IMPORT_FAULTS}"  # the probe's command line names the --ops-path it imports
    assert wait_for(lambda: any(p != proc.pid for p in pids_mentioning(probe)), 120), proc.communicate(timeout=5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in exits_of(signal.SIGINT), out + err
    assert (out, err) == ("", "interrupted (SIGINT)\n")
    assert wait_gone(probe, 10) == []


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["inherited-default", "inherited-ignored"])
def test_ctrl_c_during_start_up_is_one_line(tmp_path, sigint_ignored):
    proc = start("record", "add", "--backend", "interpreter", "--out", tmp_path / "runs", sigint_ignored=sigint_ignored)
    # Once the harness is importing (launch, the first module its handler covers, loads ctypes), long
    # before any child or run dir. Not a fixed delay: on a loaded box 0.3 s can fall within Python's own
    # start-up, where a SIGINT ends any process outright before a line of ours has run.
    assert wait_for(lambda: "/_ctypes." in _maps(proc.pid), 60, interval=0.01), proc.communicate(timeout=5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in exits_of(signal.SIGINT), out + err  # the line below is the promise
    no_traceback(out + err)
    assert (out + err).strip().splitlines()[-1].startswith(("interrupted (SIGINT)", "record INCOMPLETE"))


# --- 4. stored fields: checked before anything runs ----------------------------------------------
@pytest.mark.parametrize("field,value,should", [
    ("op_timeout", "abc", "a number of seconds > 0, at most 604800 (a week)"),
    ("op_timeout", -1, "a number of seconds > 0, at most 604800 (a week)"),
    ("devices", 0, "comma-separated device indices"),
    ("dtypes", ["fp64"], "a non-empty list of distinct names"),
    ("seed", "1", "an integer from 0 to 4294967295"),
    ("triage", "no", "false (on is stored as null)"),
    ("selection", "add", "a list of [repo:]op[@op_file]"),
    ("shapes", "a\0b", "a path"),  # a NUL reached os.stat as a traceback
    ("ops_paths", ["ops\0"], "a list of paths"),
])
def test_a_stored_batch_option_of_the_wrong_type_is_refused_in_one_line(tmp_path, field, value, should):
    d = tmp_path / "batch"
    d.mkdir()
    request = {"backend": "interpreter", "selection": ["builtin:add@add"], "op_timeout": 60, field: value}
    (d / "batch.json").write_text(json.dumps({"selected": ["add"], "request": request}))
    proc = harness("batch", "--resume", "--batch-dir", d, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: --resume: {d / 'batch.json'} is corrupt: request.{field} = {value!r}")
    assert f"is not {should}" in line
    assert sorted(p.name for p in d.iterdir()) == [".owner", "batch.json"]  # nothing ran


@pytest.mark.parametrize("field,value,should", [
    ("device", "0", "'device' must be a device index"),
    ("ops_paths", "ops", "'ops_paths' must be a list of paths"),
    ("level", "all", "'level' must be one of core, comprehensive"),
    ("backend", 3, "'backend' must be a string"),
    ("name", "a" * 101, "'name' must be a string of 1 to 100 printable characters"),  # it names the A/B's dir
    ("b", {"env": {"X": "1\0"}}, "not valid yaml: the string '1\\x00' holds a NUL character"),
])
def test_a_plan_field_of_the_wrong_type_is_refused_in_one_line(tmp_path, field, value, should):
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"ops": ["add"], field: value}))
    proc = harness("ab", plan, "--backend", "interpreter", "--out", tmp_path / "runs", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: plan {plan}: {should}"), line


def test_a_corpus_ab_plan_stored_with_a_wrong_type_is_refused_on_resume(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    plan = {"name": "x", "ops": ["add"], "repeats": "three", "a": {}, "b": {}}
    (d / "batch.json").write_text(json.dumps({"request": {"backend": "interpreter", "plan": plan}}))
    proc = harness("ab", "--resume", "--batch-dir", d, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: plan stored in {d / 'batch.json'}: 'repeats' must be an integer from 2 to 100"), \
        line


@pytest.mark.parametrize("given", [["plan"], ["--ops", "softmax", "add", "softmax"]])
def test_an_op_named_twice_in_an_ab_is_refused_before_anything_runs(tmp_path, given):
    # Each name is a whole A/B: a plan listing one op 10^5 times ran 10^5 of them.
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: x\nops: [softmax, add, softmax]\nrepeats: 2\n")
    proc = harness("ab", *[str(plan) if g == "plan" else g for g in given], "--backend", "interpreter", "--out",
                   tmp_path / "runs", timeout=120)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2, ["error: ops ['softmax'] given more than once: name each op once"]), proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_corpus_ab_plan_stored_with_a_nul_in_an_env_value_is_refused_on_resume(tmp_path):
    # JSON carries a NUL (\u0000) that no environment can: it reached the step's exec as a traceback.
    d = tmp_path / "corpus"
    d.mkdir()
    plan = {"name": "x", "ops": ["add"], "a": {}, "b": {"env": {"X": "1\0"}}}
    (d / "batch.json").write_text(json.dumps({"request": {"backend": "interpreter", "plan": plan}}))
    proc = harness("ab", "--resume", "--batch-dir", d, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: stored in {d / 'batch.json'}: side 'B': env X: "), line
    assert "is not a string or a number (quote it: '1', 'true'; no NUL character)" in line


@pytest.fixture(scope="module")
def add_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("add_record")
    proc = harness("record", "add", "--backend", "interpreter", "--out", out / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir_of(proc)


@pytest.mark.parametrize("tamper,problem", [
    (lambda kwargs: {**kwargs, "BLOCK": "abc"}, "BLOCK='abc' is a str; its tuning space gives it int"),
    (lambda kwargs: {("BLOK" if k == "BLOCK" else k): v for k, v in kwargs.items()},
     "parameters ['BLOK'] are not those its tuning space sets (['BLOCK']): a renamed parameter?"),
])
def test_a_recorded_config_of_the_wrong_type_is_refused_as_corrupt_not_blamed_on_the_candidate(
        tmp_path, add_record, tamper, problem):
    record = tmp_path / add_record.name
    shutil.copytree(add_record, record)
    path = record / "autotune_records" / "add.json"
    data = load(path)
    (kernel,) = data["kernels"]
    first = next(iter(data["kernels"][kernel]))
    entry = data["kernels"][kernel][first]
    entry["config"]["kwargs"] = tamper(entry["config"]["kwargs"])
    path.write_text(json.dumps(data))
    proc = harness("replay", record, "--out", tmp_path / "runs")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: autotune records {path} are corrupt: kernel {kernel} key {first}: {problem}"]
    replay = run_dir_of(proc)
    assert load(replay / "results.json")["rows"] == []  # no row blamed on the candidate
    outcome = load(replay / "run.json")["observed"]["outcome"]
    assert outcome["exit_code"] == 2 and outcome["reason"] == errors[0].replace("error: ", "bad input: ", 1)
    assert proc.stdout.splitlines()[-1].startswith("replay INCOMPLETE: 0/2 rows, bad input: autotune records ")
    no_traceback(proc.stdout + proc.stderr)


# --- 5. torch's global state is the same at the start of every case ------------------------------
def test_a_candidate_that_changes_torch_state_is_marked_and_later_cases_start_clean(tmp_path):
    proc = harness(*record_args(tmp_path, "leaky_op"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = load(run_dir_of(proc) / "results.json")["rows"]
    assert first["markers"] == ["STATE_LEAK default_dtype=torch.float32->torch.float64 "
                                "deterministic_algorithms=(False, False)->(True, False) (changed during this case; "
                                "restored)"]
    assert second["markers"] == []
    # The second case's inputs are those it has in a clean process: drawn in float32.
    import torch

    from harness.child.plugins.seeds import input_sha256, seed_everything
    from ops import numel

    seed_everything(0)
    clean = (torch.randn(8).to(torch.float32), torch.randn(8).to(torch.float32))
    assert numel(second["shape"]) == 8 and second["input_sha256"] == input_sha256(clean)


# --- 6. a run dir deleted under the run ------------------------------------------------------------
def test_a_run_dir_deleted_while_the_run_is_going_is_one_line(tmp_path):
    proc = start(*record_args(tmp_path, "slow_op"))
    runs = tmp_path / "runs"
    assert wait_for(lambda: list(runs.glob("*/results.json")) and load(next(runs.glob("*/results.json")))["rows"],
                    240, 0.2), proc.communicate(timeout=5)
    (run_dir,) = runs.iterdir()
    while run_dir.exists():  # the run may be writing into it meanwhile
        shutil.rmtree(run_dir, ignore_errors=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, out + err
    no_traceback(out + err)
    assert out.splitlines()[-1].startswith("record INCOMPLETE: ")
    assert out.splitlines()[-1].endswith(f"its run dir was removed while it was going (nothing of it is kept); "
                                         f"run dir: {run_dir}")
    assert wait_gone(str(run_dir)) == []
