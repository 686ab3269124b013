"""Timing: hands each test a `measure_pair` bound to the run's timer policy, and stops the
session when a capture attempt poisoned the accelerator context."""

import pytest

from harness.measure.timers import CapturePoisoned, Timer


class TimingPlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.timer: Timer | None = None
        self.poisoned = None

    def pytest_configure(self, config):
        spec = self.ctx.spec
        self.timer = Timer(self.ctx.backend, spec.timer, spec.warmup_ms, spec.rep_ms, self.ctx.mark)

    def measure(self, test_name, fns):
        """(test name, {side: fn}) -> Timed: the test's `measure_pair`, and what the runner hands
        the FlagGems plugin for upstream's `get_latency`."""
        try:
            return self.timer.measure_pair(test_name, fns)
        except CapturePoisoned as exc:
            self.poisoned = str(exc)
            raise

    @pytest.fixture
    def measure_pair(self):
        return self.measure

    def pytest_runtest_teardown(self, item):
        if self.poisoned is not None:
            item.session.shouldstop = f"capture poisoned the accelerator context: {self.poisoned}"
