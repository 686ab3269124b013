"""The pytest child: `python -m harness.child RUN_DIR`. Reads the spec from the run dir and runs
the cases under our plugins, one job each."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness import flaggems
from harness.context import RunContext
from harness.plugins import autotune, ir, results, runinfo, seeds, shapes, timing
from harness.plugins import flaggems as flaggems_plugin

HERE = Path(__file__).resolve().parent


def prepare_flaggems(ctx: RunContext) -> list[str]:
    """Environment FlagGems reads at import (vendor, LibTuner cache, FlagTune switch), its
    package sources on sys.path, and the pytest arguments for the upstream node."""
    options = flaggems.Options.from_json(ctx.spec.flaggems)
    if ctx.backend.flaggems_vendor and "GEMS_VENDOR" not in os.environ:
        os.environ["GEMS_VENDOR"] = ctx.backend.flaggems_vendor  # skips FlagGems' hang-prone CLI probe
    url = flaggems.libtuner_db_url(options.libtuner_cache, ctx.run_dir)
    if url is not None:
        os.environ["FLAGGEMS_DB_URL"] = url
    os.environ["USE_FLAGTUNE"] = options.flagtune
    found = flaggems.package_dir(Path(options.root))
    if found is not None:
        sys.path.insert(0, str(found[1]))  # the benchmark belongs with its own checkout's package
    return flaggems_plugin.child_args(options, ctx.spec.dtypes, ctx.spec.color)


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    ctx = RunContext.load(run_dir)
    results_plugin = results.ResultsPlugin(ctx)
    plugins = [
        runinfo.RunInfoPlugin(ctx),
        seeds.SeedsPlugin(ctx),
        shapes.ShapesPlugin(ctx),
        autotune.AutotunePlugin(ctx),
        ir.IRPlugin(ctx),
        timing.TimingPlugin(ctx),
        results_plugin,
    ]
    if ctx.spec.flaggems is not None:
        args = prepare_flaggems(ctx)
        plugins.append(flaggems_plugin.FlagGemsPlugin(ctx, results_plugin))
        return int(pytest.main(args, plugins=plugins))
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
