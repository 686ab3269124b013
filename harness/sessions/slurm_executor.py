"""Batch on a Slurm cluster through submitit: one array task per op, one GPU each.

The batch dir must be on a filesystem every node shares. Each task runs `measure_op` of the batch's
own runner class (a record batch, or a corpus A/B) straight into its op dir there and returns its
status row; this process, the driver, records the rows in ops_status.csv as tasks end, so one process
writes the shared files. A task's device is the one Slurm gave it: the only device its backend's
visibility env (or, under cgroup confinement, the vendor CLI) shows it; a task that sees more than
one was not narrowed to its allocation and fails loudly rather than guess.

A task's op runs under the batch's guard like any other, but its guard file has its own name: a
`--resume` on the driver's host stops the leftovers its own guard files name, by pid and process
group, which on another node would be other processes. Slurm ends every process of a cancelled or
timed-out task; a driver that stops (Ctrl-C, SIGTERM) cancels its tasks first.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import backends
from harness.core import paths
from harness.core.errors import UsageError
from harness.providers.catalog import Entry

RUNNING = ".running-slurm"  # a task's guard file (see the module doc)
POLL_S = 2.0
FOLDER = "slurm"  # under the batch dir: submitit's pickles and each task's own log


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


def _task(batch_cls, options, op_dtypes: dict, batch_dir: str, entry: Entry, sharded: int) -> dict:
    """Runs in the Slurm task: one op, its status row back to the driver."""
    runner = batch_cls(Path(batch_dir), options, op_dtypes)
    runner.running_name = RUNNING
    return runner.measure_op(entry, task_device(backends.get(options.backend), sharded))


def _failed_row(entry: Entry, device: int, backend: str, exc: BaseException) -> dict:
    """The status row of an op whose task ended without one (node failure, Slurm's time limit)."""
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return {"op": entry.op, "repo": entry.repo, "op_file": entry.op_file, "status": "FAIL", "exit_code": "",
            "attempts": 0, "elapsed_s": 0, "backend": backend, "device": device, "rows": 0,
            "notes": f"the Slurm task ended without a status: {first.strip()}"}


def run(runner, todo: list[Entry], on_done, params: dict, shard, cluster: str = "slurm") -> None:
    """Submit one array task per op of `todo` and record each as it ends. `params`: submitit's
    parameters (timeout_min, slurm_partition, ...); `shard(entry) -> device`; `cluster`: submitit's
    executor, `local` only in the tests (it runs the tasks as local processes)."""
    import submitit

    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise UsageError("--executor slurm: no Slurm here (sbatch not found on PATH): run it on a Slurm login node")
    if not todo:
        return
    backend = backends.get(runner.opts.backend)
    executor = submitit.AutoExecutor(folder=runner.dir / FOLDER / "%j", cluster=cluster)
    # The task imports the harness from this checkout, which every node shares.
    setup = [f"export PYTHONPATH={paths.harness_pythonpath(os.environ.get('PYTHONPATH'))}"]
    executor.update_parameters(name=f"zl_{runner.dir.name}", gpus_per_node=1 if backend.visibility_key else 0,
                               cpus_per_task=1, **{f"{cluster}_setup": setup, **params})
    with executor.batch():
        jobs = [(executor.submit(_task, type(runner), runner.opts, runner.op_dtypes, str(runner.dir), e, shard(e)), e)
                for e in todo]
    pending = list(jobs)
    try:
        while pending:
            finished = [(job, e) for job, e in pending if job.done()]
            for job, e in finished:
                pending.remove((job, e))
                try:
                    row = job.result()
                except Exception as exc:  # submitit re-raises the task's own error, or its death  # noqa: BLE001
                    row = _failed_row(e, shard(e), runner.opts.backend, exc)
                runner.record(e, row)
                on_done(row)
            if pending and not finished:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        for job, _ in pending:
            job.cancel(check=False)
        raise
