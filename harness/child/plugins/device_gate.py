"""Device gate: a run that shares its device with others of its A/B (its spec's `device_gate`,
harness.measure.device_gate). A timed run holds the gate while a row is timed (the timing plugin asks
for `timing`); a token-timing run beside the timing holds it while each case runs and lets it go (its queued
work done) while Triton compiles and while an autotune sweep's configs precompile, and gives its cached
device memory back after each case. run.json
`observed.device_gate` says how often and how long the run waited for the device and held it."""

from __future__ import annotations

import contextlib

import pytest

from harness.core import rundir
from harness.measure import device_gate


class DeviceGatePlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.beside = ctx.spec.token_timing
        self.gate = device_gate.open_gate(ctx.spec.device_gate, self.beside, settle=self._settle,
                                          owner=str(ctx.run_dir))
        self._compiles: device_gate.CompileRelease | None = None

    def _settle(self) -> None:
        """What this run queued on the device ends before a timed row takes it (a compile lets the gate go
        between a case's kernels)."""
        backend = self.ctx.backend
        if backend.device_touched():
            import torch

            getattr(torch, backend.torch_device_type).synchronize()

    def timing(self):
        """Held while a timed run times a row; nothing beside (its whole case holds it) or without a gate."""
        return self.gate.held() if self.gate is not None and not self.beside else contextlib.nullcontext()

    def unheld(self, fn):
        """`fn` run with the gate let go (an autotune sweep's precompile: CPU-bound)."""
        if self.gate is None:
            return fn

        def call(*args, **kwargs):
            with self.gate.released():
                return fn(*args, **kwargs)

        return call

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        if self.gate is None or not self.beside:
            return (yield)
        if self.ctx.backend.compiles_kernels and self._compiles is None:
            self._compiles = device_gate.CompileRelease(self.gate)
        with self.gate.held():
            if self._compiles is not None:
                self._compiles.install()  # in front of the hooks there now: let go before they wait
            try:
                return (yield)
            finally:
                if self._compiles is not None:
                    self._compiles.uninstall()
                self._free_cached_memory()

    def _free_cached_memory(self) -> None:
        """A run beside others gives its cached device memory back after each case, before it lets the gate go:
        the others' cases then find the device's memory as free as this case found it, not held by its
        allocator's cache (several records at once, --record-jobs, each holding its largest case's inputs)."""
        backend = self.ctx.backend
        if backend.torch_device_type != "cpu" and backend.device_touched():
            import torch

            self._settle()
            getattr(torch, backend.torch_device_type).empty_cache()

    def pytest_sessionfinish(self, session):
        if self.gate is None:
            return
        role = "beside the timing: held while its cases ran, not while it compiled" if self.beside else \
            "timed: held while each row was timed"
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"device_gate": {
            "path": str(self.gate.path), "role": role, **self.gate.facts()}}})

    def pytest_unconfigure(self, config):
        if self.gate is not None:
            self.gate.close()
            self.gate = None
