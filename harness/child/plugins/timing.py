"""Timing: hands each test a `measure_pair` bound to the run's timer policy and L2 mode, puts the
per-kernel attribution of the side under test on its row (`row["kernels"]`), and stops the
session when a capture attempt poisoned the accelerator context.

Where the backend has no device profiler, rows carry no `kernels` and one line per run says why
(also in run.json `observed.kernel_attribution`)."""

import contextlib
from pathlib import Path

import pytest

from harness.core import rundir
from harness.core.results import ResultsError, read_results
from harness.core.spec import ONLY
from harness.measure.timers import (
    GRAPH_SAMPLE_MS,
    STOPPING_TIMERS,
    TOKEN_BUDGET_MS,
    TOKEN_SAMPLE_MS,
    WINDOWED_TIMERS,
    CapturePoisoned,
    GraphSizes,
    Timed,
    Timer,
)
from reports.compare import control_cases


def record_rows(record_dir: Path) -> tuple[list, str | None]:
    """(the rows of the record at `record_dir`, None), or ([], why they could not be read)."""
    try:
        return read_results(Path(record_dir)), None
    except ResultsError as exc:
        return [], f"its record's rows could not be read: {exc}"


def recorded_sizes(rows: list, unread: str | None = None) -> tuple[dict[str, dict[str, GraphSizes]], str | None]:
    """({case id: {side: its graph sizes}} from a record's rows, the reason there are none or None; `unread`:
    why its rows could not be read (record_rows). A case id on more than one row is left out: its rows would
    not say which is which."""
    if unread is not None:
        return {}, unread
    found: dict[str, dict[str, GraphSizes]] = {}
    seen: set[str] = set()
    for row in rows:
        if row.case in seen:
            found.pop(row.case, None)
            continue
        seen.add(row.case)
        sides = {side: sizes for side, summary in (row.samples or {}).items()
                 if isinstance(summary, dict) and (sizes := GraphSizes.from_json(summary.get("graph_sizes")))}
        if sides:
            found[row.case] = sides
    return found, None if found else "its record's rows carry no graph sizes"


class TimingPlugin:
    def __init__(self, ctx, timing=contextlib.nullcontext):
        self.ctx = ctx
        # Held around each row's timing: the device gate of a run that shares its device (plugins.device_gate).
        self.timing = timing
        self.timer: Timer | None = None
        self.poisoned = None
        self.kernels: list[dict] | None = None
        self.case_id: str | None = None
        # A replay's graphs are sized by its record's (harness.measure.timers.GraphSizes), case by case.
        self.sizes: dict[str, dict[str, GraphSizes]] = {}
        self.sizes_missing: str | None = None
        # A timing-only replay's cases whose torch baseline it times (reports.compare.control_cases); None: all.
        self.controls: set[str] | None = None
        self.baselines_left = 0

    def pytest_configure(self, config):
        spec, backend = self.ctx.spec, self.ctx.backend
        warmup_ms, rep_ms = TOKEN_BUDGET_MS if spec.token_timing else (spec.warmup_ms, spec.rep_ms)
        self.timer = Timer(backend, spec.timer, warmup_ms, rep_ms, self.ctx.mark, l2=spec.l2,
                           windows=spec.windows, attribute=spec.passes,
                           max_noise=0.0 if spec.token_timing else spec.max_noise,
                           sample_ms=TOKEN_SAMPLE_MS if spec.token_timing else GRAPH_SAMPLE_MS)
        if not spec.passes:
            facts = {"recorded": False, "reason": ONLY[spec.only]}
        elif backend.profiler_activity:
            facts = {"recorded": True, "source": f"torch.profiler ({backend.profiler_activity})"}
        else:
            reason = f"backend '{backend.name}' has no device profiler"
            self.ctx.say(f"per-kernel attribution not recorded: {reason}; rows carry no 'kernels'")
            facts = {"recorded": False, "reason": reason}
        observed = {"kernel_attribution": facts}
        if spec.token_timing:
            # Said where the rows are read: their timings are the token budget's, for no comparison.
            observed["timing"] = {"warmup_ms": warmup_ms, "rep_ms": rep_ms,
                                  "reason": f"{ONLY[spec.only]}: its timings are for no comparison"}
        if spec.windows > 1 and self.timer.timer not in WINDOWED_TIMERS:
            # Said, not silently dropped.
            reason = f"the {self.timer.timer} timer takes no windows"
            self.ctx.say(f"--windows {spec.windows} not applied: {reason}; each side timed in one window")
            observed["windows"] = {"applied": False, "reason": reason}
        if spec.max_noise and self.timer.timer not in STOPPING_TIMERS:
            reason = f"the {self.timer.timer} timer samples in one profile"
            self.ctx.say(f"--max-noise not applied: {reason}; each side times its whole --rep-ms budget")
            observed["max_noise"] = {"applied": False, "reason": reason}
        if spec.replay_from is not None:
            rows, unread = record_rows(Path(spec.replay_from))
            if self.timer.timer == "graph":
                self.sizes, self.sizes_missing = recorded_sizes(rows, unread)
            if spec.only == "timing" and unread is None:
                self.controls = control_cases(rows)
                observed["controls"] = {"cases": len(self.controls), "of": len({r.case for r in rows})}
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": observed})

    def measure(self, test_name, fns, relocate=None, carried=True):
        """(test name, {side: fn}[, relocate]) -> Timed: the test's `measure_pair`, and what the runner
        hands the FlagGems plugin for upstream's `get_latency` (one side per call, the candidate last;
        `carried`: whether the row carries this call's kernels). Only the side whose kernels the row
        carries is attributed: the candidate, or a call's one side. The baseline's profiler pass was
        half of every passes step's profiling, for kernels no report reads. A baseline timed with its
        candidate (the same call's, or a FlagGems call before its candidate's: not `carried`) is left out
        where times_baseline says so: the Timed then lacks it."""
        attributed = ("candidate",) if "candidate" in fns else fns if carried else ()
        if "baseline" in fns and ("candidate" in fns or not carried) and not self.times_baseline():
            fns = {side: fn for side, fn in fns.items() if side != "baseline"}
            self.baselines_left += 1
            if not fns:
                return Timed({}, self.timer.timer)
        try:
            with self.timing():
                timed = self.timer.measure_pair(test_name, fns, relocate, attributed, self.sizes.get(self.case_id))
        except CapturePoisoned as exc:
            self.poisoned = str(exc)
            raise
        sides = timed.measurements
        self.kernels = (sides.get("candidate") or list(sides.values())[-1]).kernels
        return timed

    def times_baseline(self) -> bool:
        """Whether the case under way times its torch baseline beside its candidate: in a timing-only
        replay, only where a process factor can read it (control_cases)."""
        return self.controls is None or self.case_id in self.controls

    @pytest.fixture
    def measure_pair(self):
        return self.measure

    def pytest_zl_case_started(self, case_id, shape_label):
        self.kernels = None
        self.case_id = case_id

    def pytest_zl_row_ready(self, row):
        # The side under test: the candidate, or the one side a FlagGems benchmark timed.
        if self.kernels is not None and row["status"] == "SUCCESS":
            row["kernels"] = self.kernels
        self.kernels = None

    def pytest_sessionfinish(self, session):
        observed = {}  # one merge of run.json: each is a locked read and a durable write
        # Host seconds by timer phase (estimate, warmup, capture, probe, samples, attribution): what the
        # rows' timing cost beyond the samples; the rest of a step is its inputs, checks and start.
        if self.timer is not None and self.timer.seconds:
            observed["timer_seconds"] = {k: round(v, 3) for k, v in sorted(self.timer.seconds.items())}
        if self.controls is not None:
            # The cases it timed without their baseline, as their rows show (baseline_ms None).
            observed["controls"] = {"baselines_left": self.baselines_left}
        if self.timer is not None and self.timer.sized:
            # Graph sides by how each graph was sized: by its own probe, by the record's sizes, or afresh
            # where the record's call time no longer held; and why a replay had no sizes to go by.
            observed["graph_sizes"] = {**dict(sorted(self.timer.sized.items())),
                                       **({"no_record_sizes": self.sizes_missing} if self.sizes_missing else {})}
        if observed:
            rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": observed})

    def pytest_runtest_teardown(self, item):
        if self.poisoned is not None:
            item.session.shouldstop = f"capture poisoned the accelerator context: {self.poisoned}"
