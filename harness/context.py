"""State shared by the child's plugins: the spec read from the run dir, the backend, the
operator, and what happened during the test now running (markers, configs used)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import backends
from harness import registry, rundir, shapes
from harness import spec as spec_mod
from ops import Operator


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def id(self) -> str:
        return f"{self.dtype}-{shapes.label(self.shape)}"


@dataclasses.dataclass
class RunContext:
    run_dir: Path
    spec: spec_mod.RunSpec
    backend: backends.Backend
    operator: Operator
    cases: list[Case]
    # Rows measured so far (the results plugin appends; run info summarizes).
    rows: list[dict] = dataclasses.field(default_factory=list)
    # Per-test state, reset by the results plugin before each test.
    markers: list[str] = dataclasses.field(default_factory=list)
    configs: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> RunContext:
        run_spec = spec_mod.read(run_dir)
        backend = backends.get(run_spec.backend)
        operator, _ = registry.load(run_spec.op, run_spec.ops_paths)
        _, shape_list, dtypes = shapes.resolve(run_dir / rundir.SHAPES_YAML, operator.name, ())
        cases = [Case(operator.name, d, tuple(s)) for d in dtypes or run_spec.dtypes for s in shape_list]
        return cls(run_dir, run_spec, backend, operator, cases)

    def begin_case(self) -> None:
        self.markers = []
        self.configs = {}

    def mark(self, marker: str) -> None:
        """A degraded-measurement marker for the current row (printed under the row's line)."""
        if marker not in self.markers:
            self.markers.append(marker)
