"""An A/B's plan: the ops, the two sides (what differs between them: environment variables, an
interpreter, pip requirements) and how the experiment runs (repeats, fdr, step_start/step_passes, the
record's RunOptions); read from a plan file (load_plan) or from the mapping a corpus A/B or a bisect
stored (plan_from_data), every field checked."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from harness.core import bounded, paths, rundir
from harness.core.errors import clip, clip_text
from harness.core.options import (
    AUTO,
    CHUNK_RECORDS,
    DEFAULT_MAX_REPEATS,
    DEFAULT_RECORD_JOBS,
    DEFAULT_RESOLVE,
    FDR,
    FIRST_REPEATS,
    MAX_CHUNK,
    MAX_RECORD_JOBS,
    MAX_REPEATS,
    MAX_RESOLVE,
    MIN_RESOLVE,
    STEP_PASSES,
    STEP_STARTS,
    RunOptions,
    percent,
    percent_text,
    valid_fdr,
    valid_max_repeats,
    valid_repeats_choice,
    valid_resolve,
)
from harness.core.request import RunRequest

DEFAULT_PLAN = paths.REPO_ROOT / "ops" / "ab_default.yaml"
SIDE_FIELDS = {"label", "env", "python", "requirements"}
SEQUENTIAL_FIELDS = ("first", "max_repeats", "resolve")  # a plan's, with repeats auto only


MAX_NAME = 100  # characters of a plan's name, which names its A/B dir (a file name holds 255 bytes)


class PlanError(ValueError):
    pass


@dataclasses.dataclass
class Side:
    name: str
    label: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    python: str | None = None
    requirements: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        parts = [self.label] if self.label else []
        parts += [f"{k}={v}" for k, v in self.env.items()]
        if self.python:
            parts.append(f"python={self.python}")
        if self.requirements:
            parts.append(f"pip: {' '.join(self.requirements)}")
        return " ".join(parts) or "as is"


@dataclasses.dataclass
class Plan:
    name: str
    ops: list[str]
    a: Side
    b: Side
    repeats: int | str = 3  # or AUTO: sequential repeats, in rounds (Runner.run)
    # With repeats AUTO: the first round's repeats per side, the most any row gets, and the smallest change
    # (a fraction: stored so; a plan file may say `1%`) a row is timed to resolve; reports.sequential.Schedule
    # (Schedule.from_plan reads them back from ab.json). In a stored plan only when AUTO.
    first: int = FIRST_REPEATS
    max_repeats: int = DEFAULT_MAX_REPEATS
    resolve: float = DEFAULT_RESOLVE
    # The false discovery rate of the report's FASTER/SLOWER calls (reports.stats.adjust).
    fdr: float = FDR
    # Where and what A's record runs and how it measures. Both sides' replays are given only what a
    # replay takes (RunOptions.for_replay): the backend, FlagGems level, switch and cache and the
    # measurement stay the record's, so both sides run the same level, switch and tuning space.
    options: RunOptions = RunOptions()
    # prewarmed: fresh processes at fork's pace; fork's repeats came out more alike on an H200 (docs/performance.md)
    step_start: str = "prewarmed"
    step_passes: str = "once"
    # Ops whose repeats one measuring host a side times (harness.child.host); 1: each step a process of its own.
    chunk: int = 1
    # Where a chunk's records and passes run (options.CHUNK_RECORDS): first, or beside its repeats (a chunk
    # 27% quicker on an H100, its exposed ops' between-process spread up to 2.3x: docs/performance.md).
    chunk_records: str = "first"
    # How many of a chunk's records (with B's passes) run at once (harness.sessions.ab.runner._Records).
    record_jobs: int = DEFAULT_RECORD_JOBS

    def request(self, command: str, target: str, run_dir: Path, only: str | None = None,
                cases: tuple[str, ...] | None = None) -> RunRequest:
        """One step of this plan, run in `run_dir`: A's record, or a replay of it (of `cases` only, where given)."""
        options = self.options if command == "record" else self.options.for_replay()
        return RunRequest(command, target, options, color="never", run_dir=run_dir, only=only, cases=cases)

    def to_dict(self) -> dict:
        """The plan as the yaml `load_plan` reads (its paths absolute); no device: a corpus A/B gives
        each op's A/B its own."""
        sides = {s.name.lower(): {k: v for k, v in dataclasses.asdict(s).items() if k != "name"}
                 for s in (self.a, self.b)}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("a", "b", "options")}
        if not self.sequential:
            own = {k: v for k, v in own.items() if k not in SEQUENTIAL_FIELDS}
        return {**own, **sides, **self.options.to_dict()}

    @property
    def sequential(self) -> bool:
        return self.repeats == AUTO

    def describe_repeats(self) -> str:
        if not self.sequential:
            return f"{self.repeats} repeats interleaved"
        return (f"repeats {AUTO}: {self.first} interleaved, then one more per side a round for the rows still open, "
                f"up to {self.max_repeats} (resolving {percent_text(self.resolve)})")

    @property
    def records_in_jobs(self) -> bool:
        """Whether a chunk's records can run --record-jobs at a time: a chunk of several ops whose steps warm
        workers fork (each job a worker of its own)."""
        return self.chunk > 1 and self.step_start != "fresh"

    @property
    def first_repeats(self) -> int:
        """The repeats per side every row gets: all of them, or the first round's."""
        return self.first if self.sequential else self.repeats


def _side(data, name: str, where: str, base: Path) -> Side:
    if data is None:
        return Side(name, "")
    if not isinstance(data, dict):
        raise PlanError(f"{where}: side '{name}' must be a mapping")
    unknown = set(data) - SIDE_FIELDS
    if unknown:
        raise PlanError(f"{where}: side '{name}': unknown fields {clip(sorted(map(str, unknown)))} "
                        f"(allowed: {sorted(SIDE_FIELDS)})")
    requirements = data.get("requirements") or []
    if isinstance(requirements, str):  # a requirements file, relative to the plan
        try:
            requirements = bounded.read_lines(base / requirements, "requirements file")
        except bounded.InputRefused as exc:
            raise PlanError(f"{where}: side '{name}': requirements file {exc}") from exc
    if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
        raise PlanError(f"{where}: side '{name}': requirements must be a list of pip specifiers or a file name")
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise PlanError(f"{where}: side '{name}': env must be a mapping of NAME: value")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise PlanError(f"{where}: side '{name}': env name {clip(key)} is not a variable name")
        # yaml reads `true`, `null` and `on` as non-strings, whose str() is no value a switch expects.
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or "\0" in str(value):
            raise PlanError(f"{where}: side '{name}': env {clip_text(key)}: {clip(value)} is not a string or a number "
                            "(quote it: '1', 'true'; no NUL character)")
    for field in ("label", "python"):
        if data.get(field) is not None and not isinstance(data[field], str):
            raise PlanError(f"{where}: side '{name}': {field} must be a string, not {data[field]!r:.60}")
    python = data.get("python")
    if python is not None:
        # Relative to the plan, like its other paths; absolute, since each step runs from elsewhere. Not
        # resolved: a venv's python is a link whose target has none of the venv's packages.
        python = os.path.abspath(base / python)
        problem = bounded.path_problem(python, "executable")
        if problem is not None:
            raise PlanError(f"{where}: side '{name}': python {python} {problem}")
    return Side(name, str(data.get("label") or ""), {str(k): str(v) for k, v in env.items()}, python,
                requirements)


def load_plan(path: Path) -> Plan:
    path = Path(path)
    return plan_from_data(rundir.read_yaml_mapping(path, PlanError, "plan"), path)


def plan_from_data(data: dict, path, base: Path | None = None) -> Plan:
    """A plan from its mapping (a plan file's, or the one a corpus A/B stored in its batch.json),
    every field checked for type and range; relative paths are relative to `base` (default: the
    plan file's folder)."""
    base = Path(path).parent if base is None else base
    if not isinstance(data, dict):
        raise PlanError(f"plan {path}: top level must be a mapping")
    allowed = {f.name for f in dataclasses.fields(Plan) if f.name != "options"} | {
        f.name for f in dataclasses.fields(RunOptions)}
    unknown = set(data) - allowed
    if unknown:
        raise PlanError(f"plan {path}: unknown fields {clip(sorted(map(str, unknown)))} (allowed: {sorted(allowed)})")
    name = data.get("name")
    # It names the A/B's dir (ab_<name>_<ts>): a name past what a file name holds failed there, exit 1.
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isprintable()):
        raise PlanError(f"plan {path}: 'name' must be a string of 1 to {MAX_NAME} printable characters, not "
                        f"{clip(name)}")
    options = RunOptions.from_dict(
        data, lambda name, value, what: PlanError(f"plan {path}: '{name}' must be {what}, not {value!r:.60}"), base)
    ops = data.get("ops")
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
        raise PlanError(f"plan {path}: 'ops' must be a non-empty list of operator names")
    repeats = data.get("repeats", 3)
    if not valid_repeats_choice(repeats):
        raise PlanError(f"plan {path}: 'repeats' must be an integer from 2 to {MAX_REPEATS} (a row's spread between "
                        f"repeats is its noise) or {AUTO}, not {clip(repeats)}")
    sequential = _sequential_fields(data, path) if repeats == AUTO else {}
    given = [name for name in SEQUENTIAL_FIELDS if data.get(name) is not None]
    if repeats != AUTO and given:
        raise PlanError(f"plan {path}: {', '.join(given)}: only with repeats: {AUTO} (its repeats are {repeats})")
    fdr = data.get("fdr", FDR)
    if not valid_fdr(fdr):
        raise PlanError(f"plan {path}: 'fdr' must be a number between 0 and 1, not {clip(fdr)}")
    choices = {"step_start": STEP_STARTS, "step_passes": STEP_PASSES, "chunk_records": CHUNK_RECORDS}
    for name, allowed_values in choices.items():
        if data.get(name) is not None and data[name] not in allowed_values:
            raise PlanError(f"plan {path}: '{name}' must be one of {', '.join(allowed_values)}, not "
                            f"{clip(data[name])}")
    steps = {name: data[name] for name in choices if data.get(name) is not None}
    chunk = data.get("chunk", 1)
    if type(chunk) is not int or not 1 <= chunk <= MAX_CHUNK:
        raise PlanError(f"plan {path}: 'chunk' must be an integer from 1 to {MAX_CHUNK}, not {clip(chunk)}")
    record_jobs = data.get("record_jobs", DEFAULT_RECORD_JOBS)
    if type(record_jobs) is not int or not 1 <= record_jobs <= MAX_RECORD_JOBS:
        raise PlanError(f"plan {path}: 'record_jobs' must be an integer from 1 to {MAX_RECORD_JOBS}, not "
                        f"{clip(record_jobs)}")
    return Plan(name=str(data.get("name") or Path(path).stem), ops=ops, repeats=repeats, fdr=float(fdr),
                options=options, **sequential, a=_side(data.get("a"), "A", str(path), base),
                b=_side(data.get("b"), "B", str(path), base), chunk=chunk, record_jobs=record_jobs, **steps)


def _sequential_fields(data: dict, path) -> dict:
    """A sequential plan's first, max_repeats and resolve (`1%` as --resolve takes it, or the fraction
    0.01 as a stored plan keeps it), each checked."""
    out = {}
    max_repeats = data.get("max_repeats", DEFAULT_MAX_REPEATS)
    if not valid_max_repeats(max_repeats):
        raise PlanError(f"plan {path}: 'max_repeats' must be an integer from {FIRST_REPEATS} to {MAX_REPEATS}, "
                        f"not {clip(max_repeats)}")
    out["max_repeats"] = max_repeats
    first = data.get("first", FIRST_REPEATS)
    if type(first) is not int or not FIRST_REPEATS <= first <= max_repeats:
        raise PlanError(f"plan {path}: 'first' must be an integer from {FIRST_REPEATS} to max_repeats "
                        f"({max_repeats}), not {clip(first)}")
    out["first"] = first
    resolve = data.get("resolve", DEFAULT_RESOLVE)
    if isinstance(resolve, str):
        try:
            resolve = percent(resolve)
        except argparse.ArgumentTypeError as exc:  # said in the plan's terms
            raise PlanError(f"plan {path}: 'resolve' {exc}") from exc
    if not valid_resolve(resolve):
        raise PlanError(f"plan {path}: 'resolve' must be a percentage above {percent_text(MIN_RESOLVE)} and below "
                        f"{percent_text(MAX_RESOLVE)} (`1%`, or the fraction 0.01), not {clip(data['resolve'])}")
    out["resolve"] = float(resolve)
    return out
