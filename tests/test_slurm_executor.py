"""The Slurm executor on a real single-node Slurm (slurmctld, slurmd and munge on this machine,
accounting off: `.ci/slurm-up`, which CI runs), with the interpreter backend's tiny ops: array tasks,
the time limit, stops by Ctrl-C and SIGTERM, resume after a stop and after the driver was killed
outright, a task that sees more than one device. Its bookkeeping alone (no Slurm) is tested at the end."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, pids_mentioning, wait_for

from harness.core import batchdir
from harness.core.options import RunOptions
from harness.providers.catalog import Entry
from harness.sessions import batch, slurm_executor

OPS = REPO / "tests" / "resources" / "batch_ops"
# Set by .ci/run: there, a Slurm that does not answer fails these tests instead of skipping them.
REQUIRE = "ZL_TEST_REQUIRE_SLURM"


def _slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return proc.returncode == 0 and any(s.rstrip("*~#") in ("idle", "mixed", "allocated")
                                        for s in proc.stdout.split())


@pytest.fixture(scope="module")
def slurm():
    """A Slurm that answers: the one running here, else one `.ci/slurm-up` starts (as root, where
    Debian's packages can be installed), stopped again at the end."""
    started = False
    if not _slurm_answers() and os.geteuid() == 0 and shutil.which("apt-get"):
        started = subprocess.run([str(REPO / ".ci" / "slurm-up")], capture_output=True).returncode == 0
    if not _slurm_answers():
        why = "no Slurm answers here (sinfo), and none could be started: run .ci/slurm-up as root (Debian)"
        if os.environ.get(REQUIRE):
            pytest.fail(f"{why}; {REQUIRE} is set, so a Slurm is required")
        pytest.skip(why)
    yield
    if started:
        subprocess.run([str(REPO / ".ci" / "slurm-down")], capture_output=True)


def on_slurm(test):
    """A test that drives the real Slurm (selected with `-m cluster`)."""
    return pytest.mark.cluster(pytest.mark.e2e(pytest.mark.usefixtures("slurm")(test)))


@pytest.fixture
def start(tmp_path):
    """start(*args, sigint_ignored=False, env=None): `python -m harness batch --executor slurm ...` as its
    own process group, its output in one pipe, its batch dir `batch_dir(tmp_path)`. `sigint_ignored`:
    started as a shell script's `cmd &` starts it, with SIGINT ignored. What a failed test leaves
    (a driver, its tasks) is killed at teardown."""
    started = []

    def run(*args, sigint_ignored: bool = False, env: dict | None = None) -> subprocess.Popen:
        environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH")) if p)
        environ["ZL_TEST_STATE_DIR"] = str(tmp_path)
        environ.update(env or {})
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        started.append(subprocess.Popen(
            [sys.executable, "-m", "harness", "batch", "--ops-path", str(OPS), "--executor", "slurm",
             "--batch-dir", str(batch_dir(tmp_path)), *map(str, args)], cwd=REPO, env=environ,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=ignore))
        return started[-1]

    yield run
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    subprocess.run(["scancel", "-n", f"zl_{batch_dir(tmp_path).name}"], capture_output=True)


def batch_dir(tmp_path: Path) -> Path:
    """Named after the test (Slurm job names are the batch dir's): no two tests share a name."""
    return tmp_path / tmp_path.name


def queue(batch_dir: Path) -> dict[str, tuple[str, str]]:
    """The batch's jobs in squeue (queued or running): array task id -> (state, time limit)."""
    out = subprocess.run(["squeue", "-h", "-r", "-n", f"zl_{batch_dir.name}", "-o", "%i|%T|%l"],
                         capture_output=True, text=True, check=True).stdout
    return {i: (s, limit) for i, s, limit in (line.split("|") for line in out.split())}


def statuses(batch_dir: Path) -> dict[str, dict]:
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r for r in csv.DictReader(f)}


def seconds(limit: str) -> int:
    """squeue's time limit, [days-]hours:minutes:seconds or minutes:seconds, in seconds."""
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def only_our_lines(out: str) -> None:
    for noise in ("submitit", "sacct", "accounting storage", "Traceback"):
        assert noise not in out, out


def nothing_left(batch_dir: Path) -> None:
    assert wait_for(lambda: not queue(batch_dir), 20), queue(batch_dir)
    assert wait_for(lambda: not pids_mentioning(str(batch_dir)), 20), pids_mentioning(str(batch_dir))


@on_slurm
def test_ops_run_as_array_tasks_under_a_time_limit_that_fits_their_timeouts(tmp_path, start):
    d = batch_dir(tmp_path)
    proc = start("--backend", "interpreter", "--ops", "hang_op", "crash_op", "--op-timeout", 25)
    seen = {}
    assert wait_for(lambda: seen.update(queue(d)) or len(seen) == 2, 120), seen
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    # One array of two tasks, each under a limit that fits every attempt of an op at --op-timeout.
    arrays = {i.partition("_")[0] for i in seen}
    assert len(arrays) == 1 and sorted(i.partition("_")[2] for i in seen) == ["0", "1"]
    attempts = batch.MAX_RETRIES + 3  # the retries, the dtype fallback and rescue, the triage rerun
    assert all(seconds(limit) >= 25 * attempts for _, limit in seen.values()), seen
    st = statuses(d)
    assert st["hang_op"]["status"] == "TIMEOUT" and st["hang_op"]["attempts"] == "1"
    assert "timeout after 25 s" in st["hang_op"]["notes"] and "not retried" in st["hang_op"]["notes"]
    assert st["crash_op"]["status"] == "FAIL" and "exit 3 twice in a row" in st["crash_op"]["notes"]
    assert (d / st["crash_op"]["run_dir"] / "run.json").is_file()  # written by the task into the shared dir
    # The terminal has our lines only; the engine's own are in the batch's log.
    only_our_lines(out)
    assert f"submitted {min(seen)}, {max(seen)}" in (d / "batch.log").read_text()
    assert not (d / slurm_executor.FOLDER / slurm_executor.JOBS_JSON).exists()
    nothing_left(d)


@on_slurm
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_cancels_every_task_and_records_the_interrupted_ops_then_resume_runs_them(tmp_path, start, signum):
    d = batch_dir(tmp_path)
    # Two CPUs: two ops run, the third waits in the queue. Ctrl-C reaches a driver that a shell
    # started in the background, with SIGINT ignored, as a SIGINT to its group.
    proc = start("--backend", "interpreter", "--ops", "hang_op", "hang_later_op", "fp32_op",
                 "--op-timeout", 300, sigint_ignored=signum == signal.SIGINT)
    running = lambda: [i for i, (s, _) in queue(d).items() if s == "RUNNING"]  # noqa: E731
    started = lambda: len(list(d.glob("ops/*/attempt1/*/run.json"))) == 2  # noqa: E731
    assert wait_for(lambda: len(running()) == 2 and started(), 180), (queue(d), proc.poll())
    pending = {i for i, (s, _) in queue(d).items() if s == "PENDING"}
    assert len(pending) == 1
    os.killpg(proc.pid, signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, out
    assert f"interrupted ({signal.Signals(signum).name})" in out
    assert wait_for(lambda: not queue(d), 10), queue(d)  # nothing queued or running: within seconds
    st = statuses(d)
    interrupted = {op for op, r in st.items() if r["status"] == "INTERRUPTED"}
    assert len(interrupted) == 2 and interrupted <= {"hang_op", "hang_later_op", "fp32_op"}, st
    for op in interrupted:
        assert st[op]["attempts"] == "1" and "not retried" in st[op]["notes"], st[op]
        assert not list(d.glob(f"ops/path__{op}/attempt2"))  # the killed op did not run again in its job
    assert len(st) == 2  # the queued one never started: no row, as for a local op never started
    only_our_lines(out)
    nothing_left(d)
    if signum == signal.SIGTERM:
        return  # one resume after a stop is enough
    again = start("--resume", "--op-timeout", 20)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 1, out  # the hanging ops time out this time
    st = statuses(d)
    assert st["fp32_op"]["status"] == "PASS" and st["hang_op"]["status"] == "TIMEOUT"
    assert st["hang_later_op"]["status"] == "TIMEOUT"
    nothing_left(d)


@on_slurm
def test_resume_after_the_driver_was_killed_settles_the_tasks_it_left(tmp_path, start):
    d = batch_dir(tmp_path)
    proc = start("--backend", "interpreter", "--ops", "fp32_op", "hang_op", "--op-timeout", 300)
    jobs = d / slurm_executor.FOLDER / slurm_executor.JOBS_JSON
    assert wait_for(lambda: jobs.is_file() and len(queue(d)) == 2, 120), proc.poll()
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its group, with no chance to cancel anything
    proc.communicate(timeout=30)
    # Its tasks go on: one finishes, the other hangs.
    fp32 = d / "ops" / "path__fp32_op" / batchdir.COMPLETE
    # The task writes its marker before it exits: Slurm lists it a moment longer.
    assert wait_for(lambda: fp32.is_file() and len(queue(d)) == 1, 180), queue(d)
    again = start("--resume", "--op-timeout", 20)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 1, out
    assert "resume: cancelled Slurm task " in out and "(path:hang_op), still running from the dead batch pid " \
        f"{proc.pid}" in out
    assert "resume: recorded path:fp32_op PASS, as its Slurm task " in out
    assert "2 selected, 1 already done" in out
    st = statuses(d)
    assert st["fp32_op"]["status"] == "PASS" and not list(d.glob("ops/path__fp32_op/attempt2"))
    assert st["hang_op"]["status"] == "TIMEOUT"
    assert not jobs.exists()
    nothing_left(d)


@on_slurm
def test_a_task_that_sees_more_than_one_device_fails_loudly(tmp_path, start):
    # Slurm narrows CUDA_VISIBLE_DEVICES to the GPU it gives a task, not MUSA_VISIBLE_DEVICES: the
    # task inherits the login node's two devices.
    d = batch_dir(tmp_path)
    proc = start("--backend", "musa", "--ops", "builtin:add", env={"MUSA_VISIBLE_DEVICES": "0,1"})
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    note = statuses(d)["add"]["notes"]
    assert note.startswith("the Slurm task failed: TaskDeviceError: this Slurm task sees 2 musa devices [0, 1], "
                           "not the one it was allocated: Slurm did not narrow MUSA_VISIBLE_DEVICES"), note
    assert f"FAIL     builtin:add device=0 0 s rows=0  {note}" in out
    nothing_left(d)


@on_slurm
def test_a_task_cancelled_outside_the_batch_is_interrupted_and_the_batch_goes_on(tmp_path, start):
    d = batch_dir(tmp_path)
    proc = start("--backend", "interpreter", "--ops", "hang_op", "fp32_op", "--op-timeout", 300)
    jobs = d / slurm_executor.FOLDER / slurm_executor.JOBS_JSON
    hanging = d / "ops" / "path__hang_op" / "attempt1"
    assert wait_for(lambda: jobs.is_file() and list(hanging.glob("*/run.json")), 180), proc.poll()
    [job_id] = [j for j, e in json.loads(jobs.read_text())["jobs"].items() if e["op"] == "hang_op"]
    subprocess.run(["scancel", job_id], check=True)  # as a person, or the cluster, would
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    st = statuses(d)
    assert st["fp32_op"]["status"] == "PASS"
    assert st["hang_op"]["status"] == "INTERRUPTED" and st["hang_op"]["attempts"] == "1"
    why = "stopped by Slurm (SIGTERM: cancelled, preempted or at its time limit), not retried"
    assert why in st["hang_op"]["notes"]
    only_our_lines(out)
    nothing_left(d)


@on_slurm
def test_tasks_sbatch_refuses_are_one_error_line(tmp_path, start):
    proc = start("--backend", "interpreter", "--ops", "builtin:add", "--slurm-param", "partition=nope")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert out.splitlines()[-1].startswith("error: --executor slurm: sbatch refused the batch's tasks: sbatch: "
                                           "error: invalid partition specified: nope"), out
    assert not [line for line in out.splitlines() if line.startswith("sbatch")]  # they are in the batch log
    assert "invalid partition" in (batch_dir(tmp_path) / "batch.log").read_text()


# --- the driver's bookkeeping, without Slurm --------------------------------------------------------
class Runner:
    def __init__(self, batch_dir):
        self.dir = batch_dir
        self.opts = batch.Options(RunOptions(backend="interpreter"), [0, 1])


def tasks_of(tmp_path, *job_ids) -> slurm_executor._Tasks:
    entry = Entry(repo="path", op="x", op_file="misbehaving", file="f.py")
    return slurm_executor._Tasks(Runner(tmp_path), {j: (slurm_executor._paths(tmp_path, j), entry)
                                                    for j in job_ids}, lambda e: 1)


def write_result(tmp_path, job_id, outcome, value):
    from submitit.core.utils import cloudpickle_dump

    path = slurm_executor._paths(tmp_path, job_id).result_pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    cloudpickle_dump((outcome, value), path)


def test_a_task_is_over_by_its_result_or_once_slurm_shows_it_ended_without_one(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_executor, "RESULT_GRACE_S", 0.0)
    tasks = tasks_of(tmp_path, "7_0", "7_1", "7_2", "7_3")
    write_result(tmp_path, "7_0", "success", batchdir.StatusRow("x", "path", "misbehaving", "PASS"))
    write_result(tmp_path, "7_1", "error", "Traceback (most recent call last):\n  ...\n"
                 "harness.sessions.slurm_executor.TaskDeviceError: sees 2\n")
    assert [(j, r.status) for j, _, r in tasks.collect(None)] == [("7_0", "PASS"), ("7_1", "FAIL")]
    assert tasks.collect(None) == []  # squeue did not answer: no news of the others
    assert tasks.collect({"7_2": "RUNNING", "7_3": "PENDING"}) == []
    [(job_id, _, row)] = tasks.collect({"7_2": "TIMEOUT", "7_3": "PENDING"})
    assert job_id == "7_2" and row.status == "FAIL"
    assert row.notes.startswith("the Slurm task ended TIMEOUT without a status (its log: ")
    assert list(tasks.jobs) == ["7_3"]


def test_after_a_stop_a_started_task_without_result_is_interrupted_and_one_never_started_has_no_row(tmp_path):
    tasks = tasks_of(tmp_path, "8_0", "8_1")
    tasks.started.add("8_0")
    tasks.ended_at["8_0"] = time.monotonic() - slurm_executor.RESULT_GRACE_S
    [(job_id, _, row)] = tasks.collect({"8_0": "CANCELLED", "8_1": "CANCELLED"}, stopped="SIGINT")
    assert job_id == "8_0" and row.status == "INTERRUPTED"
    assert row.notes == "cancelled (SIGINT); the Slurm task ended CANCELLED without a status"
    assert tasks.jobs == {}  # the one never started is over too, with no row


def test_the_error_line_of_a_task_names_its_exception_without_its_module():
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nharness.x.TaskDeviceError: sees 2: [0, 1]\n'
    assert slurm_executor._error_line(trace) == "TaskDeviceError: sees 2: [0, 1]"
    assert slurm_executor._error_line("") == "no traceback"
