"""What a user sees from the nox sessions: no probe noise and no echoed helper scripts before the
session's own command; `nox -l --json` intact (CI builds its matrix from it); the compiler check
imports neither torch nor triton; an interrupt through nox (the real one) is taken as `python -m
harness` takes it, and the harness never outlives nox."""

import csv
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from conftest import REPO, in_a_case, wait_for, wait_gone

NOX = [sys.executable, "-m", "nox"]


def nox(*args, **extra_env):
    # UV names a binary that does not exist: nox's uv probe fails on any machine, as it does
    # where uv is not installed.
    # PATH finds this interpreter's `python` first, as in the environment nox is meant to run from.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")} | {
        "UV": "zl-no-such-uv", "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"} | extra_env
    return subprocess.run([*NOX, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_session_shows_only_its_own_command():
    proc = nox("-s", "record", "--", "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nox_lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("nox > ")]
    assert nox_lines[:2] == ["nox > Running session record", "nox > python -m harness record --help"], nox_lines
    assert len(nox_lines) == 3 and nox_lines[2].startswith("nox > Session record was successful"), nox_lines


def test_session_list_as_json():
    # Every session, so CI can build a job matrix from it (SPEC): nox's JSON listing holds only the
    # sessions a bare run selects, so the noxfile selects no subset.
    named = ["record", "replay", "ab", "bisect", "batch", "inventory-regen", "tests", "lint", "mutants"]
    proc = nox("-l", "--json")
    assert proc.returncode == 0, proc.stderr
    sessions = {s["session"]: s for s in json.loads(proc.stdout)}
    assert set(named) == set(sessions)
    assert {name for name, s in sessions.items() if "ci" in s["tags"]} == {"tests", "lint"}


@pytest.mark.parametrize("argv,selected", [([], ["tests", "lint"]), (["-s", "record"], ["tests", "lint"]),
                                            (["-l", "--json"], None), (["--list"], ["tests", "lint"]),
                                            (["-l"], ["tests", "lint"])])
def test_a_bare_nox_runs_the_checks_and_a_json_listing_shows_every_session(argv, selected):
    # What the noxfile leaves nox to select when no session is named (-s overrides it in nox itself).
    code = ("import runpy, sys; import nox; sys.argv = ['nox', *sys.argv[1:]]; runpy.run_path('noxfile.py'); "
            "print(nox.options.sessions)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(selected)


def test_the_listing_marks_selected_what_a_bare_nox_runs():
    proc = nox("-l")
    assert proc.returncode == 0, proc.stderr
    marks = {name: mark for mark, name in re.findall(r"^([*-]) (\S+)", proc.stdout, re.MULTILINE)}
    assert {name for name, mark in marks.items() if mark == "*"} == {"tests", "lint"}
    assert {"record", "batch", "mutants"} <= {name for name, mark in marks.items() if mark == "-"}


def test_a_session_runs_the_python_nox_runs_in_not_the_first_python_on_path(tmp_path):
    # nox started by its path from another environment: PATH's `python` is not the one whose compiler
    # the session checked, and must not be the one that runs.
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python").write_text("#!/bin/sh\necho 'the wrong python ran' >&2\nexit 3\n")
    (other / "python").chmod(0o755)
    proc = nox("-s", "record", "--", "--help", PATH=f"{other}{os.pathsep}{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"nox > {sys.executable} -m harness record --help" in proc.stderr.splitlines()
    assert "the wrong python ran" not in proc.stdout + proc.stderr


def test_a_session_ends_with_the_harness_s_own_exit_code():
    # 2, bad input: nox on its own turns every failure into 1.
    direct = subprocess.run([sys.executable, "-m", "harness", "record", "--backend", "no-such"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    proc = nox("-s", "record", "--", "--backend", "no-such")
    assert direct.returncode == proc.returncode == 2, proc.stdout + proc.stderr
    assert "nox > Command python -m harness record --backend no-such failed with exit code 2" in proc.stderr


def _require_compiler(find_spec=None):
    """Run the noxfile's compiler check in a fresh interpreter (optionally with torch/triton hidden
    from find_spec); its stdout: the error it raised, then the compiler modules it imported."""
    hide = "" if find_spec is None else (
        "import importlib.util as u; real = u.find_spec; "
        f"u.find_spec = lambda name, *a: None if name in {find_spec!r} else real(name, *a); ")
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); {hide}import noxfile\n"
            "class Session:\n    def error(self, msg): print(msg)\n"
            "noxfile._require_compiler(Session())\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout


def test_compiler_check_finds_without_importing():
    assert _require_compiler() == "[]\n"  # no error, and neither torch nor triton imported


def test_compiler_check_names_what_is_missing():
    error, imported = _require_compiler(("torch",)).splitlines()
    assert error.startswith(f"this Python lacks torch or triton (missing torch in {sys.executable}).")
    # The CPU build from PyTorch's own index, as README says: PyPI's torch brings GBs of CUDA wheels.
    assert "pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in error
    assert imported == "[]"


# --- an interrupt through nox: taken as `python -m harness` takes it, and nothing outlives nox ---
FAULT_OPS = REPO / "tests" / "resources" / "fault_ops"
BATCH_OPS = REPO / "tests" / "resources" / "batch_ops"


def start_nox(tmp_path, session, *posargs, env=None):
    """`nox -s SESSION -- POSARGS` in a session of its own, as a terminal's foreground job is its
    own group; private dirs go to tmp_path/tmp; `env` added to the environment."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")} | {
        "UV": "zl-no-such-uv", "TMPDIR": str(tmp_path / "tmp")} | (env or {})
    return subprocess.Popen([*NOX, "-s", session, "--", *map(str, posargs)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def slow_shapes(tmp_path):
    path = tmp_path / "shapes.yaml"
    path.write_text(f"slow_op:\n  shapes: {[[4 * (i + 1)] for i in range(8)]}\n")
    return path


def op_statuses(batch_dir):
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r["status"] for r in csv.DictReader(f)}


def test_ctrl_c_of_a_record_through_nox_says_where_it_stopped_and_removes_its_cache(tmp_path):
    proc = start_nox(tmp_path, "record", "slow_op", "--backend", "interpreter", "--ops-path", FAULT_OPS,
                     "--shapes", slow_shapes(tmp_path), "--out", tmp_path / "runs", "--color", "never")
    assert wait_for(lambda: in_a_case(tmp_path / "runs") or proc.poll() is not None, 300)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: nox and the harness alike
    out, _ = proc.communicate(timeout=120)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert any(line.startswith("record INCOMPLETE: ") and "interrupted (SIGINT)" in line
               and line.endswith(f"run dir: {run_dir}") for line in out.splitlines()), out
    assert list((tmp_path / "tmp").iterdir()) == []  # the private Triton cache went with the run
    assert wait_gone(str(tmp_path)) == []


def test_ctrl_c_of_an_ab_through_nox_reports_what_completed(tmp_path):
    # Each step of slow_op takes 2 s more (its first call sleeps): the A/B is still running when the Ctrl-C
    # lands. With `add`, a forked interpreter step takes well under a second, and on a loaded CI box all 7
    # steps were over before the signal.
    (tmp_path / "state").mkdir()
    proc = start_nox(tmp_path, "ab", "--ops", "slow_op", "--ops-path", BATCH_OPS, "--backend", "interpreter",
                     "--repeats", "3", "--shapes", slow_shapes(tmp_path), "--out", tmp_path / "ab",
                     env={"ZL_TEST_STATE_DIR": str(tmp_path / "state"), "ZL_TEST_SLOW_S": "2"})

    def replayed_once():  # A recorded, and each side replayed once
        found = list((tmp_path / "ab").glob("ab_*/ab.json"))
        steps = json.loads(found[0].read_text())["steps"] if found else []
        return proc.poll() is not None or sum(s["usable"] for s in steps) >= 3

    assert wait_for(replayed_once, 400)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    (ab_dir,) = (tmp_path / "ab").iterdir()
    assert "interrupted (SIGINT)" in out and any(line.startswith("report: ") for line in out.splitlines()), out
    assert (ab_dir / "ratios.png").is_file() and (ab_dir / "report.json").is_file()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert wait_gone(str(tmp_path)) == []


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm-to-nox", "sigkill-to-nox"])
def test_a_batch_through_nox_stops_when_nox_is_stopped_and_says_so(tmp_path, how):
    d = tmp_path / "batch"
    proc = start_nox(tmp_path, "batch", "--backend", "interpreter", "--ops-path", BATCH_OPS, "--ops", "hang_op",
                     "--batch-dir", d)
    assert wait_for(lambda: in_a_case(d / "ops") or proc.poll() is not None, 300)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:  # nox alone, as a scheduler or `kill` does: the harness must not run on under init
        os.kill(proc.pid, signal.SIGTERM if how == "sigterm-to-nox" else signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)  # the harness holds nox's output open until it ends
    signame = "SIGINT" if how == "ctrl-c" else "SIGTERM"
    assert (f"interrupted ({signame}): every running op was killed (path:hang_op); resume with --resume --batch-dir "
            f"{d}") in out, out
    # The harness's own lines end the output: not nox's line naming the command that "failed".
    assert out.splitlines()[-1] == f"summary: {d / 'summary.csv'}", out
    assert op_statuses(d) == {"hang_op": "INTERRUPTED"}
    assert wait_gone(str(tmp_path)) == []


def test_the_mutation_scores_align_whatever_the_module_names(capsys):
    import noxfile

    results = ("    harness.providers.flaggems_scan.x_scan__mutmut_1: killed\n"
               "    harness.providers.flaggems_scan.x_scan__mutmut_2: survived\n"
               "    reports.stats.x_center__mutmut_1: killed\n")
    noxfile._print_mutation_scores(results)
    table = capsys.readouterr().out.split("\n\n")[1].splitlines()
    ends = [re.search(r"killed / total|\d+ / \d+", line).end() for line in table]
    assert ends == [ends[0]] * 3, table


@pytest.mark.e2e
def test_a_bare_batch_through_nox_screens_the_built_in_inventory(tmp_path):
    # The product's own example of a batch, with no selection: what --all selects here (no checkout given).
    proc = nox("-s", "batch", "--", "--backend", "interpreter", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("no selection given: the whole inventory, 5 ops (builtin 5); --ops or --ops-file to narrow")
    batch_dir = next(tmp_path.glob("batch_*"))
    assert sorted(op_statuses(batch_dir)) == ["add", "gelu", "mm", "rms_norm", "softmax"]
    assert set(op_statuses(batch_dir).values()) == {"PASS"}
