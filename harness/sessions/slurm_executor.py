"""Batch on a Slurm cluster through submitit: one array task per op, one GPU each.

The batch dir must be on a filesystem every node shares. Each task runs `measure_op` of the batch's
own runner class (a record batch, or a corpus A/B) straight into its op dir there and returns its
status row; this process, the driver, records the rows in ops_status.csv as tasks end, so one process
writes the shared files. A task's device is the one Slurm gave it: the only device its backend's
visibility env (or, under cgroup confinement, the vendor CLI) shows it; a task that sees more than
one was not narrowed to its allocation and fails loudly rather than guess.

The driver follows its tasks by `squeue` (which shows ended jobs too, for a few minutes) and by the
result each task leaves in the shared dir, never by `sacct`: accounting is off on many small
clusters, where submitit's own polling neither learns that a task died nor stops saying so.

Stopping. Slurm stops a task (scancel, its time limit, a preemption) with a signal to every process
of the job; the task then stops its op as a Ctrl-C stops a local batch (INTERRUPTED, not retried)
and returns that row within seconds, instead of submitit's default of ignoring SIGTERM until Slurm's
KillWait ends it. A driver stopped by Ctrl-C or SIGTERM cancels every task still queued or running,
waits for the running ones' rows and records them. The tasks in flight are listed in `slurm/jobs.json`,
so a `--resume` after a driver killed outright cancels the ones still running, records the rows of
the ones that finished, and reruns the rest.

A task's op runs under the batch's guard like any other, but its guard file has its own name: a
`--resume` on the driver's host stops the leftovers its own guard files name, by pid and process
group, which on another node would be other processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import backends
from harness.core import batchdir, launch, paths, rundir
from harness.core.errors import UsageError
from harness.providers.catalog import Entry
from harness.sessions import engine_log

RUNNING = ".running-slurm"  # a task's guard file (see the module doc)
POLL_S = 2.0
FOLDER = "slurm"  # under the batch dir: submitit's pickles and each task's own log
JOBS_JSON = "jobs.json"  # under FOLDER: the tasks in flight, by job id, while a driver follows them
# Job states that are over (squeue's names). Anything else, unknown names included, is still Slurm's.
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                   "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"})
RESULT_GRACE_S = 15.0  # for a task's result to show on the shared filesystem once its job ended
CANCEL_WAIT_S = 60.0  # for cancelled tasks to stop their ops and hand their rows back
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)  # SIGUSR2: submitit's near-the-time-limit


class TaskDeviceError(RuntimeError):
    pass


def task_device(backend: backends.Backend, sharded: int, environ=None) -> int:
    """The device of a task: the one its allocation shows, or `sharded` (the batch's stable-hash
    device) for a backend without devices (the interpreter's virtual ones)."""
    if backend.visibility_key is None:
        return sharded
    visible = backend.enumerate_devices(environ=environ)
    if len(visible) != 1:
        raise TaskDeviceError(f"this Slurm task sees {len(visible)} {backend.name} devices {visible}, not the one "
                              f"it was allocated: Slurm did not narrow {backend.visibility_key} (ask for GPUs by "
                              "gres, or turn on ConstrainDevices)")
    return visible[0]


def _task(batch_cls, options, op_dtypes: dict, batch_dir: str, entry: Entry, sharded: int) -> batchdir.StatusRow:
    """Runs in the Slurm task: one op, its status row back to the driver. A stop signal from Slurm
    stops the op as a Ctrl-C stops a local batch's: no retry, an INTERRUPTED row."""
    runner = batch_cls(Path(batch_dir), options, op_dtypes)
    runner.running_name = RUNNING
    stopped_by: list[int] = []

    def stop(signum, frame):
        stopped_by.append(signum)
        # Not in the handler: it may have interrupted this thread while it held the runner's lock.
        threading.Thread(target=runner.stop, daemon=True).start()

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    row = runner.measure_op(entry, task_device(backends.get(options.backend), sharded))
    if stopped_by and row.status == "INTERRUPTED":
        why = (f"stopped by Slurm ({signal.Signals(stopped_by[0]).name}: cancelled, preempted or at its time "
               "limit), not retried")
        row = dataclasses.replace(row, notes="; ".join(n for n in (row.notes, why) if n))
    return row


def _failed_row(entry: Entry, device: int, backend: str, note: str, status: str = "FAIL") -> batchdir.StatusRow:
    """The status row of an op whose task handed back none (it failed, or ended outside it)."""
    return batchdir.StatusRow(entry.op, entry.repo, entry.op_file, status, attempts=0, elapsed_s=0, backend=backend,
                              device=device, rows=0, notes=note)


def _error_line(trace: str) -> str:
    """The line a task's traceback ends with, its exception named without its module
    (`TaskDeviceError: this Slurm task sees ...`)."""
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    if not lines:
        return "no traceback"
    name, sep, message = lines[-1].partition(": ")
    return f"{name.rpartition('.')[2]}{sep}{message}"


class _Tasks:
    """The driver's view of the tasks it follows: job id -> (submitit's paths of the task, entry)."""

    def __init__(self, runner, jobs: dict, shard):
        self.runner = runner
        self.jobs = jobs
        self.shard = shard
        self.ended_at: dict[str, float] = {}  # when squeue first showed the job over, its result not there yet
        self.started: set[str] = set()  # jobs squeue showed running

    def states(self) -> dict[str, str] | None:
        """Each job's state by squeue (absent: ended and forgotten); None when squeue did not answer."""
        arrays = sorted({job_id.partition("_")[0] for job_id in self.jobs})
        if not arrays:
            return {}
        try:
            proc = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(arrays)],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            engine_log.note(self.runner.dir, f"squeue did not answer: {exc}")
            return None
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # every one of them ended long enough ago to be forgotten
                return {}
            engine_log.note(self.runner.dir, f"squeue failed (exit {proc.returncode}): {proc.stderr.strip()}")
            return None
        found = dict(line.split("|", 1) for line in proc.stdout.split() if "|" in line)
        self.started.update(j for j, s in found.items() if s in ("RUNNING", "COMPLETING"))
        return found

    def result(self, job_id: str) -> batchdir.StatusRow | None:
        """The row the task handed back, or the FAIL row of one that raised; None while there is none."""
        from submitit.core.utils import pickle_load

        job_paths, entry = self.jobs[job_id]
        if not job_paths.result_pickle.exists():
            return None
        try:
            outcome, value = pickle_load(job_paths.result_pickle)
        except (EOFError, OSError):  # still being written
            return None
        if outcome == "success":
            return value
        return _failed_row(entry, self.shard(entry), self.runner.opts.backend,
                           f"the Slurm task failed: {_error_line(str(value))} (its log: {job_paths.stderr})")

    def collect(self, states: dict[str, str] | None,
                stopped: str | None = None) -> list[tuple[str, Entry, batchdir.StatusRow]]:
        """(job id, entry, row) of each task that is over, taken off the list. A job that ended
        without a result is a FAIL row; after a stop of ours (`stopped` says which), an INTERRUPTED
        one when it had started, and none when it never did (as for a local op never started)."""
        done = []
        now = time.monotonic()
        for job_id, (job_paths, entry) in list(self.jobs.items()):
            row = self.result(job_id)
            if row is None:
                if states is None:  # no news from squeue
                    continue
                state = states.get(job_id)
                if state is not None and state not in ENDED:
                    continue
                # A result may still be on its way through the shared filesystem; after a stop of
                # ours, none comes from a task that never started.
                waits = stopped is None or job_id in self.started
                if waits and now - self.ended_at.setdefault(job_id, now) < RESULT_GRACE_S:
                    continue
                how = f"ended {state}" if state else "left the queue"
                device, backend = self.shard(entry), self.runner.opts.backend
                if stopped is None:
                    row = _failed_row(entry, device, backend,
                                      f"the Slurm task {how} without a status (its log: {job_paths.stderr})")
                elif job_id in self.started:
                    row = _failed_row(entry, device, backend, f"cancelled ({stopped}); the Slurm task {how} "
                                      "without a status", "INTERRUPTED")
            del self.jobs[job_id]
            if row is not None:
                done.append((job_id, entry, row))
        return done

    def cancel(self) -> None:
        """scancel every array still followed: its queued tasks never start, its running ones stop."""
        arrays = sorted({job_id.partition("_")[0] for job_id in self.jobs})
        if arrays:
            subprocess.run(["scancel", *arrays], capture_output=True, timeout=60)
            engine_log.note(self.runner.dir, f"scancel {' '.join(arrays)}")

    def save(self) -> None:
        """The tasks in flight, for a resume after this driver died (settle_leftovers)."""
        rundir.atomic_write_json(_jobs_path(self.runner.dir), {
            "driver_pid": os.getpid(), "jobs": {j: dataclasses.asdict(e) for j, (_, e) in self.jobs.items()}})


def _paths(batch_dir: Path, job_id: str):
    """submitit's files of one array task (its result, its logs) in the batch dir."""
    from submitit.core.utils import JobPaths

    return JobPaths(batch_dir / FOLDER / "%j", job_id=job_id, task_id=0)


def _jobs_path(batch_dir: Path) -> Path:
    return batch_dir / FOLDER / JOBS_JSON


def require_slurm() -> None:
    missing = [tool for tool in ("sbatch", "squeue", "scancel") if shutil.which(tool) is None]
    if missing:
        raise UsageError(f"--executor slurm: no Slurm here ({', '.join(missing)} not found on PATH): run it on a "
                         "Slurm login node")


def run(runner, todo: list[Entry], on_done, params: dict, shard) -> None:
    """Submit one array task per op of `todo` and record each as it ends. `params`: submitit's
    parameters (timeout_min, slurm_partition, ...); `shard(entry) -> device`."""
    import submitit

    if not todo:
        return
    backend = backends.get(runner.opts.backend)
    with engine_log.to_batch_log(runner.dir, "submitit") as log:
        executor = submitit.AutoExecutor(folder=runner.dir / FOLDER / "%j", cluster="slurm")
        # The task imports the harness from this checkout, which every node shares.
        setup = [f"export PYTHONPATH={paths.harness_pythonpath(os.environ.get('PYTHONPATH'))}"]
        executor.update_parameters(name=f"zl_{runner.dir.name}", gpus_per_node=1 if backend.visibility_key else 0,
                                   cpus_per_task=1, slurm_setup=setup, **params)
        submitted_at = time.time()
        try:  # sbatch's own lines (submitit passes them on as they come) go to the batch's log
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), executor.batch():
                submitted = [(executor.submit(_task, type(runner), runner.opts, runner.op_dtypes, str(runner.dir),
                                              e, shard(e)), e) for e in todo]
        except submitit.core.utils.FailedJobError as exc:  # sbatch refused them: nothing was submitted
            said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise UsageError(f"--executor slurm: sbatch refused the batch's tasks: {said}") from None
        tasks = _Tasks(runner, {job.job_id: (_paths(runner.dir, job.job_id), e) for job, e in submitted}, shard)
        for job_paths, _ in tasks.jobs.values():  # a result of an earlier job of this id (a Slurm started afresh)
            if job_paths.result_pickle.exists() and job_paths.result_pickle.stat().st_mtime < submitted_at:
                job_paths.result_pickle.unlink()
        tasks.save()
        engine_log.note(runner.dir, f"submitted {', '.join(tasks.jobs)}")
        try:
            while tasks.jobs:
                finished = tasks.collect(tasks.states())
                for _, entry, row in finished:
                    runner.record(entry, row)
                    on_done(row)
                if tasks.jobs and not finished:
                    time.sleep(POLL_S)
        except KeyboardInterrupt as exc:
            _stop(tasks, on_done, signal.Signals(launch.stopped_by(exc)).name)
            raise
        _jobs_path(runner.dir).unlink(missing_ok=True)


def _stop(tasks: _Tasks, on_done, why: str) -> None:
    """Cancel every task still queued or running, and record the rows the running ones hand back."""
    tasks.states()  # which of them had started: their rows are owed
    tasks.cancel()
    deadline = time.monotonic() + CANCEL_WAIT_S
    try:
        while tasks.jobs and time.monotonic() < deadline:
            for _, entry, row in tasks.collect(tasks.states(), stopped=why):
                tasks.runner.record(entry, row)
                on_done(row)
            time.sleep(0.5)
    except KeyboardInterrupt:  # a second Ctrl-C: the tasks are cancelled, stop waiting for their rows
        pass
    if not tasks.jobs:
        _jobs_path(tasks.runner.dir).unlink(missing_ok=True)


def settle_leftovers(runner, shard) -> list[str]:
    """For a `--resume`: the tasks a driver that died left in Slurm. Those still queued or running
    are cancelled (before their ops run again); the rows of those that ended are recorded. One line
    for each."""
    path = _jobs_path(runner.dir)
    if not path.is_file():
        return []
    require_slurm()
    stored = rundir.read_json(path)
    tasks = _Tasks(runner, {j: (_paths(runner.dir, j), Entry(**e)) for j, e in stored["jobs"].items()}, shard)
    lines = []
    live = {j: s for j, s in (tasks.states() or {}).items() if j in tasks.jobs and s not in ENDED}
    if live:
        tasks.cancel()
        lines += [f"resume: cancelled Slurm task {j} ({tasks.jobs[j][1].key}), still {s.lower()} from the dead "
                  f"batch pid {stored['driver_pid']}" for j, s in sorted(live.items())]
    deadline = time.monotonic() + CANCEL_WAIT_S + RESULT_GRACE_S
    while tasks.jobs and time.monotonic() < deadline:
        for job_id, entry, row in tasks.collect(tasks.states(), stopped="by the resume"):
            runner.record(entry, row)
            lines.append(f"resume: recorded {entry.key} {row.status}, as its Slurm task {job_id} ended")
        time.sleep(0.5)
    path.unlink(missing_ok=True)
    return lines
