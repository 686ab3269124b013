"""State shared by the child's plugins: the spec read from the run dir, the backend, the
operator, and what happened during the test now running (markers, configs used)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import backends
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.core.outcome import Outcome
from harness.providers import registry, shapes
from ops import Operator

# A row skipped because its backend computes its dtype wrongly whatever the kernel (RunContext.dtype_problem).
DTYPE_MISCOMPUTED = "BACKEND_MISCOMPUTES_DTYPE"


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
    # A built-in operator and its cases; None and [] for a FlagGems-style benchmark, whose cases
    # appear as its input iterator yields them.
    operator: Operator | None
    cases: list[Case]
    # Rows measured so far (the results plugin appends; run info summarizes).
    rows: list[dict] = dataclasses.field(default_factory=list)
    # Per-case state, reset when a case begins.
    case_id: str = ""
    # The case begun whose row has not landed yet: None between cases (the last row written is
    # a finished case, not a running one).
    running_case: str | None = None
    markers: list[str] = dataclasses.field(default_factory=list)
    configs: dict[str, str] = dataclasses.field(default_factory=dict)
    # The part of the case now running where an exception would be the operator's own ("inputs",
    # "baseline", "candidate"): a failed row's error says which raised.
    running: str | None = None
    # Lines for the user (harness.child.console); pytest's own output goes to run.log only.
    say: Callable[..., None] = print
    # Why the run stopped early (a signal) and the exit code that says so, set by the child; the
    # outcome written at the end.
    stop_reason: str | None = None
    stop_code: int | None = None
    outcome: Outcome | None = None
    # Backend.dtype_problem's answer per dtype: probed once per run (see dtype_problem).
    _dtype_problems: dict[str, str | None] = dataclasses.field(default_factory=dict, init=False, repr=False)
    # A stop that came while a row was landing waits for the row to be whole (see stop).
    _landing: bool = dataclasses.field(default=False, init=False, repr=False)
    _stop_waiting: bool = dataclasses.field(default=False, init=False, repr=False)

    @classmethod
    def load(cls, run_dir: Path, say: Callable[..., None] = print) -> RunContext:
        """The context of the run in `run_dir`; SpecError, OperatorNotFound or ShapeFileError
        (one line each) when it cannot be run."""
        run_spec = spec_mod.read(run_dir)
        backend = backends.get(run_spec.backend)
        if run_spec.flaggems is not None:
            return cls(run_dir, run_spec, backend, None, [], say=say)
        # A skipped module is the session's to say on the terminal (it resolved the op before this
        # child started); here it goes to run.log only, or the user reads it twice.
        operator, _ = registry.load(run_spec.op, run_spec.ops_paths,
                                    warn=lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
        _, shape_list, dtypes = shapes.resolve(run_dir / rundir.SHAPES_YAML, operator.name, ())
        cases = [Case(operator.name, d, tuple(s)) for d in dtypes or run_spec.dtypes for s in shape_list]
        if run_spec.cases is not None:  # a replay of some of its record's cases
            cases = [c for c in cases if c.id in set(run_spec.cases)]
        return cls(run_dir, run_spec, backend, operator, cases, say=say)

    @property
    def planned_ids(self) -> list[str] | None:
        """The ids of the cases this run must report, a row each: its cases, or where those are known
        only as they run (a FlagGems benchmark) the ones its spec names (a replay of some cases); None
        where neither says."""
        if self.cases:
            return [case.id for case in self.cases]
        return None if self.spec.cases is None else list(self.spec.cases)

    def selects(self, case_id: str) -> bool:
        """Whether this run times the case: every case, or one its spec names."""
        return self.spec.cases is None or case_id in self.spec.cases

    def begin_case(self, hook, case_id: str, shape_label: str | None = None) -> None:
        """Per-case state reset, then every plugin told through `hook` (pytest's config.hook;
        harness.child.hookspec.pytest_zl_case_started)."""
        self.case_id = case_id
        self.running_case = case_id
        self.markers = []
        self.configs = {}
        self.running = None
        # Kept current on disk: a run killed outright (SIGKILL, a batch timeout) still says
        # which case it was in.
        rundir.merge_json(self.run_dir / rundir.RUN_JSON, {"observed": {"running_case": case_id}}, durable=False)
        hook.pytest_zl_case_started(case_id=case_id, shape_label=shape_label)

    def stop(self, reason: str, code: int | None = None) -> None:
        """A stop signal: end the run through pytest's interrupt path (KeyboardInterrupt), once; a
        repeated signal does not cut that path short. During `landing` the interrupt waits for its
        end, so rows, the running case and results.json never disagree."""
        if self.stop_reason is not None:
            return
        self.stop_reason, self.stop_code = reason, code
        if self._landing:
            self._stop_waiting = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def landing(self):
        """Where a case's row is added and the case ends, in memory and on disk: a stop signal
        that comes within is raised once it is done."""
        self._landing = True
        try:
            yield
        finally:
            self._landing = False
            if self._stop_waiting:
                self._stop_waiting = False
                raise KeyboardInterrupt

    def end_case(self) -> None:
        """The running case's row landed: no case runs until the next begins. On disk before the
        row itself, so that run.json never names as running a case whose row results.json holds
        (a kill between the two writes leaves it naming none)."""
        self.running_case = None
        rundir.merge_json(self.run_dir / rundir.RUN_JSON, {"observed": {"running_case": None}}, durable=False)

    def dtype_problem(self, dtype: str) -> str | None:
        """Why this backend computes `dtype` wrongly (Backend.dtype_problem), probed once per run and
        said once, as a known limitation of the backend; None where it computes it right."""
        if self.backend.dtype_problem is None:
            return None
        if dtype not in self._dtype_problems:
            problem = self._dtype_problems[dtype] = self.backend.dtype_problem(dtype)
            if problem:
                self.say(f"known limitation of backend '{self.backend.name}': {problem}; its {dtype} rows are "
                         f"SKIPPED (marker {DTYPE_MISCOMPUTED}), not failed")
        return self._dtype_problems[dtype]

    def mark(self, marker: str) -> None:
        """A degraded-measurement marker for the current row (printed under the row's line)."""
        if marker not in self.markers:
            self.markers.append(marker)
