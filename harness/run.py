"""Run a resolved spec: claim the run dir, write the spec and shapes into it, run the pytest child
on one device with a private Triton cache, and tee its output into run.log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import backends
from harness import rundir, shapes, sweep
from harness import spec as spec_mod
from harness.resolve import REPO_ROOT, harness_pythonpath

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _Tee:
    """Terminal and run.log at once; run.log gets plain text."""

    def __init__(self, log_path: Path):
        self.log = open(log_path, "a", encoding="utf-8")

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        self.log.write(ANSI.sub("", text))
        self.log.flush()

    def close(self) -> None:
        self.log.close()


def run_child(run_dir: Path, run_spec: spec_mod.RunSpec, tee: _Tee, cache_dir: str) -> int:
    backend = backends.get(run_spec.backend)
    env = backend.visibility_env(run_spec.device, os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # A private compiler cache per run: the IR collected is exactly this run's, and nothing
    # compiled by another compiler build is picked up from a shared cache.
    env["TRITON_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = harness_pythonpath(env.get("PYTHONPATH"))
    proc = subprocess.Popen([sys.executable, "-m", "harness.child", str(run_dir)], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    try:
        for line in proc.stdout:
            tee.write(line)
        return proc.wait()
    except KeyboardInterrupt:
        # The child got the same SIGINT from the terminal; give it time to write its summary.
        tee.write("\ninterrupted: waiting for the child to finish writing its results\n")
        try:
            for line in proc.stdout:
                tee.write(line)
            return proc.wait(timeout=30)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return 130


def flaggems_shapes_yaml(run_spec: spec_mod.RunSpec) -> str:
    """A FlagGems run's shapes.yaml: the whole shape file (its keys resolve at run time against the
    benchmark's class chain), or a note that the checkout's own shapes were used."""
    source = run_spec.flaggems["shapes_file"]
    if source is None:
        return (f"# upstream shapes: the checkout's own at level {run_spec.flaggems['level']}\n"
                "# (the shapes measured are in results.json)\n{}\n")
    return f"# shape file used by this run (from {source})\n" + Path(source).read_text()


def execute(run_spec: spec_mod.RunSpec, shape_list: list, out: Path | None) -> int:
    root = (out or REPO_ROOT / "runs").resolve()
    run_dir = rundir.claim_run_dir(root, run_spec.op)
    if run_spec.flaggems is not None:
        shapes_text = flaggems_shapes_yaml(run_spec)
        if run_spec.flaggems["shapes_file"]:
            run_spec.flaggems["shapes_file"] = str(run_dir / rundir.SHAPES_YAML)
        rundir.atomic_write_text(run_dir / rundir.SHAPES_YAML, shapes_text)
        shape_count = run_spec.shapes_source
    else:
        shapes.write_used(run_dir / rundir.SHAPES_YAML, run_spec.op, shape_list, run_spec.dtypes,
                          run_spec.shapes_source)
        shape_count = str(len(shape_list))
    spec_mod.write(run_dir, run_spec)
    tee = _Tee(run_dir / rundir.RUN_LOG)
    try:
        what = f"replay of {run_spec.replay_from}" if run_spec.mode == "replay" else "record"
        fg = run_spec.flaggems
        target = f"{fg['repo']}:{run_spec.op} ({fg['test_file']}::{fg['function']})" if fg else run_spec.op
        tee.write(f"zl_bench {what}: op={target} backend={run_spec.backend} device={run_spec.device} "
                  f"dtypes={','.join(run_spec.dtypes) or 'upstream'} shapes={shape_count} timer={run_spec.timer}\n"
                  f"run dir: {run_dir}\n")
        if run_spec.sweep_devices:
            outcome = sweep.run(run_spec, shape_list, run_spec.sweep_devices, run_dir, tee.write)
            rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"sweep": outcome.facts}})
            if outcome.merged is not None:
                run_spec.preset_records = str(outcome.merged)
                spec_mod.write(run_dir, run_spec)
        with tempfile.TemporaryDirectory(prefix="zl_triton_cache_") as cache_dir:
            rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"triton_cache": "private, removed after"}})
            code = run_child(run_dir, run_spec, tee, cache_dir)
        verdict = "ok" if code == 0 else f"FAILED (exit {code})"
        tee.write(f"\n{run_spec.mode} {verdict}; run dir: {run_dir}\n")
    finally:
        tee.close()
    return code
