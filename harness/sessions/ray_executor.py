"""Batch on a Ray cluster: the same per-op unit as the local executor, run as Ray tasks.

Each task asks for one device (one GPU on cuda/rocm, one `zl_device` resource elsewhere, one CPU
for the interpreter), runs `Batch.run_op` in a scratch dir on its node, and returns the per-op
dir as a tarball, which the driver unpacks into the batch dir. Statuses, markers, resume and the
CSVs are therefore the local executor's own.
"""

from __future__ import annotations

import dataclasses
import io
import shutil
import tarfile
import tempfile
from pathlib import Path

from harness.providers.catalog import Entry


def _resources(backend_name: str) -> dict:
    import backends

    backend = backends.get(backend_name)
    if not backend.triton_driver:
        return {"num_cpus": 1}
    if backend.torch_device_type == "cuda":
        return {"num_gpus": 1}
    return {"resources": {"zl_device": 1}}


def _run_remote(batch_cls, options_cls, entry: dict, opts: dict, op_dtypes: dict) -> tuple[dict, bytes]:
    """Runs on a Ray worker: one op in a scratch batch dir, returned as (status row, tar.gz). The
    batch's own classes are handed in (Ray pickles them by reference): this module stays below
    harness.sessions.batch, which uses it."""
    import os

    entry_ = Entry(**entry)
    scratch = Path(tempfile.mkdtemp(prefix="zl_ray_op_"))
    try:
        opts_ = options_cls(**{**opts, "replay_root": Path(opts["replay_root"]) if opts["replay_root"] else None})
        # Ray already narrowed the visible devices to this task's; inside them, ours is index 0.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        device = int(visible.split(",")[0]) if visible else 0
        row = batch_cls(scratch, opts_, op_dtypes).run_op(entry_, device)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(scratch / "ops", arcname="ops")
        return row, buf.getvalue()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(runner, todo: list[Entry], on_done, address: str | None) -> None:
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True, **({} if address else {"num_cpus": max(1, len(runner.opts.devices))}))
    try:
        remote = ray.remote(**_resources(runner.opts.backend), max_retries=0)(_run_remote)
        opts = dataclasses.asdict(runner.opts)
        opts["replay_root"] = str(runner.opts.replay_root) if runner.opts.replay_root else None
        pending = {remote.remote(type(runner), type(runner.opts), dataclasses.asdict(e), opts, runner.op_dtypes): e
                   for e in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            entry = pending.pop(ready[0])
            row, payload = ray.get(ready[0])
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
                tar.extractall(runner.dir, filter="data")
            runner.record(entry, row)
            on_done(row)
    except KeyboardInterrupt:
        ray.shutdown()  # cancels the tasks; their process groups die with the workers
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
