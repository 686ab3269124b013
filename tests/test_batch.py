"""Batch screening on the interpreter backend with operators that crash, hang, fail once, reject a
dtype or carry a skip mark."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, exits_of, harness_env, in_a_case, pids_mentioning, wait_for

from harness.core import batchdir
from harness.core.paths import OPS_DIR
from harness.providers import builtin_scan, catalog
from harness.sessions import batch

OPS = REPO / "tests" / "resources" / "batch_ops"
CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"


def statuses(batch_dir: Path) -> dict[str, dict]:
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r for r in csv.DictReader(f)}


def batch_dir_of(text: str) -> Path:
    for line in text.splitlines():
        if line.startswith("batch dir: "):
            return Path(line[len("batch dir: "):].strip())
    raise AssertionError(text)


def start_batch(tmp_path, *args, **extra_env: str):
    env = harness_env()
    env["ZL_TEST_STATE_DIR"] = str(tmp_path)
    env.update(extra_env)
    return subprocess.Popen([sys.executable, "-m", "harness", "batch", "--backend", "interpreter",
                             "--ops-path", str(OPS), "--out", str(tmp_path / "out"), *map(str, args)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.e2e
def test_every_failure_path_gets_its_status_notes_and_files(tmp_path):
    proc = start_batch(tmp_path, "--ops", "crash_op", "hang_op", "flaky_op", "fp32_op", "skip_op", "builtin:add",
                       "--dtypes", "fp16", "--devices", "0,1", "--op-timeout", "20")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out  # some ops failed
    d = batch_dir_of(out)
    st = statuses(d)
    # One attempt rejected fp16 (the rescue drops the filter), then the same crash twice: stop.
    assert st["crash_op"]["status"] == "FAIL" and st["crash_op"]["attempts"] == "3"
    assert "dtype rescue" in st["crash_op"]["notes"] and "exit 3 twice in a row" in st["crash_op"]["notes"]
    assert st["hang_op"]["status"] == "TIMEOUT" and st["hang_op"]["attempts"] == "2"
    assert "not retried" in st["hang_op"]["notes"]
    assert st["flaky_op"]["status"] == "PASS" and st["flaky_op"]["attempts"] == "3"
    assert "retry after exit" in st["flaky_op"]["notes"]
    # fp32-only ops asked for fp16: the rescue run drops the dtype filter.
    assert st["fp32_op"]["status"] == "PASS" and "dtype rescue" in st["fp32_op"]["notes"]
    assert st["skip_op"]["status"] == "SKIP"
    assert st["skip_op"]["notes"].endswith("; skipped: not meaningful on this backend")
    assert st["add"]["status"] == "PASS" and st["add"]["timer"] == "host" and st["add"]["rows"] == "2"
    assert {r["device"] for r in st.values()} <= {"0", "1"}
    # Per-op dirs are single run dirs: replayable alone.
    run_dir = d / st["add"]["run_dir"]
    assert (run_dir / "run.json").is_file() and (run_dir / "autotune_records" / "add.json").is_file()
    # summary.csv: one row per measured case, and it regenerates from the batch dir alone.
    summary = (d / "summary.csv").read_text()
    (d / "summary.csv").unlink()
    batchdir.write_summary(d)
    assert (d / "summary.csv").read_text() == summary
    assert sum(1 for line in summary.splitlines()[1:] if line.startswith("builtin,add,")) == 2
    assert "not passed: path:crash_op, path:hang_op" in out
    assert not any(Path(f"/proc/{p}").exists() for p in pids_mentioning(str(d)))


@pytest.mark.e2e
def test_a_resume_runs_again_an_op_marked_complete_whose_status_row_was_lost(tmp_path):
    first = start_batch(tmp_path, "--ops", "builtin:add", "fp32_op")
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out
    d = batch_dir_of(out)
    # What a kill -9 between an op's completion marker and its row in ops_status.csv leaves.
    lines = (d / "ops_status.csv").read_text().splitlines(keepends=True)
    (d / "ops_status.csv").write_text("".join(line for line in lines if not line.startswith("fp32_op,")))
    assert (d / "ops" / "path__fp32_op" / ".complete").is_file() and "fp32_op" not in statuses(d)
    resumed = start_batch(tmp_path, "--resume", "--batch-dir", d, "--ops", "builtin:add", "fp32_op")
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert "1 already done" in out and "fp32_op" in out.split("already done", 1)[1]
    assert {op: r["status"] for op, r in statuses(d).items()} == {"add": "PASS", "fp32_op": "PASS"}


@pytest.mark.e2e
def test_kill_9_then_resume_loses_no_finished_op(tmp_path):
    proc = start_batch(tmp_path, "--ops", "builtin:add", "builtin:gelu", "fp32_op", "hang_op", "--op-timeout", "120")
    out_dir = tmp_path / "out"
    assert wait_for(lambda: any(p.name == "ops_status.csv" for p in out_dir.rglob("ops_status.csv")), 300)
    d = next(out_dir.iterdir())
    assert wait_for(lambda: any(r["status"] == "PASS" for r in statuses(d).values()), 300)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    # The op that was running dies with its batch (its guard saw the batch go), before any resume.
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))
    finished = {op: r for op, r in statuses(d).items() if r["status"] == "PASS"}
    markers = {op: (d / "ops" / f"{r['repo']}__{op}" / ".complete").stat().st_mtime for op, r in finished.items()}

    # hang_op waits out the resume's --op-timeout in full: 30 s, ~5x what the others took here (6 s).
    resumed = start_batch(tmp_path, "--resume", "--batch-dir", d, "--ops", "builtin:add", "builtin:gelu",
                          "fp32_op", "hang_op", "--op-timeout", "30")
    out, _ = resumed.communicate(timeout=600)
    assert f"{len(finished)} already done" in out
    st = statuses(d)
    for op, mtime in markers.items():  # not rerun
        assert st[op]["status"] == "PASS"
        assert (d / "ops" / f"{st[op]['repo']}__{op}" / ".complete").stat().st_mtime == mtime
    assert {op for op, r in st.items() if r["status"] == "PASS"} == {"add", "gelu", "fp32_op"}
    assert st["hang_op"]["status"] == "TIMEOUT"


@pytest.mark.e2e
def test_ctrl_c_leaves_no_child_process(tmp_path):
    proc = start_batch(tmp_path, "--ops", "hang_op", "--op-timeout", "300")
    out_dir = tmp_path / "out"
    assert wait_for(lambda: out_dir.is_dir() and any(out_dir.iterdir()), 120)
    d = next(out_dir.iterdir())
    # Inside the op's case: its pytest child runs (a fixed sleep is too short on a loaded machine).
    assert wait_for(lambda: in_a_case(d), 240)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in exits_of(signal.SIGINT), out
    assert "interrupted" in out
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))


@pytest.mark.e2e
def test_flaggems_ops_run_from_their_checkout(tmp_path):
    proc = start_batch(tmp_path, "--ops", "flaggems:mm", "flaggems:scale_nested@special/nested", "builtin:add",
                       "--flaggems-dir", CHECKOUT, "--dtypes", "fp16")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    # Selection reads the checkout given, and says when the committed inventory differs from it.
    assert "NOTE: inventory_flaggems.csv differs from a scan of" in out
    d = batch_dir_of(out)
    st = statuses(d)
    assert st["add"]["status"] == "PASS" and not st["add"]["notes"]
    for op in ("mm", "scale_nested"):  # fp32-only benchmarks: FlagGems' own rejection triggers the rescue
        assert st[op]["status"] == "PASS" and st[op]["repo"] == "flaggems", st[op]
        assert "dtype rescue: fp16 rejected" in st[op]["notes"]
    assert st["scale_nested"]["op_file"] == "special/nested"
    log = (d / "ops" / "flaggems__scale_nested" / "batch.log").read_text()
    assert "record flaggems:scale_nested@special/nested --backend interpreter" in log
    assert f"--flaggems-dir flaggems={CHECKOUT}" in log
    assert (d / "ops" / "flaggems__mm" / ".complete").read_text().strip() == "PASS"


def test_selection_reports_every_bad_entry_and_applies_dismissals(tmp_path):
    # The built-in inventory only: the committed FlagGems ones would make `add` ambiguous too.
    entries = catalog.read_csv(catalog.inventory_path(catalog.BUILTIN)) + builtin_scan.scan_dir(OPS, "path")
    with pytest.raises(catalog.SelectionError) as info:
        catalog.select(entries, ["nope", "builtin:mm", "other:add", "mm@wrong_file"], False, None, {})
    text = str(info.value)
    assert "'nope': unknown" in text and "'other:add': unknown" in text and "'mm@wrong_file': unknown" in text
    assert "builtin:mm" not in text.replace("'builtin:mm'", "")  # the good entry is not reported
    dup = entries + [catalog.Entry("vllm", "add", "add", "x.py")]
    with pytest.raises(catalog.SelectionError, match=r"'add': ambiguous \(builtin:add@add, vllm:add@add\)"):
        catalog.select(dup, ["add"], False, None, {})
    selected, excluded = catalog.select(entries, None, True, None, {"builtin:gelu": "flaky on this host"})
    names = {e.op for e in selected}
    assert "gelu" not in names and "skip_op" not in names and "add" in names
    assert {(e.op, why) for e, why in excluded} == {("gelu", "dismissed: flaky on this host"),
                                                    ("skip_op", "skip mark: not meaningful on this backend")}


def test_dismiss_entries_need_a_reason(tmp_path):
    p = tmp_path / "dismiss.txt"
    p.write_text("# header\nvllm:fused_moe  # needs 8 GPUs\n")
    assert catalog.load_dismissed(p) == {"vllm:fused_moe": "needs 8 GPUs"}
    p.write_text("add\n")
    with pytest.raises(catalog.SelectionError, match="has no reason"):
        catalog.load_dismissed(p)


def test_committed_inventory_matches_the_sources():
    fresh = catalog.to_csv(builtin_scan.scan_dir(OPS_DIR, catalog.BUILTIN, OPS_DIR.parent))
    assert (OPS_DIR / "inventory_builtin.csv").read_text() == fresh


def test_sharding_is_stable_and_spreads():
    keys = [f"builtin:op{i}" for i in range(200)]
    first = [batch.shard(k, 4) for k in keys]
    assert first == [batch.shard(k, 4) for k in keys]
    assert set(first) == {0, 1, 2, 3}


@pytest.mark.e2e
def test_replay_root_replays_each_op_from_an_earlier_batch(tmp_path):
    first = start_batch(tmp_path, "--ops", "fp32_op")
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    earlier = batch_dir_of(out)
    again = start_batch(tmp_path, "--ops", "fp32_op", "--replay-root", earlier)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    d = batch_dir_of(out)
    run = json.loads((d / statuses(d)["fp32_op"]["run_dir"] / "run.json").read_text())
    assert run["spec"]["mode"] == "replay" and run["spec"]["replay_from"].startswith(str(earlier))
    assert run["observed"]["autotune"]["injected"] == 2


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA GPU")
def test_gpu_backend_without_device_is_one_clear_error(harness):
    proc = harness("batch", "--all", "--backend", "cuda")
    assert proc.returncode == 2 and "--backend interpreter" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_ray_executor_gives_the_same_statuses_files_and_resume(tmp_path):
    import ray  # noqa: F401  (the tests session installs ray: missing, this test fails, never skips)

    # The local Ray instance's session dirs go under RAY_TMPDIR (the user's /tmp/ray otherwise), ours to
    # remove. Short, not tmp_path: Ray's unix sockets live under it.
    ray_tmp = Path(tempfile.mkdtemp(prefix="zlray", dir="/tmp"))
    users_ray = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"
    sessions_before = set(users_ray.glob("session_*"))
    try:
        proc = start_batch(tmp_path, "--ops", "builtin:add", "crash_op", "--executor", "ray", "--devices", "0,1",
                           RAY_TMPDIR=str(ray_tmp))
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 1, out
        d = batch_dir_of(out)
        st = statuses(d)
        assert st["add"]["status"] == "PASS" and st["crash_op"]["status"] == "FAIL"
        assert "exit 3 twice in a row" in st["crash_op"]["notes"]
        run_dir = d / st["add"]["run_dir"]  # gathered back from the task's scratch dir
        assert (run_dir / "results.json").is_file() and (d / "ops" / "builtin__add" / ".complete").is_file()
        assert "builtin,add,fp32" in (d / "summary.csv").read_text()
        again = start_batch(tmp_path, "--ops", "builtin:add", "--executor", "ray", "--resume", "--batch-dir", d,
                            RAY_TMPDIR=str(ray_tmp))
        out, _ = again.communicate(timeout=300)
        assert again.returncode == 0 and "1 already done" in out
        assert any((ray_tmp / "ray").glob("session_*"))  # the instances were under it
        assert wait_for(lambda: not pids_mentioning(str(ray_tmp)), 30), \
            f"processes of the Ray instance left: {pids_mentioning(str(ray_tmp))}"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert set(users_ray.glob("session_*")) == sessions_before
