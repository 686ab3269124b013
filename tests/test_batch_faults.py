"""Batch faults injected for real: a batch killed by SIGKILL (its ops must die with it, and a resume
must stop any that did not), an op that hangs in a known case until the timeout, and the batch dir
and stored options of `--batch-dir` / `--resume`."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, alive, group_pids, harness_env, load, wait_for
from result_rows import result_row

import backends
from harness.core import opguard, rundir
from harness.sessions.batch import facts as batch_facts

OPS = REPO / "tests" / "resources" / "batch_ops"


@pytest.fixture
def harness_batch(tmp_path):
    """`python -m harness batch ARGS` with nothing added (a resume must find the rest in batch.json);
    whatever a failed test leaves running is killed at teardown."""
    started = []

    def start(*args) -> subprocess.Popen:
        env = harness_env()
        env["ZL_TEST_STATE_DIR"] = str(tmp_path)
        started.append(subprocess.Popen([sys.executable, "-m", "harness", "batch", *map(str, args)], cwd=REPO,
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            finish(proc, 60)  # a pipe a leftover still holds fails the test, not hangs it
    for running in tmp_path.rglob(opguard.RUNNING):  # ops a broken guard left behind
        try:
            os.killpg(json.loads(running.read_text())["pgid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError):
            pass


def finish(proc: subprocess.Popen, timeout=600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def statuses(batch_dir: Path) -> dict[str, dict]:
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r for r in csv.DictReader(f)}




def start_hanging_batch(harness_batch, tmp_path, op_start: str) -> tuple[subprocess.Popen, Path, dict]:
    """A batch whose one op hangs in its first case; returns once the op's pytest child runs."""
    d = tmp_path / "batch"
    proc = harness_batch("--backend", "interpreter", "--ops-path", OPS, "--ops", "hang_op",
                         "--op-timeout", 300, "--batch-dir", d, "--op-start", op_start)
    running = d / "ops" / "path__hang_op" / opguard.RUNNING
    assert wait_for(running.is_file, 120), finish(proc, 5)
    facts = json.loads(running.read_text())
    # fresh: guard, record, and the child that hangs; fork: the record (forked, holding .running) and its child
    members = {"fresh": 3, "fork": 2}[op_start]
    assert wait_for(lambda: len(group_pids(facts["pgid"])) >= members, 120), group_pids(facts["pgid"])
    return proc, d, facts


@pytest.mark.e2e
@pytest.mark.parametrize("op_start", ["fork", "fresh"])
def test_a_live_batch_refuses_resume_and_its_ops_die_with_it(harness_batch, tmp_path, op_start):
    proc, d, facts = start_hanging_batch(harness_batch, tmp_path, op_start)
    assert facts["batch_pid"] == proc.pid
    code, _, err = finish(harness_batch("--resume", "--batch-dir", d))
    assert code == 2 and err.strip().splitlines() == [
        f"error: batch dir {d} belongs to batch pid {proc.pid}, which is still running: wait for it, or stop it "
        f"(kill {proc.pid}) and resume then"]
    members = group_pids(facts["pgid"])
    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up
    finish(proc, 60)
    assert wait_for(lambda: not any(alive(p) for p in members), 60), [p for p in members if alive(p)]


@pytest.mark.e2e
@pytest.mark.parametrize("op_start", ["fork", "fresh"])
def test_resume_stops_a_leftover_op_of_a_dead_batch(harness_batch, tmp_path, op_start):
    proc, d, facts = start_hanging_batch(harness_batch, tmp_path, op_start)
    members = group_pids(facts["pgid"])
    # The op's leader (its guard, or the forked record) cannot act, and the batch dies with its whole group
    # (a forked op's worker too): the op outlives its batch.
    os.kill(facts["pid"], signal.SIGSTOP)
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc, 60)
    time.sleep(2)
    assert all(alive(p) for p in members)
    code, out, err = finish(harness_batch("--resume", "--batch-dir", d, "--op-timeout", 1))
    lines = out.splitlines()
    stopped = [i for i, line in enumerate(lines) if line.startswith("resume: stopped ")]
    assert [lines[i] for i in stopped] == [
        f"resume: stopped ops/path__hang_op, still running from the dead batch pid {proc.pid} (process group "
        f"{facts['pgid']}), before reusing its device"], out + err
    assert stopped[0] < lines.index(f"batch dir: {d}")  # before any op of this batch starts
    assert not any(alive(p) for p in members)
    assert code == 1 and statuses(d)["hang_op"]["status"] == "TIMEOUT"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.e2e
def test_a_crash_takes_no_worker_and_a_worker_that_dies_is_replaced_for_the_retry(harness_batch, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("ZL_TEST_SLOW_S", "300")  # killed with its worker long before: no window to miss
    monkeypatch.setenv("ZL_TEST_SLOW_FIRST_ONLY", "1")  # the retry, under a new worker, need not wait too
    d = tmp_path / "batch"
    proc = harness_batch("--backend", "interpreter", "--ops-path", OPS, "--ops", "crash_op", "slow_op", "fp32_op",
                         "--devices", "0", "--batch-dir", d)
    assert wait_for(lambda: list(tmp_path.glob("slow_started_*")), 300), finish(proc, 5)
    child = int(next(tmp_path.glob("slow_started_*")).name.rsplit("_", 1)[1])  # slow_op's pytest child
    worker = _parent(_parent(child))  # its record forked it; the device's worker forked the record
    assert "harness.worker" in Path(f"/proc/{worker}/cmdline").read_text()
    os.kill(worker, signal.SIGKILL)
    code, out, err = finish(proc)
    assert code == 1, out + err
    st = statuses(d)
    assert (st["crash_op"]["status"], st["slow_op"]["status"], st["fp32_op"]["status"]) == ("FAIL", "PASS", "PASS")
    assert st["slow_op"]["attempts"] == "2"
    assert st["slow_op"]["notes"].startswith("its warm worker died during the attempt, which was killed with it; "
                                             "retry after exit -9"), st["slow_op"]["notes"]

    def forked_by(op: str) -> list[int]:
        return [int(p) for p in re.findall(r"\(forked by worker (\d+)\)", (d / "ops" / op / "batch.log").read_text())]

    # crash_op's two crashes ended only themselves: the same worker forked slow_op; its retry got a new one.
    assert forked_by("path__crash_op") == [worker, worker]
    assert forked_by("path__slow_op")[0] == worker and forked_by("path__slow_op")[1] != worker
    assert forked_by("path__fp32_op") == forked_by("path__slow_op")[1:]
    assert (d / "workers.log").read_text().count("-m harness.worker ") == 2


@pytest.mark.e2e
def test_a_timeout_names_the_case_it_killed(harness_batch, tmp_path):
    d = tmp_path / "batch"
    # Waited out in full: 20 s leaves the first case (done within ~5 s of the op's start) a wide margin.
    code, out, err = finish(harness_batch("--backend", "interpreter", "--ops-path", OPS, "--ops",
                                          "hang_later_op", "--op-timeout", 20, "--batch-dir", d))
    assert code == 1, out + err
    row = statuses(d)["hang_later_op"]
    run_dir = d / row["run_dir"]
    case = rundir.read_json(run_dir / "run.json")["observed"]["running_case"]
    assert case.endswith("2x700")  # the op hangs in its second case, not its first
    what = f"timeout after 20 s during case {case}"
    assert row["status"] == "TIMEOUT" and row["notes"] == f"{what} (killed, not retried)"
    batch_log = (d / "ops" / "path__hang_later_op" / "batch.log").read_text()
    assert f"killed by the batch's --op-timeout: {what}" in batch_log
    assert (run_dir / "run.log").read_text().splitlines()[-1] == f"killed by the batch's --op-timeout: {what}"


def test_a_timeout_says_when_no_case_was_running(tmp_path):
    run_dir = tmp_path / "attempt1" / "op_20260101-000000"  # as the batch named it
    assert batch_facts.killed_during(run_dir) == "before its run dir was written (the op never started a case)"
    run_dir.mkdir(parents=True)
    rundir.atomic_write_json(run_dir / "run.json", {"observed": {"running_case": None}})
    assert batch_facts.killed_during(run_dir) == "before its first case started"
    row = result_row(timer="host")
    rundir.atomic_write_json(run_dir / "results.json", {"format": 1, "rows": [row, row]})
    assert batch_facts.killed_during(run_dir) == "with no case running (2 rows done)"
    rundir.atomic_write_json(run_dir / "run.json", {"observed": {"running_case": "fp16-4x16"}})
    assert batch_facts.killed_during(run_dir) == "during case fp16-4x16"
    (run_dir / "run.log").write_text("earlier lines\n")
    what = "timeout after 5 s during case fp16-4x16"
    batch_facts.killed_note(run_dir, tmp_path / "batch.log", what)
    for log in (run_dir / "run.log", tmp_path / "batch.log"):
        assert log.read_text().splitlines()[-1] == f"killed by the batch's --op-timeout: {what}"


@pytest.mark.e2e
def test_batch_dir_is_honoured_and_resume_reuses_what_the_batch_stored(harness_batch, tmp_path):
    d = tmp_path / "new" / "sub" / "batch"
    # `add` is also in the committed FlagGems inventory, whose checkout is not given: not ambiguous.
    code, out, err = finish(harness_batch("--backend", "interpreter", "--ops-path", OPS, "--ops", "add",
                                          "crash_op", "--dtypes", "fp32", "--batch-dir", d))
    assert code == 1 and f"batch dir: {d}" in out.splitlines(), out + err
    assert statuses(d)["add"]["status"] == "PASS" and statuses(d)["crash_op"]["status"] == "FAIL"
    stored_selection = load(d / "batch.json")["request"]["selection"]

    code, _, err = finish(harness_batch("--backend", "interpreter", "--ops", "add", "--batch-dir", d))
    assert code == 2 and err.strip().splitlines() == [
        f"error: --batch-dir {d} is an existing batch dir: to continue it add --resume; for a new batch give a new "
        "or empty dir"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    code, _, err = finish(harness_batch("--backend", "interpreter", "--ops", "add", "--batch-dir", other))
    assert code == 2 and err.strip().splitlines() == [
        f"error: --batch-dir {other} is not empty and is not a batch dir (it has no batch.json): give a new or "
        "empty dir"]
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]

    # Nothing but the dir: backend, ops path, dtypes and the selection come from batch.json.
    log = d / "ops" / "path__crash_op" / "batch.log"
    before = log.read_text().count("\n$ ")
    code, out, err = finish(harness_batch("--resume", "--batch-dir", d))
    assert code == 1, out + err
    assert ("resume: the selection stored in batch.json (2 ops); options from batch.json: --backend --dtypes "
            "--ops-path --devices --op-timeout; from the command line: none") in out.splitlines()
    visible = backends.get("interpreter").check_available()  # the stored devices: all the visible ones
    assert f"2 selected, 1 already done, 0 excluded; devices {visible}; backend interpreter" in out
    rerun = log.read_text().split("\n$ ")[before + 1:]
    assert rerun and all(f"--backend interpreter --dtypes fp32 --ops-path {OPS}" in cmd for cmd in rerun)

    code, out, err = finish(harness_batch("--resume", "--batch-dir", d, "--ops", "add"))
    assert code == 0, out + err
    assert out.splitlines()[0].startswith("resume: the selection given on the command line (batch.json keeps its 2")
    assert "1 selected, 1 already done" in out
    # The batch still owes crash_op: a plain resume runs it again, the narrowed resume forgot nothing.
    assert load(d / "batch.json")["request"]["selection"] == stored_selection
    code, out, err = finish(harness_batch("--resume", "--batch-dir", d))
    assert "resume: the selection stored in batch.json (2 ops)" in out and "2 selected, 1 already done" in out


def test_bad_devices_are_one_line_and_create_nothing(harness_batch, tmp_path):
    beyond = len(backends.get("interpreter").check_available())  # one past the last virtual device
    for devices, message in ((str(beyond), f"device(s) [{beyond}] do not exist here"),
                             ("a,b", "--devices a,b: expected comma-separated device indices")):
        code, _, err = finish(harness_batch("--backend", "interpreter", "--ops", "add", "--devices", devices,
                                            "--batch-dir", tmp_path / "b"))
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "b").exists()


@pytest.mark.e2e
def test_a_sigterm_stops_the_batch_like_ctrl_c_and_keeps_its_files(harness_batch, tmp_path):
    d = tmp_path / "batch"
    proc = harness_batch("--backend", "interpreter", "--ops-path", OPS, "--ops", "hang_op", "--batch-dir", d)
    running = d / "ops" / "path__hang_op" / opguard.RUNNING
    deadline = time.monotonic() + 120
    while not running.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, finish(proc, 5)
        time.sleep(0.2)
    op_group = json.loads(running.read_text())["pgid"]
    proc.send_signal(signal.SIGTERM)  # the batch alone, as `timeout` or a job scheduler does
    code, out, _ = finish(proc, timeout=120)
    assert code == 128 + signal.SIGTERM, out
    assert (f"interrupted (SIGTERM): every running op was killed (path:hang_op); resume with --resume --batch-dir "
            f"{d}") in out
    assert (d / "summary.csv").is_file() and not group_pids(op_group)


@pytest.mark.e2e
def test_requested_dtypes_narrow_to_the_ones_the_op_takes_and_retries_stop_at_two(harness_batch, tmp_path):
    d = tmp_path / "batch"
    code, out, err = finish(harness_batch("--backend", "interpreter", "--ops-path", OPS, "--ops", "fp32_op",
                                          "varying_crash_op", "--dtypes", "fp16,fp32", "--batch-dir", d))
    assert code == 1, out + err
    st = statuses(d)
    # fp32_op takes fp32 only: the batch narrows to it (not the rescue without any filter).
    assert (st["fp32_op"]["status"], st["fp32_op"]["attempts"]) == ("PASS", "2")
    assert st["fp32_op"]["notes"] == "dtype fallback fp16,fp32 -> fp32"
    runs = sorted((d / "ops" / "path__fp32_op").glob("attempt2/*/run.json"))
    assert load_json(runs[-1])["spec"]["dtypes"] == ["fp32"]
    # A failure that ends another way every time (its child's own exit code changes) is retried
    # twice, then given up: 3 attempts after the narrowing one. Each exits 3, INCOMPLETE, as its run says.
    crash = st["varying_crash_op"]
    assert (crash["status"], crash["attempts"]) == ("FAIL", "4")
    said = [f"exit 3 (INCOMPLETE 0/2 rows: child exited {n} unexpectedly (no outcome recorded) during case fp32-300)"
            for n in (11, 12, 13)]
    assert crash["notes"] == (f"dtype fallback fp16,fp32 -> fp32; retry after {said[0]}; retry after {said[1]}; "
                              f"{said[2]}")
    assert crash["exit_code"] == "3"


def load_json(path: Path):
    return json.loads(path.read_text())
