"""Autotune: record the chosen config per kernel per key (record mode) or inject the recorded
ones (replay mode). The mechanics live in harness.measure.tuning; this plugin wires them to the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core import identity, rundir
from harness.measure import precompile, tuning

CONFIG_SEPARATOR = " | "


class AutotunePlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.patch: tuning.AutotunePatch | None = None
        self.precompiler: precompile.Precompiler | None = None
        self.off: str | None = None  # why there is no precompile

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
            self.precompiler = precompile.Precompiler()
            if self.ctx.spec.mode == "record" and not self.ctx.backend.device_touched():
                self.precompiler.start()

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
                      precompile=self.precompiler.run if self.precompiler else None)
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
            self.precompiler.close()
            facts = {**self.precompiler.totals, "workers": self.precompiler.workers,
                     "pool": self.precompiler.method}
        else:
            facts = {"off": self.off}
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON,
                          {"observed": {"autotune": {"mode": self.patch.mode, **self.patch.counts,
                                                     "precompile": facts, "sweeps": self.patch.sweeps}}})

