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
"""

from __future__ import annotations

import dataclasses
import io
import shutil
import tarfile
import tempfile
from pathlib import Path

from harness.providers.catalog import Entry

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


def _run_remote(batch_cls, options_cls, entry: dict, opts: dict, op_dtypes: dict, ray_resource: str | None,
                sharded: int, local: bool) -> tuple[dict, bytes, str]:
    """Runs on a Ray worker: one op in a scratch batch dir, returned as (status row, tar.gz, the
    scratch dir, which the files' own paths name). The
    batch's own classes are handed in (Ray pickles them by reference): this module stays below
    harness.sessions.batch, which uses it."""
    import ray

    entry_ = Entry(**entry)
    device = sharded if local else task_device(ray_resource, sharded, ray.get_runtime_context())
    scratch = Path(tempfile.mkdtemp(prefix="zl_ray_op_"))
    try:
        opts_ = options_cls(**{**opts, "replay_root": Path(opts["replay_root"]) if opts["replay_root"] else None})
        row = batch_cls(scratch, opts_, op_dtypes).measure_op(entry_, device)
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
            path.write_text(text.replace(scratch, batch_dir))


def run(runner, todo: list[Entry], on_done, address: str | None, shard) -> None:
    """`shard(entry) -> device`: the batch's stable-hash device of an op."""
    import ray

    import backends

    devices = runner.opts.devices
    local = address is None
    ray_resource = backends.get(runner.opts.backend).ray_resource
    ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
             **({"num_cpus": max(1, len(devices)), "resources": {DEVICE_RESOURCE.format(d): 1 for d in devices}}
                if local else {}))
    try:
        opts = dataclasses.asdict(runner.opts)
        opts["replay_root"] = str(runner.opts.replay_root) if runner.opts.replay_root else None
        pending = {}
        for e in todo:
            device = shard(e)
            remote = ray.remote(**_resources(ray_resource, device, local), max_retries=0)(_run_remote)
            ref = remote.remote(type(runner), type(runner.opts), dataclasses.asdict(e), opts, runner.op_dtypes,
                                ray_resource, device, local)
            pending[ref] = e
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            entry = pending.pop(ready[0])
            row, payload, scratch = ray.get(ready[0])
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
                tar.extractall(runner.dir, filter="data")
                op_dirs = {Path(*Path(m.name).parts[:2]) for m in tar.getmembers() if len(Path(m.name).parts) > 1}
            for op_dir in op_dirs:
                _rebase(runner.dir / op_dir, scratch, str(runner.dir))
            runner.record(entry, row)
            on_done(row)
    except KeyboardInterrupt:
        ray.shutdown()  # cancels the tasks; their process groups die with the workers
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
