"""Parallel autotune sweep: shard the shapes round-robin over N devices, let each shard record its
picks in its own process, merge them, and count keys whose winners conflict across shards (the
trust figure). The measurement then runs serially on one device with the merge injected, so the
run dir is exactly a serial record's. Whenever the merge could have holes, the sweep is refused
with its own log line and the run sweeps serially.

The shards and the measurement compile into the run's one Triton cache (same compiler, same
environment): a kernel one shard compiled (precompiled, or in its sweep) is a cache hit for the
other shards and for the measurement, and concurrent precompiles of one kernel wait for each
other instead of compiling it twice (harness.measure.precompile).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml

import backends
from harness.core import launch, rundir
from harness.core import spec as spec_mod
from harness.core.options import RunOptions, declared
from harness.core.request import RunRequest
from harness.measure import tuning

SWEEP_DIR = "sweep"


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What a parallel sweep leaves its run (not how the run ended: that is harness.core.outcome's)."""

    merged: Path | None  # the merged autotune records; None when the sweep was refused
    facts: dict  # run.json's observed.sweep


def round_robin(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n)]


def merge(records: list[dict]) -> tuple[dict, int, int]:
    """(merged records, keys, conflicts): the first shard's pick wins a conflict, deterministically."""
    merged = {"format": tuning.RECORD_FORMAT, "op": records[0].get("op") if records else None, "kernels": {}}
    conflicts = 0
    for rec in records:
        for kernel, entries in rec["kernels"].items():
            into = merged["kernels"].setdefault(kernel, {})
            for key, entry in entries.items():
                if key not in into:
                    into[key] = entry
                elif into[key]["config"] != entry["config"]:
                    conflicts += 1
    keys = sum(len(e) for e in merged["kernels"].values())
    return merged, keys, conflicts


def refusal(run_spec: spec_mod.RunSpec, n: int, shape_count: int, devices: list[int]) -> str | None:
    if run_spec.mode != "record":
        return "replay already pins every config"
    if n < 2:
        return f"fewer than 2 devices requested ({n})"
    if len(devices) < n:
        return f"only {len(devices)} device(s) visible, {n} requested"
    if shape_count < 2:
        return f"fewer than 2 shapes ({shape_count})"
    return None


def sweep_devices(backend: backends.Backend, n: int) -> list[int]:
    """The first n devices the user made visible (the interpreter's are one per CPU core)."""
    try:
        return backend.check_available()[:n]
    except backends.BackendUnavailable:
        return []


def run(run_spec: spec_mod.RunSpec, shape_list: list, n: int, run_dir: Path, log, cache_dir: Path) -> SweepResult:
    backend = backends.get(run_spec.backend)
    devices = sweep_devices(backend, n)
    why = refusal(run_spec, n, len(shape_list), devices)
    if why is not None:
        log(f"parallel sweep refused: {why}; sweeping serially\n")
        return SweepResult(None, {"status": "refused", "reason": why})
    sweep_dir = run_dir / SWEEP_DIR
    sweep_dir.mkdir()
    shards = round_robin(shape_list, n)
    start = time.monotonic()
    running, shard_dirs = [], []
    # Measured as the run is: a shard is the record this run would make of its shapes. Every option a
    # replay keeps as recorded (harness.core.options: record-only) is the spec's, so none can be left out.
    measurement = {f.name: getattr(run_spec, f.name) for f, meta in declared(RunOptions) if meta.record_only}
    try:  # a Ctrl-C while the shards start leaves none of those started behind
        for i, (device, shard_shapes) in enumerate(zip(devices, shards, strict=True)):
            shard_file = sweep_dir / f"shard{i}.yaml"
            shard_file.write_text(yaml.safe_dump({run_spec.op: {"shapes": shard_shapes, "dtypes": run_spec.dtypes}}))
            shard_dirs.append(rundir.unclaimed_run_dir(sweep_dir / f"shard{i}", run_spec.op))
            options = RunOptions(backend=run_spec.backend, device=device, shapes=shard_file, dtypes=run_spec.dtypes,
                                 ops_paths=run_spec.ops_paths, **measurement)
            request = RunRequest("record", run_spec.op, options, ir=False, precompile=run_spec.precompile,
                                 color="never", run_dir=shard_dirs[i], triton_cache=cache_dir)
            out = rundir.open_write(sweep_dir / f"shard{i}.log", "w")
            try:
                # Each shard leads its own group (a Ctrl-C kills it whole) and dies with this run.
                running.append((i, launch.start(request.command_line(), log=out), out))
            except BaseException:
                out.close()
                raise
        log(f"parallel sweep: {len(shape_list)} shapes over devices {devices} "
            f"({', '.join(str(len(s)) for s in shards)} shapes each)\n")
        codes = {i: child.wait() for i, child, _ in running}
    except KeyboardInterrupt:
        for _, child, _ in running:  # Ctrl-C leaves no shard behind
            child.kill()
        raise
    finally:
        for _, child, out in running:
            child.wait()
            out.close()
    seconds = round(time.monotonic() - start, 1)
    failed = {i: c for i, c in codes.items() if c != 0}
    if failed:
        why = "; ".join(f"shard {i} exited {c}, its shapes were never swept" for i, c in sorted(failed.items()))
        log(f"parallel sweep refused: {why} (see {sweep_dir}); sweeping serially\n")
        return SweepResult(None, {"status": "refused", "reason": why, "seconds": seconds})
    records = [tuning.load_records(tuning.records_path(shard_dir, run_spec.op)) for shard_dir in shard_dirs]
    merged, keys, conflicts = merge(records)
    merged_path = sweep_dir / "merged.json"
    rundir.atomic_write_json(merged_path, merged)
    log(f"parallel sweep: {keys} keys merged from {n} shards in {seconds} s; "
        f"{conflicts} key(s) with conflicting winners across shards\n")
    return SweepResult(merged_path, {"status": "parallel", "devices": devices, "shards": [len(s) for s in shards],
                                 "keys": keys, "conflicts": conflicts, "seconds": seconds})
