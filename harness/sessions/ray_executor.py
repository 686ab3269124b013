"""Batch on a Ray cluster: the same per-op unit as the local executor, run as Ray tasks.

Each task runs `measure_op` of the batch's own runner class (a record batch, or a corpus A/B) in a
scratch dir on its node, and returns the per-op dir as a tarball, which the driver unpacks into the
batch dir and records. Statuses, markers, resume and the CSVs are therefore the local executor's own.

Which device a task runs on:
- on a cluster (`--ray-address`), Ray's: each task asks for one unit of the backend's Ray resource
  (`Backend.ray_resource`: GPU, NPU) and runs on the id Ray assigned it, read from
  `get_accelerator_ids()` (Ray sets CUDA_VISIBLE_DEVICES for NVIDIA only; the ids hold for every
  vendor, and a node started with `ray start --num-gpus N` hands out ids where Ray detects nothing);
- on a local instance, the batch's own stable-hash shard over `--devices`: the instance gets one
  `zl_device_<N>` resource per device given, and each task asks for its device's, so `--devices`
  is honoured and a resumed batch puts each op on the same device;
- a backend without devices (the interpreter) runs on its shard's virtual device, one CPU per task.

A task lost with its worker or node (a node stopped, a raylet crashed) is submitted once more, to the
nodes left, and its row says so; lost again, the op is a FAIL naming both losses. An error our own
code raised in a task is the op's FAIL row. Neither stops the batch. Ray's own lines (its banners,
the errors its cluster publishes) go to the batch's log, not the terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import tarfile
import tempfile
from pathlib import Path

from harness.core import batchdir, paths, rundir
from harness.providers.catalog import Entry
from harness.sessions import engine_log

DEVICE_RESOURCE = "zl_device_{}"  # a local instance's one unit per device of --devices


class NoAcceleratorId(RuntimeError):
    """Ray ran a task that asked for a device without giving it one."""


def _resources(ray_resource: str | None, device: int, local: bool) -> dict:
    """The Ray resources of one op's task."""
    if local:
        return {"num_cpus": 1, "resources": {DEVICE_RESOURCE.format(device): 1}}
    if ray_resource is None:
        return {"num_cpus": 1}
    if ray_resource == "GPU":
        return {"num_gpus": 1}
    return {"resources": {ray_resource: 1}}


def task_device(ray_resource: str | None, sharded: int, context) -> int:
    """The device a cluster task runs on: the id Ray assigned it for `ray_resource` (`context` is
    `ray.get_runtime_context()`), or `sharded` for a backend without Ray devices."""
    if ray_resource is None:
        return sharded
    ids = context.get_accelerator_ids().get(ray_resource) or []
    if not ids:
        raise NoAcceleratorId(f"Ray gave this task no {ray_resource} id (its accelerator ids: "
                              f"{context.get_accelerator_ids()})")
    return int(ids[0])


def _run_remote(batch_cls, opts, entry: dict, op_dtypes: dict, ray_resource: str | None,
                sharded: int, local: bool) -> tuple[batchdir.StatusRow, bytes, str]:
    """Runs on a Ray worker: one op in a scratch batch dir, returned as (status row, tar.gz, the
    scratch dir, which the files' own paths name). The batch's own class and options are handed in
    (Ray pickles the class by reference): this module stays below harness.sessions.batch, which uses it."""
    import ray

    entry_ = Entry(**entry)
    device = sharded if local else task_device(ray_resource, sharded, ray.get_runtime_context())
    # A private dir (its owner named): one left by a task whose node died is removed by the next made there.
    scratch = paths.make_private_dir("ray_op")
    try:
        row = batch_cls(scratch, opts, op_dtypes).measure_op(entry_, device)
        for log in (scratch / "ops").glob("*/batch.log"):
            with rundir.open_write(log) as f:  # which node ran it: ops spread over a cluster's nodes
                f.write(f"\nran on Ray node {ray.get_runtime_context().get_node_id()}\n")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(scratch / "ops", arcname="ops")
        return row, buf.getvalue(), str(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rebase(op_dir: Path, scratch: str, batch_dir: str) -> None:
    """Point the paths that the op's JSON files hold (an A/B's steps, a replay's source) at the batch
    dir, where the files now are, instead of the task's scratch dir, which is gone."""
    for path in op_dir.rglob("*.json"):
        text = path.read_text()
        if scratch in text:
            rundir.atomic_write_text(path, text.replace(scratch, batch_dir))  # never through a link


def run(runner, todo: list[Entry], on_done, address: str | None, shard) -> None:
    """`shard(entry) -> device`: the batch's stable-hash device of an op. Ray's own lines go to the
    batch's log (engine_log), not the terminal."""
    import ray  # noqa: F401  (first: its import sets up its logger, which the batch's log then replaces)

    # The root logger too: ray.init clears Ray's own logger, whose records then reach the root.
    with engine_log.to_batch_log(runner.dir, "ray", "") as log, engine_log.other_threads_to(log):
        _run(runner, todo, on_done, address, shard, log)


def _run(runner, todo: list[Entry], on_done, address: str | None, shard, log) -> None:
    import ray

    import backends

    devices = runner.opts.devices
    local = address is None
    ray_resource = backends.get(runner.opts.backend).ray_resource
    # Its banners: a logger of its own that init sets up on stderr (configure_logging=False keeps
    # it from doing that for Ray's), and a handler it adds to the root logger on stderr.
    with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 configure_logging=False,
                 **({"num_cpus": max(1, len(devices)), "resources": {DEVICE_RESOURCE.format(d): 1 for d in devices}}
                    if local else {}))
    try:
        def submit(e: Entry):
            device = shard(e)
            # No retry by Ray: a task lost with its worker or node is resubmitted below, once, and said so.
            remote = ray.remote(**_resources(ray_resource, device, local), max_retries=0)(_run_remote)
            return remote.remote(type(runner), runner.opts, dataclasses.asdict(e), runner.op_dtypes, ray_resource,
                                 device, local)

        pending = {submit(e): e for e in todo}
        lost: dict[str, str] = {}  # entry id -> why its first task was lost
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            entry = pending.pop(ready[0])
            try:
                row, payload, scratch = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:  # raised by our own code in the task
                row = _failed_row(entry, shard(entry), runner.opts.backend,
                                  f"the Ray task failed: {_first_line(exc.cause)}")
            except ray.exceptions.RayError as exc:  # the task's worker or node died under it
                why = f"{type(exc).__name__}: {_first_line(exc)}"
                if entry.id not in lost:
                    lost[entry.id] = why
                    pending[submit(entry)] = entry
                    continue
                row = _failed_row(entry, shard(entry), runner.opts.backend,
                                  f"its Ray task was lost twice ({lost.pop(entry.id)}; then {why})")
            else:
                _gather(runner.dir, payload, scratch)
            if entry.id in lost:  # it came back from its second task
                row = dataclasses.replace(row, notes="; ".join(
                    n for n in (f"ran again after its Ray task was lost ({lost[entry.id]})", row.notes) if n))
            runner.record(entry, row)
            on_done(row)
    except KeyboardInterrupt:
        ray.shutdown()  # cancels the tasks; their process groups die with the workers
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()


def _gather(batch_dir: Path, payload: bytes, scratch: str) -> None:
    """Unpack a task's per-op dir into the batch dir, its JSON files' paths rebased onto it: unpacked and
    rebased in a staging dir beside the op dirs first, each then renamed into place, so a parent stopped
    midway leaves no op dir half written (its op runs again on --resume)."""
    staging = Path(tempfile.mkdtemp(prefix=".gather-", dir=batch_dir))
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
            op_dirs = {Path(*Path(m.name).parts[:2]) for m in tar.getmembers() if len(Path(m.name).parts) > 1}
        for op_dir in op_dirs:
            _rebase(staging / op_dir, scratch, str(batch_dir))
            target = batch_dir / op_dir
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():  # an earlier attempt's, replaced whole
                shutil.rmtree(target)
            (staging / op_dir).rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    """What an error says first: its first line, to the end of its first sentence."""
    line = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return line.split(". ", 1)[0]


def _failed_row(entry: Entry, device: int, backend: str, note: str) -> batchdir.StatusRow:
    """The status row of an op whose task handed back none."""
    return batchdir.StatusRow(entry.op, entry.repo, entry.op_file, "FAIL", attempts=0, elapsed_s=0, backend=backend,
                              device=device, rows=0, notes=note)
