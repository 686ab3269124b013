"""The pytest child: `python -m harness.child RUN_DIR`. Reads the spec from the run dir and runs
the cases under our plugins, one job each."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from harness.child import hookspec
from harness.child.console import Console
from harness.child.context import RunContext
from harness.child.plugins import (
    autotune,
    device_gate,
    gpu_state,
    heap,
    ir,
    results,
    runinfo,
    seeds,
    shapes,
    timing,
    torch_state,
)
from harness.child.plugins import flaggems as flaggems_plugin
from harness.core import launch, rundir
from harness.core import spec as spec_mod
from harness.core.outcome import INCOMPLETE, Outcome
from harness.measure import tuning
from harness.providers import flaggems, registry
from harness.providers import shapes as shapes_mod

HERE = Path(__file__).resolve().parent


def prepare_flaggems(ctx: RunContext) -> list[str]:
    """Environment FlagGems reads at import (vendor, LibTuner cache, FlagTune switch), its
    package sources on sys.path, and the pytest arguments for the upstream node."""
    options = ctx.spec.flaggems
    if ctx.backend.flaggems_vendor and "GEMS_VENDOR" not in os.environ:
        os.environ["GEMS_VENDOR"] = ctx.backend.flaggems_vendor  # skips FlagGems' hang-prone CLI probe
    url = flaggems.libtuner_db_url(options.libtuner_cache, ctx.run_dir)
    if url is not None:
        os.environ["FLAGGEMS_DB_URL"] = url
    flaggems.rebind_libtuner_cache(url)  # a package the warm worker imported opened another
    os.environ["USE_FLAGTUNE"] = options.flagtune
    found = flaggems.package_dir(Path(options.root))
    if found is not None:
        sys.path.insert(0, str(found[1]))  # the benchmark belongs with its own checkout's package
    return flaggems_plugin.child_args(options, ctx.spec.dtypes, ctx.spec.color)


SIGNAL_REASONS = {signal.SIGINT: "interrupted (SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}


def stop_on_signals(ctx: RunContext) -> None:
    """SIGINT and SIGTERM end the run through pytest's interrupt path (results and outcome are
    written, the summary says INCOMPLETE); a repeated signal does not cut that short (the parent
    kills outright if the child takes too long)."""

    def handler(signum, frame):
        ctx.stop(SIGNAL_REASONS[signum], 128 + signum)

    for signum in SIGNAL_REASONS:
        signal.signal(signum, handler)


def say_stopped(console: Console, run_dir: Path, line: str, outcome: Outcome) -> None:
    """A run stopped at once: `line` to the user, and the outcome into run.json where it can still
    be written (a run dir deleted under the run: the line says it all)."""
    console.say(line)
    try:
        rundir.record_outcome(run_dir, outcome)
    except OSError:
        pass


class StopGuard:
    """Faults after which the run cannot go on, wherever they are met (a test writing records, a
    hook writing results): an immediate exit with the outcome recorded. A write that failed for good
    (rundir.WriteFault: a full disk, a file-size limit, EIO): one line to the user, the outcome into
    the space the run dir kept for it (rundir.RESERVE), exit 75. Files written
    before are complete (atomic writes), and anything written from here on could only fail or come
    out partial. Records found corrupt only once their kernel runs (tuning.RecordsCorrupt): bad
    input, before the config is injected into anything. The run dir removed under the run: the
    parent says so."""

    def __init__(self, console: Console, run_dir: Path):
        self.console = console
        self.run_dir = run_dir
        self.ctx: RunContext | None = None

    def stopped_outcome(self, reason: str, code: int) -> Outcome:
        ctx = self.ctx
        return Outcome(INCOMPLETE, rows_done=len(ctx.rows) if ctx else 0,
                       rows_planned=(len(ctx.cases) or None) if ctx else None, reason=reason,
                       running_case=(ctx.case_id or None) if ctx else None, exit_code=code)

    def stop_if_fatal(self, exc: BaseException | None) -> None:
        if isinstance(_cause(exc, OSError), FileNotFoundError) and not self.run_dir.is_dir():
            # The run dir was removed under the run: nothing more can be kept, and the parent, which
            # finds it gone, says so in its last line.
            os._exit(rundir.EXIT_INCOMPLETE)
        fault = rundir.write_fault(exc) if exc is not None else None
        if fault is not None:
            rundir.release_space(self.run_dir)
            say_stopped(self.console, self.run_dir, f"error: {fault}",
                        self.stopped_outcome(fault.reason, rundir.EXIT_DISK_FULL))
            os._exit(rundir.EXIT_DISK_FULL)
        corrupt = _cause(exc, tuning.RecordsCorrupt)
        if corrupt is not None:
            say_stopped(self.console, self.run_dir, f"error: {corrupt}",
                        self.stopped_outcome(f"bad input: {corrupt}", rundir.EXIT_BAD_INPUT))
            os._exit(rundir.EXIT_BAD_INPUT)

    def pytest_exception_interact(self, node, call, report):
        self.stop_if_fatal(call.excinfo.value if call.excinfo else None)

    def pytest_runtest_makereport(self, item, call):
        self.stop_if_fatal(call.excinfo.value if call.excinfo else None)

    def pytest_internalerror(self, excrepr, excinfo):
        self.stop_if_fatal(excinfo.value)


class ChildHooks:
    """Declares the child's own hooks (harness.child.hookspec) to pytest."""

    @staticmethod
    def pytest_addhooks(pluginmanager):
        pluginmanager.add_hookspecs(hookspec)


def build_plugins(ctx: RunContext, guard: StopGuard) -> list:
    """The child's plugins, wired here and only here: a plugin using another's service gets it as
    an argument, and a case's start reaches every plugin through a declared hook; none reads what
    another left on the context, so the order of this list does not matter
    (tests/test_child_wiring.py runs it reversed)."""
    results_plugin = results.ResultsPlugin(ctx)
    gate_plugin = device_gate.DeviceGatePlugin(ctx)
    timing_plugin = timing.TimingPlugin(ctx, gate_plugin.timing)
    autotune_plugin = autotune.AutotunePlugin(ctx, gate_plugin.unheld)
    plugins = [ChildHooks(), guard, runinfo.RunInfoPlugin(ctx), seeds.SeedsPlugin(ctx), shapes.ShapesPlugin(ctx),
               autotune_plugin, ir.IRPlugin(ctx), timing_plugin, results_plugin, gpu_state.GpuStatePlugin(ctx),
               torch_state.TorchStatePlugin(ctx), heap.HeapPlugin(ctx), gate_plugin]
    if ctx.spec.flaggems is not None:
        plugins.append(flaggems_plugin.FlagGemsPlugin(ctx, results_plugin, timing_plugin.measure, autotune_plugin))
    return plugins


def _cause(exc: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """`exc` itself or the first of its cause or context chain that is a `kind`."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    console = Console.split_stdout()
    guard = StopGuard(console, run_dir)
    try:
        try:
            ctx = RunContext.load(run_dir, console.say)
        except (spec_mod.SpecError, registry.OperatorNotFound, shapes_mod.ShapeFileError) as exc:
            # e.g. an operator module that broke since its record
            say_stopped(console, run_dir, f"error: {exc}",
                        guard.stopped_outcome(f"bad input: {str(exc).splitlines()[0][:300]}", rundir.EXIT_BAD_INPUT))
            return rundir.EXIT_BAD_INPUT
        guard.ctx = ctx
        stop_on_signals(ctx)
        plugins = build_plugins(ctx, guard)
        # Our cases, or a checkout's benchmark with its own conftest, under our plugins only. A plugin the
        # user's env autoloads has no business here (pytest-randomly would reorder and reseed the cases) and
        # costs every step its import and the rewrite of its asserts (hypothesis, anyio, xdist, cov, mock,
        # timeout, benchmark: 3-5 s of a FlagGems step on an H200 host). A checkout that needs a plugin
        # names it in its conftest (`pytest_plugins`), which still loads.
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        if ctx.spec.flaggems is not None:
            return int(pytest.main(prepare_flaggems(ctx), plugins=plugins))
        args = [
            str(HERE / "cases.py"),
            "-c", str(HERE / "child.ini"),
            "--rootdir", str(HERE),
            f"--color={'yes' if ctx.spec.color else 'no'}",
            "-q", "--tb=short", "-rfE",
        ]
        return int(pytest.main(args, plugins=plugins))
    except OSError as exc:
        guard.stop_if_fatal(exc)
        raise
    finally:
        console.close()


def entry(argv: list[str]) -> int:
    """The child process's whole life, exec'd (harness.child.__main__) or forked by a warm step
    (harness.sessions.run): the run, and whatever it left running ended."""
    # What an operator starts and leaves running (a server, a `sleep`, one that called setsid) is ours to
    # end with the run, not init's to keep.
    launch.adopt_orphans()
    try:
        return main(argv)
    except KeyboardInterrupt:
        # A Ctrl-C before the run's own signal handlers are in place (importing an operator module):
        # the parent, which got it too, says so and records the outcome; a traceback here would only
        # bury that.
        return 128 + signal.SIGINT
    finally:
        launch.end_orphans()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
