"""The pytest child: `python -m harness.child RUN_DIR`. Reads the spec from the run dir and runs
the cases under our plugins, one job each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.context import RunContext
from harness.plugins import autotune, ir, results, runinfo, seeds, shapes, timing

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    ctx = RunContext.load(run_dir)
    plugins = [
        runinfo.RunInfoPlugin(ctx),
        seeds.SeedsPlugin(ctx),
        shapes.ShapesPlugin(ctx),
        autotune.AutotunePlugin(ctx),
        ir.IRPlugin(ctx),
        timing.TimingPlugin(ctx),
        results.ResultsPlugin(ctx),
    ]
    args = [
        str(HERE / "cases.py"),
        "-c", str(HERE / "child.ini"),
        "--rootdir", str(HERE),
        f"--color={'yes' if ctx.spec.color else 'no'}",
        "-q", "--tb=short", "-rfE",
    ]
    return int(pytest.main(args, plugins=plugins))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
