"""Shapes: turn the run dir's shapes.yaml (resolved by the session) into one test per
(dtype, shape), and hand the test its case and the run context."""

import pytest


class ShapesPlugin:
    def __init__(self, ctx):
        self.ctx = ctx

    def pytest_generate_tests(self, metafunc):
        if "case" in metafunc.fixturenames:
            metafunc.parametrize("case", self.ctx.cases, ids=[c.id for c in self.ctx.cases])

    @pytest.fixture
    def run_context(self):
        return self.ctx
