"""IR: per shape, the TTGIR of the compiled variants that actually ran (see harness.measure.ir).

Needs Triton's launch hook; where the compiler lacks it (older Triton) or compiles nothing (the
interpreter), the run goes on and run.json says IR collection was off, and why."""

from __future__ import annotations

import atexit

from harness.core import rundir
from harness.core.spec import ONLY
from harness.measure import ir


def _install_launch_hook(callback) -> str | None:
    """Install `callback` as a launch-enter hook; the reason it cannot be, or None."""
    try:
        from triton import knobs
    except ImportError:
        return "this Triton has no triton.knobs (launch hooks arrived in Triton 3.4)"
    runtime = knobs.runtime
    current = getattr(runtime, "launch_enter_hook", None)
    if hasattr(current, "add"):  # a HookChain (Triton >= 3.5)
        current.add(callback)
        return None
    if not hasattr(type(runtime), "launch_enter_hook") and not hasattr(runtime, "launch_enter_hook"):
        return "this Triton has no knobs.runtime.launch_enter_hook"
    if current is None:
        runtime.launch_enter_hook = callback
    else:
        def chained(metadata, _previous=current):
            _previous(metadata)
            callback(metadata)

        runtime.launch_enter_hook = chained
    return None


class IRPlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.collector: ir.IRCollector | None = None

    def pytest_configure(self, config):
        if not self.ctx.spec.ir:
            return self._off("turned off (--no-ir)")
        if not self.ctx.spec.passes:
            return self._off(ONLY[self.ctx.spec.only])
        if not self.ctx.backend.triton_driver:
            return self._off(f"backend '{self.ctx.backend.name}' compiles no kernels")
        limits = self.ctx.backend.occupancy_limits() if self.ctx.backend.occupancy_limits else None
        # A passes-only run's timings are for no comparison: its statistics may be extracted beside them.
        collector = ir.IRCollector(self.ctx.run_dir, limits=limits, background_stats=self.ctx.spec.token_timing)
        reason = _install_launch_hook(collector.on_launch)
        if reason is not None:
            return self._off(reason)
        self._exclude_sweeps(collector)
        self.collector = collector
        ir.write_status(self.ctx.run_dir, True, "launch hook + compiled-kernel scan")
        atexit.register(collector.write)  # a crash in a later case still leaves this IR

    def _off(self, reason: str) -> None:
        self.ctx.say(f"IR collection off: {reason}")
        ir.write_status(self.ctx.run_dir, False, reason)

    @staticmethod
    def _exclude_sweeps(collector) -> None:
        # Launches inside an autotune sweep are candidates being timed, not what ran.
        from triton.runtime.autotuner import Autotuner

        original = Autotuner._bench

        def bench(self, *args, **kwargs):
            collector.sweeping += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                collector.sweeping -= 1

        Autotuner._bench = bench

    def pytest_zl_case_started(self, case_id, shape_label):
        if self.collector is not None and shape_label is not None:
            self.collector.shape = shape_label

    def pytest_runtest_teardown(self, item):
        if self.collector is not None:
            self.collector.write(final=False)

    def pytest_sessionfinish(self, session):
        if self.collector is None:
            return
        self.collector.write()
        atexit.unregister(self.collector.write)  # the exit-time dump is for crashes only
        # The kernels kept for their statistics are done with: released while their driver is still
        # the active one (a CompiledKernel unloads its module from the active driver as it goes).
        self.collector.compiled.clear()
        used = self.collector.used()
        files = sum(len(v) for v in used.values())
        self.ctx.say(f"IR: {len(self.collector.variants)} variants compiled, {files} launched variant files "
                     f"under {self.collector.root}")
        if self.collector.unreadable:
            self.ctx.say(f"IR: {self.collector.unreadable} launches had unreadable metadata and were not counted")
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"ir": {
            "variants_compiled": len(self.collector.variants), "files_written": files,
            "unreadable_launches": self.collector.unreadable,
            # What the kernel statistics could use: a field a missing tool would answer says "not available".
            "kernel_stats": {"tools": self.collector.tools, "occupancy_limits": self.collector.limits}}}})
