"""Autotune: record the chosen config per kernel per key (record mode) or inject the recorded
ones (replay mode). The mechanics live in harness.measure.tuning; this plugin wires them to the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core import identity, rundir
from harness.measure import precompile, tuning

CONFIG_SEPARATOR = " | "


class AutotunePlugin:
    def __init__(self, ctx, unheld=lambda fn: fn):
        self.ctx = ctx
        # A sweep's precompile, CPU-bound, runs with the device gate let go (plugins.device_gate).
        self.unheld = unheld
        self.patch: tuning.AutotunePatch | None = None
        self.precompiler: precompile.Precompiler | None = None
        self.off: str | None = None  # why there is no precompile
        self.request_log: precompile.RequestLog | None = None  # a record's compiles, for the other side
        self.ahead: precompile.Ahead | None = None  # a passes step's: its record's compiles, started early

    def _set_up_pool(self) -> None:
        """The run's precompile pool, once: none where precompile is off; for a record, which sweeps,
        forked now if the device is untouched (a replay injects: its pool, for a key the record lacks, is
        spawned then, as is a record's whose device something initialized first)."""
        if self.precompiler is not None or self.off is not None:
            return
        if not self.ctx.spec.precompile:
            self.off = "turned off (--no-precompile)"
        elif not self.ctx.backend.compiles_kernels:
            self.off = f"backend '{self.ctx.backend.name}' compiles no kernels"
        else:
            spec = self.ctx.spec
            self.precompiler = precompile.Precompiler()
            # A passes step (token-timed: the CPU its compiles take from the rows costs no verdict) replaying
            # a record that wrote its compiles: the other side's, compiled here ahead of the rows.
            ahead, recorded_defaults = (precompile.read_requests(Path(spec.replay_from) / precompile.REQUESTS_FILE)
                                        if spec.mode == "replay" and spec.token_timing else ([], {}))
            if (spec.mode == "record" or ahead) and not self.ctx.backend.device_touched():
                self.precompiler.start()
            if spec.mode == "record":
                self.request_log = precompile.RequestLog()
                self.request_log.install()
            if ahead:
                self.ahead = precompile.Ahead(self.precompiler, ahead, recorded_defaults)
                self.ahead.start()
                self.ahead.install()
                self.ctx.say(f"precompile: the record's {len(ahead)} compiles started ahead of the rows over "
                             f"{self.precompiler.workers} processes ({self.precompiler.method})")

    # Before the checkout's conftests load: FlagGems' initializes the device at import, after which the
    # pool could only be spawned (each worker importing torch and Triton anew: ~4 s before a first compile).
    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(self, early_config, parser, args):
        self._set_up_pool()

    # First: where nothing came before (a run without conftests), the pool is forked before any other
    # plugin's configure touches the device.
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        spec = self.ctx.spec
        records_dir = self.ctx.run_dir / rundir.RECORDS_DIR
        self._set_up_pool()
        if self.off:
            self.ctx.say(f"precompile off: {self.off}")
        common = dict(mark=self.ctx.mark, chosen=self._chosen, case=lambda: self.ctx.case_id,
                      host_autotune=not self.ctx.backend.triton_driver, progress=self._progress(),
                      precompile=self.unheld(self.precompiler.run) if self.precompiler else None)
        if spec.mode == "record":
            rundir.make_dir(records_dir)
            rundir.atomic_write_json(records_dir / "meta.json", {
                "format": tuning.RECORD_FORMAT, "op": spec.op, "backend": spec.backend,
                "versions": identity.versions()})
            store = tuning.RecordStore(tuning.records_path(self.ctx.run_dir, spec.op), spec.op)
            # A parallel sweep's merged picks are injected, and recorded as this run's own.
            preset = tuning.load_records(Path(spec.preset_records)) if spec.preset_records else None
            self.patch = tuning.AutotunePatch("record", store=store, records=preset,
                                              records_source=f"autotune records {spec.preset_records}", **common)
        else:
            source = tuning.records_path(spec.replay_from, spec.op)
            self.patch = tuning.AutotunePatch("replay", records=tuning.load_records(source),
                                              records_source=f"autotune records {source}", **common)
        self.patch.install()

    def install_on(self, tuner_cls) -> None:
        """Hook a library's own autotuner class too (FlagGems' LibTuner, once its package is
        imported; the runner hands this plugin to the FlagGems plugin)."""
        self.patch.install(tuner_cls)

    def _progress(self):
        def write(line: str) -> None:
            self.ctx.say(f"  {line}")  # live, whatever pytest is capturing

        return write

    def _chosen(self, kernel: str, config: str) -> None:
        # A kernel launched under several keys in one case (two sizes per call, say) ran with each
        # of their configs: the row names them all, in launch order, not the last one alone.
        seen = self.ctx.configs.get(kernel)
        if seen is None:
            self.ctx.configs[kernel] = config
        elif config not in seen.split(CONFIG_SEPARATOR):
            self.ctx.configs[kernel] = seen + CONFIG_SEPARATOR + config

    def pytest_sessionfinish(self, session):
        if self.patch is None:
            return
        self.patch.uninstall()
        if self.precompiler is not None:
            for hook in (self.request_log, self.ahead):
                if hook is not None:
                    hook.uninstall()
            self.precompiler.close()
            facts = {**self.precompiler.totals, "workers": self.precompiler.workers,
                     "pool": self.precompiler.method}
            if self.request_log is not None:
                self.request_log.write(self.ctx.run_dir / precompile.REQUESTS_FILE)
                facts["requests_written"] = len(self.request_log.requests)
                if self.request_log.errors:
                    facts["requests_not_written"] = dict(self.request_log.errors)
            if self.ahead is not None:
                facts["ahead"] = self.ahead.facts()
        else:
            facts = {"off": self.off}
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON,
                          {"observed": {"autotune": {"mode": self.patch.mode, **self.patch.counts,
                                                     "precompile": facts, "sweeps": self.patch.sweeps}}})

