"""Batch triage: a FlagGems op that still fails after its retries is rerun once as upstream's own
pytest node, which tells a failure of upstream's (FAIL_UPSTREAM, not counted as ours) from ours
(FAIL). Run for real on a copy of the fixture checkout (pytest writes caches into a checkout):
`test_triage.py::test_broken_upstream` fails everywhere, `::test_ours_only` only under our child."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, harness_env, load
from test_batch import statuses

CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"


@pytest.fixture
def checkout(tmp_path) -> Path:
    return Path(shutil.copytree(CHECKOUT, tmp_path / "checkout", ignore=shutil.ignore_patterns("__pycache__")))


def batch(*args) -> subprocess.CompletedProcess:
    env = harness_env()
    return subprocess.run([sys.executable, "-m", "harness", "batch", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
def test_triage_tells_upstream_failures_from_ours(tmp_path, checkout):
    d = tmp_path / "b"
    proc = batch("--ops", "flaggems:broken_upstream", "flaggems:ours_only", "--flaggems-dir", checkout,
                 "--backend", "interpreter", "--devices", "0", "--dtypes", "fp32", "--batch-dir", d)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # ours_only is our failure
    st = statuses(d)
    theirs, ours = st["broken_upstream"], st["ours_only"]
    assert theirs["status"] == "FAIL_UPSTREAM", theirs
    assert "upstream fails too: RuntimeError: broken upstream" in theirs["notes"], theirs
    assert ours["status"] == "FAIL", ours
    assert "ours: upstream passes (1 passed" in ours["notes"], ours
    assert "fails under zl_bench's child only" in (d / ours["run_dir"] / "run.log").read_text()
    # Upstream's own node, with the batch's level and the dtypes of our last attempt, under the op's dir.
    log = (d / "ops" / "flaggems__broken_upstream" / "upstream" / "pytest.log").read_text()
    assert "-m pytest benchmark/test_triage.py::test_broken_upstream --level core --dtypes float32\n" in log
    assert "harness record" not in log
    assert "done: FAIL 1, FAIL_UPSTREAM 1" in proc.stdout
    assert "not passed: flaggems:ours_only\n" in proc.stdout
    assert ("failing or timing out upstream too (not counted as ours; see their notes): flaggems:broken_upstream"
            in proc.stdout)
    # Upstream's failure is settled: a resume reruns only ours.
    proc = batch("--resume", "--batch-dir", d)
    assert "2 selected, 1 already done" in proc.stdout, proc.stdout
    assert "FAIL     flaggems:ours_only" in proc.stdout and "flaggems:broken_upstream device" not in proc.stdout
    assert statuses(d)["broken_upstream"]["status"] == "FAIL_UPSTREAM"


@pytest.mark.e2e
def test_no_triage_is_plain_fail_and_a_resume_keeps_it(tmp_path, checkout):
    d = tmp_path / "b"
    common = ("--flaggems-dir", checkout, "--backend", "interpreter", "--devices", "0")
    proc = batch("--ops", "flaggems:broken_upstream", *common, "--batch-dir", d, "--no-triage")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    op_dir = d / "ops" / "flaggems__broken_upstream"
    assert statuses(d)["broken_upstream"]["status"] == "FAIL"
    assert not (op_dir / "upstream").exists()
    assert load(d / "batch.json")["request"]["triage"] is False
    proc = batch("--resume", "--batch-dir", d)
    assert "options from batch.json: --backend --flaggems-dir --devices --op-timeout --no-triage" in proc.stdout
    assert statuses(d)["broken_upstream"]["status"] == "FAIL" and not (op_dir / "upstream").exists()
    # Turned on again: its only non-passing op fails upstream too, which is not our failure.
    proc = batch("--resume", "--batch-dir", d, "--triage")
    assert statuses(d)["broken_upstream"]["status"] == "FAIL_UPSTREAM"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: FAIL_UPSTREAM 1;" in proc.stdout
