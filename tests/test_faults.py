"""Faults injected for real into record runs (interpreter backend): a child killed outright, Ctrl-C,
a batch-style SIGTERM, the parent killed, a disk that fills. Each must leave a run dir that says
what happened, one clear line on the terminal, and everything written before still valid."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, exits_of, harness_env, load, pids_mentioning, run_dir_of, wait_gone

from harness.core import rundir

pytestmark = pytest.mark.e2e
FAULT_OPS = REPO / "tests" / "resources" / "fault_ops"
PLANNED = 8


def shapes_file(tmp_path: Path, op: str, n: int = PLANNED) -> Path:
    path = tmp_path / "shapes.yaml"
    path.write_text(f"{op}:\n  shapes: {[[4 * (i + 1)] for i in range(n)]}\n")
    return path


def start_record(tmp_path: Path, op: str = "slow_op", **env) -> subprocess.Popen:
    """A record in its own session, as a terminal's foreground job is its own process group."""
    cmd = [sys.executable, "-m", "harness", "record", op, "--backend", "interpreter", "--ops-path", FAULT_OPS,
           "--shapes", shapes_file(tmp_path, op), "--out", tmp_path / "runs", "--color", "never"]
    return subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=harness_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def rows_so_far(tmp_path: Path) -> int:
    found = list((tmp_path / "runs").glob("*/results.json"))
    try:
        return len(load(found[0])["rows"]) if found else 0
    except (ValueError, KeyError):
        return 0


def wait_for_rows(tmp_path: Path, proc: subprocess.Popen, n: int) -> None:
    deadline = time.monotonic() + 240
    while rows_so_far(tmp_path) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no rows in time"
        time.sleep(0.2)






def child_pid(run_dir: Path) -> int:
    own = [p for p in pids_mentioning(str(run_dir)) if b"harness.child" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(own) == 1, own
    return own[0]


def the_run_dir(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def assert_valid_and_clean(run_dir: Path) -> list[dict]:
    """Every file parses, no temporary file is left behind; returns the rows."""
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    load(run_dir / "run.json")
    return load(run_dir / "results.json")["rows"]


def test_child_killed_outright_leaves_its_outcome_and_a_replay_says_so(tmp_path, harness):
    # The child is killed inside its third case: a kill from outside after two rows may land
    # between two cases, where no case is running (the test after the next one covers that).
    proc = start_record(tmp_path, ZL_TEST_KILL_AT="12")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGKILL, out + err
    run_dir = the_run_dir(tmp_path)
    rows = assert_valid_and_clean(run_dir)
    assert [r["case"] for r in rows] == ["fp32-4", "fp32-8"]
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert outcome["status"] == "INCOMPLETE" and outcome["reason"].startswith("child killed by signal 9 (SIGKILL)")
    assert outcome["rows_done"] == 2 and outcome["rows_planned"] == PLANNED
    assert outcome["running_case"] == "fp32-12"  # the case it never finished
    last = out.strip().splitlines()[-1]
    assert last == (f"record INCOMPLETE: {len(rows)}/{PLANNED} rows, child killed by signal 9 (SIGKILL) during case "
                    f"{outcome['running_case']}; run dir: {run_dir}")
    replay = harness("replay", run_dir)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    warning = [line for line in replay.stderr.splitlines() if line.startswith("warning: ")]
    assert warning == [f"warning: {run_dir} is an incomplete record ({len(rows)}/{PLANNED} rows; child killed by "
                       f"signal 9 (SIGKILL) during case {outcome['running_case']}): cases it never reached have no "
                       "recorded config and will sweep live"]
    replayed = load(run_dir_of(replay) / "run.json")
    assert replayed["spec"]["replay_source_outcome"] == outcome
    assert replayed["observed"]["autotune"]["key_missing"] == PLANNED - len(rows)


def test_ctrl_c_says_incomplete_in_our_words(tmp_path):
    proc = start_record(tmp_path)
    wait_for_rows(tmp_path, proc, 2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to its foreground job
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in exits_of(signal.SIGINT), out + err
    run_dir = the_run_dir(tmp_path)
    rows = assert_valid_and_clean(run_dir)
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert outcome["status"] == "INCOMPLETE" and outcome["reason"] == "interrupted (SIGINT)"
    assert outcome["rows_done"] == len(rows) < PLANNED
    assert f"run=INCOMPLETE {len(rows)}/{PLANNED}" in out  # the results header
    assert f"record INCOMPLETE: {len(rows)}/{PLANNED} rows, interrupted (SIGINT)" in out
    assert f"run dir: {run_dir}" in out
    for noise in ("KeyboardInterrupt", "!!!", " passed", "INTERNALERROR", "Traceback"):
        assert noise not in out + err, noise
    assert "KeyboardInterrupt" in (run_dir / "run.log").read_text()  # pytest's own account is kept there
    assert wait_gone(str(run_dir)) == []


def test_sigterm_of_the_group_stops_between_rows_and_names_the_case(tmp_path):
    proc = start_record(tmp_path)
    wait_for_rows(tmp_path, proc, 1)
    os.killpg(proc.pid, signal.SIGTERM)  # what batch does on an op timeout
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    run_dir = the_run_dir(tmp_path)
    rows = assert_valid_and_clean(run_dir)
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert outcome["reason"] == "terminated (SIGTERM)" and outcome["rows_done"] == len(rows)
    # The signal lands in a case (the next one after the rows written) or between two (none named):
    # never in a case whose row is written.
    running = outcome["running_case"]
    assert running in (None, f"fp32-{4 * (len(rows) + 1)}"), (running, [r["case"] for r in rows])
    where = f" during case {running}" if running else ""
    assert f"{len(rows)}/{PLANNED} rows, terminated (SIGTERM){where}; run dir: {run_dir}" in out


def test_a_stop_right_after_a_row_is_written_names_no_case_as_running(tmp_path):
    # The fault op's child sends SIGTERM to its group as results.json first holds a row, the moment
    # a load-dependent poll from outside hits now and then.
    proc = start_record(tmp_path, ZL_TEST_STOP_AFTER_ROW="1")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    run_dir = the_run_dir(tmp_path)
    rows = assert_valid_and_clean(run_dir)
    assert [r["case"] for r in rows] == ["fp32-4"]
    observed = load(run_dir / "run.json")["observed"]
    assert observed["outcome"]["running_case"] is None and observed["running_case"] is None
    assert observed["outcome"]["rows_done"] == 1
    last = out.strip().splitlines()[-1]
    assert last == f"record INCOMPLETE: 1/{PLANNED} rows, terminated (SIGTERM); run dir: {run_dir}"
    assert wait_gone(str(run_dir)) == []


def test_a_parent_killed_outright_takes_its_child_with_it(tmp_path):
    proc = start_record(tmp_path)
    wait_for_rows(tmp_path, proc, 1)
    run_dir = the_run_dir(tmp_path)
    child = child_pid(run_dir)
    proc.kill()
    proc.communicate(timeout=60)
    assert wait_gone(str(run_dir)) == [], f"child {child} outlived its parent"
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert outcome["reason"] == "terminated (SIGTERM)"  # the child stopped cleanly on its parent-death signal


def _in_small_tmpfs(tmp_path: Path, script: str, **env) -> subprocess.CompletedProcess:
    """Run `script` (sh) with $FS a fresh 2 MiB tmpfs: a disk that really fills. A private mount
    namespace (unshare) needs no root and leaves nothing mounted; $COPY (on the real disk) gets a
    copy of what the tmpfs held at the end, for the test to read."""
    if shutil.which("unshare") is None:
        pytest.fail("these tests need util-linux's unshare")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private tmpfs mounts on this machine: {probe.stderr.strip()}")
    fs, copy = tmp_path / "fs", tmp_path / "copy"
    fs.mkdir()
    copy.mkdir()
    wrapped = f'mount -t tmpfs -o size=2m none "$FS" && {{ {script}; }}; code=$?; cp -a "$FS"/. "$COPY"/; exit $code'
    return subprocess.run(["unshare", "-rm", "sh", "-c", wrapped], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=harness_env(FS=str(fs), COPY=str(copy), **env))


def test_a_disk_that_fills_mid_run_stops_it_with_one_line_and_keeps_what_was_written(tmp_path):
    cmd = (f'{sys.executable} -m harness record disk_filler_op --backend interpreter --ops-path {FAULT_OPS} '
           f'--shapes {shapes_file(tmp_path, "disk_filler_op", 3)} --out "$FS/runs" --color never')
    proc = _in_small_tmpfs(tmp_path, cmd, ZL_TEST_FILL_DIR=str(tmp_path / "fs"))
    assert proc.returncode == 75, proc.stdout + proc.stderr
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith(f"error: no space left on device writing {tmp_path / 'fs' / 'runs'}")
    for noise in ("Traceback", "INTERNALERROR", "OSError"):
        assert noise not in proc.stdout + proc.stderr, noise
    (run_dir,) = (tmp_path / "copy" / "runs").iterdir()
    rows = assert_valid_and_clean(run_dir)
    assert [r["case"] for r in rows] == ["fp32-4"] and rows[0]["status"] == "SUCCESS"
    assert json.loads((run_dir / "autotune_records" / "disk_filler_op.json").read_text())["kernels"]
    assert "no space left on device" in proc.stdout.splitlines()[-2] + proc.stdout.splitlines()[-1]
    assert wait_gone(str(tmp_path / "fs" / "runs")) == []


def test_a_full_disk_at_start_leaves_no_run_dir(tmp_path):
    cmd = (f'dd if=/dev/zero of="$FS/filler" bs=64k 2>/dev/null; mkdir "$FS/runs"; '
           f'{sys.executable} -m harness record add --backend interpreter --out "$FS/runs"')
    proc = _in_small_tmpfs(tmp_path, cmd)
    assert proc.returncode == rundir.EXIT_DISK_FULL, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        next(line for line in proc.stderr.splitlines() if line.startswith("error: no space left on device writing"))]
    assert list((tmp_path / "copy" / "runs").iterdir()) == []


@pytest.mark.parametrize("where,code", [("--out FILE", 2), ("--out FILE/sub", 1), ("--triton-cache FILE", 2)])
def test_a_path_that_cannot_be_a_dir_is_one_line(tmp_path, harness, where, code):
    # A file named as the dir: refused at the door (the option's declared kind, under the usage); a path
    # under a file: the mkdir's own error.
    afile = tmp_path / "afile"
    afile.write_text("not a dir\n")
    flag, path = where.split()
    proc = harness("record", "softmax", "--backend", "interpreter", flag, path.replace("FILE", str(afile)))
    assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.splitlines()[-1]
    assert "error: " in line and str(afile) in line


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_during_the_parallel_sweep_leaves_an_outcome_and_no_shard(tmp_path, signame):
    cmd = [sys.executable, "-m", "harness", "record", "slow_op", "--backend", "interpreter", "--ops-path", FAULT_OPS,
           "--shapes", shapes_file(tmp_path, "slow_op"), "--sweep-devices", "2", "--out", tmp_path / "runs"]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=harness_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs").glob("*/sweep/shard1.log")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(1.0)  # the shards are sweeping
    signum = getattr(signal, signame)
    os.kill(proc.pid, signum)  # the parent alone, as a scheduler or `kill` does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in exits_of(signum), out + err
    run_dir = the_run_dir(tmp_path)
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    assert outcome["reason"] == f"interrupted ({signame}) during the parallel sweep" and outcome["rows_done"] == 0
    assert f"record INCOMPLETE: 0/{PLANNED} rows, interrupted ({signame}) during the parallel sweep" in out
    assert "Traceback" not in out + err
    assert wait_gone(str(run_dir)) == []
