"""What a run leaves behind, for real on the interpreter backend: a process an operator started and
never ended (in our group or in a session of its own) ends with the record, the batch op or the
A/B step; a private Triton cache whose owner was killed outright is removed by the next run, and
run.json says so from the start."""

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, group_pids, harness_env, load, pids_mentioning, wait_for, wait_gone

pytestmark = pytest.mark.e2e
FAULT_OPS = REPO / "tests" / "resources" / "fault_ops"
BATCH_OPS = REPO / "tests" / "resources" / "batch_ops"


def env_for(tmp_path: Path, **extra) -> dict:
    """The harness's environment, with its own temp dir (where private caches go) and the mark the
    leaving op names its process with."""
    env = harness_env()
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(TMPDIR=str(tmp_path / "tmp"), ZL_TEST_MARK=f"left-by-{tmp_path}", **extra)
    return env


def shapes(tmp_path: Path, op: str, n: int) -> Path:
    path = tmp_path / f"{op}.yaml"
    path.write_text(f"{op}:\n  shapes: {[[4 * (i + 1)] for i in range(n)]}\n")
    return path


def harness(tmp_path: Path, *args, timeout=600, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, env=env_for(tmp_path, **env),
                          capture_output=True, text=True, timeout=timeout)


def left_by(tmp_path: Path) -> list[int]:
    return [p for p in pids_mentioning(f"left-by-{tmp_path}") if p != os.getpid()]


def private_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "tmp").glob("zl_*"))


@pytest.mark.parametrize("setsid", ["", "1"], ids=["in-its-group", "setsid"])
def test_a_process_the_candidate_leaves_ends_with_the_record(tmp_path, setsid):
    proc = harness(tmp_path, "record", "leaving_op", "--backend", "interpreter", "--ops-path", FAULT_OPS,
                   "--shapes", shapes(tmp_path, "leaving_op", 2), "--out", tmp_path / "runs", ZL_TEST_SETSID=setsid)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert left_by(tmp_path) == []
    assert private_dirs(tmp_path) == []


def test_a_process_an_op_leaves_ends_with_its_batch_op(tmp_path):
    d = tmp_path / "batch"
    proc = harness(tmp_path, "batch", "--backend", "interpreter", "--ops-path", FAULT_OPS, "--ops", "leaving_op",
                   "--batch-dir", d, ZL_TEST_SETSID="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(d / "ops_status.csv", newline="") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["PASS"]
    assert left_by(tmp_path) == []
    assert private_dirs(tmp_path) == []


def test_a_process_an_op_leaves_ends_with_each_ab_step(tmp_path):
    proc = harness(tmp_path, "ab", "--ops", "leaving_op", "--ops-path", FAULT_OPS, "--backend", "interpreter",
                   "--repeats", "2", "--out", tmp_path / "ab", ZL_TEST_SETSID="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(load(next((tmp_path / "ab").glob("ab_*/ab.json")))["steps"]) == 6  # each step started one
    assert left_by(tmp_path) == []
    assert private_dirs(tmp_path) == []


def _start(tmp_path: Path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, env=env_for(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_cache_of_a_record_killed_outright_goes_with_the_next_run(tmp_path):
    proc = _start(tmp_path, "record", "slow_op", "--backend", "interpreter", "--ops-path", FAULT_OPS,
                  "--shapes", shapes(tmp_path, "slow_op", 8), "--out", tmp_path / "runs")
    assert wait_for(lambda: list((tmp_path / "runs").glob("*/results.json")) or proc.poll() is not None, 240)
    (run_dir,) = (tmp_path / "runs").iterdir()
    (cache,) = private_dirs(tmp_path)
    note = load(run_dir / "run.json")["observed"]["triton_cache"]
    assert note == f"private: {cache}, removed as the run ends (if this process died first: by the next run)"
    proc.kill()
    proc.communicate(timeout=60)
    assert wait_gone(str(run_dir)) == []
    assert cache.is_dir()  # nobody was left to remove it
    again = harness(tmp_path, "record", "slow_op", "--backend", "interpreter", "--ops-path", FAULT_OPS, "--shapes",
                    shapes(tmp_path, "slow_op", 1), "--out", tmp_path / "runs2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert private_dirs(tmp_path) == []


def test_the_caches_of_an_ab_killed_outright_go_with_the_next_run(tmp_path):
    # Fresh steps: no warm worker is left to remove them as the A/B dies (test_forkserver: they do).
    proc = _start(tmp_path, "ab", "--ops", "slow_op", "--ops-path", FAULT_OPS, "--backend", "interpreter",
                  "--repeats", "2", "--step-start", "fresh", "--out", tmp_path / "ab")
    assert wait_for(lambda: list((tmp_path / "ab").glob("ab_*/*/A-record/*/results.json")) or proc.poll() is not None,
                    240)
    state = load(next((tmp_path / "ab").glob("ab_*/ab.json")))
    side_caches = [Path(c["dir"]) for c in state["triton_caches"].values()]
    assert all(c["removed"] == "as the A/B ends (if it died first: by the next run)"
               for c in state["triton_caches"].values())
    os.kill(proc.pid, signal.SIGKILL)  # the A/B alone: its step stops on its parent-death signal
    proc.communicate(timeout=60)
    assert wait_gone(str(tmp_path / "ab"), 60) == []
    assert any(c.parent.is_dir() for c in side_caches)
    again = harness(tmp_path, "record", "slow_op", "--backend", "interpreter", "--ops-path", FAULT_OPS, "--shapes",
                    shapes(tmp_path, "slow_op", 1), "--out", tmp_path / "runs2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert private_dirs(tmp_path) == []


@pytest.mark.parametrize("op_start", ["fork", "fresh"])
def test_a_timed_out_op_that_was_stopped_leaves_no_cache(tmp_path, op_start):
    # A stopped op cannot handle the timeout's SIGTERM: it is killed outright, cache and all.
    d = tmp_path / "batch"
    # Waited out in full, so short: the op's start to the stop below took 1.5 s here (a timeout before
    # the stop fails the test: the group it waits for is gone).
    proc = _start(tmp_path, "batch", "--backend", "interpreter", "--ops-path", BATCH_OPS, "--ops", "hang_op",
                  "--op-timeout", "20", "--batch-dir", d, "--op-start", op_start)
    running = d / "ops" / "path__hang_op" / ".running"
    assert wait_for(lambda: running.is_file() or proc.poll() is not None, 240), proc.communicate()
    facts = load(running)
    # The op's record and its measuring child (fresh: under their guard, facts' pid, left running).
    members = 2 + (op_start == "fresh")
    assert wait_for(lambda: len(group_pids(facts["pgid"])) >= members and private_dirs(tmp_path), 240)
    group = group_pids(facts["pgid"])
    for pid in group:
        if op_start == "fork" or pid != facts["pid"]:
            os.kill(pid, signal.SIGSTOP)
    out, _ = proc.communicate(timeout=300)
    with open(d / "ops_status.csv", newline="") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["TIMEOUT"], out
    assert wait_for(lambda: not group_pids(facts["pgid"]), 60), group_pids(facts["pgid"])
    assert private_dirs(tmp_path) == []
