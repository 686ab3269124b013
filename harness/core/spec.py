"""The run spec: everything needed to reproduce a run, resolved once by the session and written
into run.json. The pytest child reads it back; nothing flows the other way except facts merged
under run.json's "observed" key."""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from pathlib import Path

from harness.core import bounded, rundir
from harness.core.errors import clip

SPEC_VERSION = 1
MODES = ("record", "replay")
TIMERS = ("auto", "graph", "direct", "profiler", "host")
L2_MODES = ("warm", "cold")
# Timing windows a side (harness.measure.timers, Timer) where --windows is not given: one. The small
# rows' spread between processes that windows were meant to average out was the profiler's lingering
# cost in the processes that attributed (docs/timers.md, "Per-kernel attribution"); without it, 1-5 us
# rows spread 0.6% between processes on an H200, and 4 windows, over time or over fresh buffers
# (tests/gpu/check_small_state.py), did not lower what remains.
DEFAULT_WINDOWS = 1
# The ranges of a run's measured fields, one rule for the command line (their declarations in
# harness.core.options), a plan, a batch.json and a run.json's spec read back: a replay of a hand-edited
# spec (`seed: -1`, `rep_ms: NaN`) failed every row, blamed on the candidate. numpy takes a seed below
# 2**32; a budget past ten minutes a measurement is a typo, and 1e308 overflowed the clocks it is added to.
MAX_SEED = 2**32 - 1
MAX_BUDGET_MS = 600_000
MAX_WINDOWS = 64  # each window a capture a row
MAX_NOISE = 0.1  # --max-noise, a fraction: a side known within 10% is no measurement a verdict can use


RULES = {
    "seed": (lambda v: type(v) is int and 0 <= v <= MAX_SEED, f"an integer from 0 to {MAX_SEED}"),
    "warmup_ms": (lambda v: bounded.finite_number(v) and 0 <= v <= MAX_BUDGET_MS,
                  f"a number of ms from 0 to {MAX_BUDGET_MS}"),
    "rep_ms": (lambda v: bounded.finite_number(v) and 0 <= v <= MAX_BUDGET_MS,
               f"a number of ms from 0 to {MAX_BUDGET_MS}"),
    "windows": (lambda v: type(v) is int and 1 <= v <= MAX_WINDOWS, f"an integer from 1 to {MAX_WINDOWS}"),
    "max_noise": (lambda v: bounded.finite_number(v) and 0 <= v <= MAX_NOISE, f"a fraction from 0 to {MAX_NOISE}"),
    "device": (lambda v: type(v) is int and v >= 0, "a device index (an integer >= 0)"),
}
# A run that does part of the work (`--timing-only`, `--passes-only`, `--configs-only`: RunSpec.only),
# each as its run.json says why it left the rest out. "timing": no IR, no per-kernel attribution (an
# A/B's repeats). "passes": those one-off passes, its rows timed at timers.TOKEN_BUDGET_MS, for no
# comparison (an A/B's passes steps). "configs": a record whose autotune picks alone are read, rows
# timed at the token budget, no passes (an A/B's record: each side replays its configs).
ONLY = {"timing": "a timing-only run (--timing-only)",
        "passes": "a passes-only run (--passes-only)",
        "configs": "a configs-only run (--configs-only)"}


def only_refusal(only: str | None, mode: str) -> str | None:
    """Why a run of `mode` cannot be for `only` (RunSpec.only), or None: checked alike where a session
    builds a request and where run.json is read."""
    if only is not None and only not in ONLY:
        return f"only {clip(only)} not one of {tuple(ONLY)}"
    if only == "configs" and mode != "record":
        return f"a configs-only {mode} (only a record has configs of its own)"
    return None


def cases_refusal(cases, mode: str) -> str | None:
    """Why a run of `mode` cannot run just `cases` (RunSpec.cases), or None: checked alike where a
    session builds a request and where run.json is read."""
    if cases is None:
        return None
    if mode != "replay":
        return f"a {mode} of some cases (a record runs every case; a replay may run some)"
    if not cases or not all(isinstance(c, str) and c for c in cases) or len(set(cases)) != len(cases):
        return f"cases {clip(cases)}: not a list of distinct case ids"
    return None


class SpecError(ValueError):
    """A run spec (or the run dir holding it) is missing, corrupt or inconsistent."""


def _fields(cls, data, what: str, where: str) -> dict:
    """The fields of dataclass `cls` found in `data`; SpecError when it is not an object or lacks a
    field without a default."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: {what!r} is not an object")
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data]
    if missing:
        raise SpecError(f"{where}: {what} lacks {', '.join(missing)}")
    return {f.name: data[f.name] for f in fields if f.name in data}


def _is(value, kind) -> bool:
    if kind is type(None):
        return value is None
    kind = typing.get_origin(kind) or kind
    if kind in (int, float):  # json has no int/float line for a float field; bool is no number here
        return isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if dataclasses.is_dataclass(kind):  # a nested object: its own from_json says what is wrong
        return True
    return isinstance(value, kind)


@functools.cache
def _hints(cls) -> dict:
    # Resolving a class's string annotations costs more than checking a row against them, and the
    # child checks every row each time it rewrites results.json (harness.core.results).
    return typing.get_type_hints(cls)


def check_types(cls, fields: dict, where: str, error: type[ValueError] = SpecError) -> None:
    """`error` naming the first field whose value is not of the field's type: a hand-edited
    run.json is refused here, not found out by each row failing in the child (harness.core.results
    checks a results.json row the same way)."""
    hints = _hints(cls)
    for name, value in fields.items():
        hint = hints[name]
        kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if not any(_is(value, kind) for kind in kinds):
            named = hint.__name__ if isinstance(hint, type) else hint
            raise error(f"{where}: {name} is {value!r:.60}, not of type {named}")


@dataclasses.dataclass(frozen=True)
class FlagGemsOptions:
    """What a FlagGems run is, beyond the op: recorded in the spec, identical on both A/B sides.
    Here, not in harness.providers.flaggems (which resolves it from the command line), because the
    spec carries it typed and this layer imports nothing above it."""

    repo: str
    root: str  # the checkout
    test_file: str  # relative to the checkout
    function: str
    level: str = "core"
    # The full shape yaml our keys come from (copied into the run dir), or None for upstream shapes.
    shapes_file: str | None = None
    flagtune: str = "0"
    # private: a fresh LibTuner cache in the run dir; user: FlagGems' own persistent cache; else a URL.
    libtuner_cache: str = "private"

    @property
    def node(self) -> str:
        """The upstream pytest node, relative to the checkout."""
        return f"{self.test_file}::{self.function}"

    @classmethod
    def from_json(cls, data, where: str) -> FlagGemsOptions:
        fields = _fields(cls, data, "flaggems", where)
        check_types(cls, fields, where)
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Frozen: resolved once, then only derived from (`dataclasses.replace`), so the spec the
    session writes is the spec every later step sees."""

    op: str
    backend: str
    mode: str
    device: int
    dtypes: list[str]
    shapes_source: str
    seed: int = 0
    timer: str = "auto"
    # warm: calls replay on the L2 the previous call left; cold: the L2 is flushed before every
    # call (harness.measure.timers). Warm by default, which is also what a run.json written before
    # this field existed measured.
    l2: str = "warm"
    warmup_ms: float = 5.0
    rep_ms: float = 100.0
    windows: int = DEFAULT_WINDOWS  # what a run.json written before this field existed measured too
    # Within-process stopping (harness.measure.timers, Timer.max_noise): 0, what a run.json written before
    # this field existed measured, times every side for its whole rep budget.
    max_noise: float = 0.0
    ops_paths: list[str] = dataclasses.field(default_factory=list)
    provider: str = "builtin"
    replay_from: str | None = None
    # A replay's view of its source: the record's run.json `observed.outcome` as read when the
    # replay was resolved (status COMPLETE or INCOMPLETE, rows done and planned, reason), so a
    # replay of a record that never finished says so in its own run.json.
    replay_source_outcome: dict | None = None
    color: bool = False
    ir: bool = True
    # What the run is for, where not everything (None): a key of ONLY.
    only: str | None = None
    # Compile an autotune sweep's configs in parallel before it (harness.measure.precompile).
    precompile: bool = True
    # A replay of part of its record: the ids of the cases it runs (a sequential A/B's later rounds
    # time only the rows still open); None: every case.
    cases: list[str] | None = None
    # Parallel sweep: devices asked for, and the merged picks the measurement injects.
    sweep_devices: int = 0
    preset_records: str | None = None
    # The lock file of a device this run shares with others of its A/B (harness.measure.device_gate): a
    # timed run holds it while it times a row, a token-timing run beside them while its cases run the
    # device; None: the run has its device to itself.
    device_gate: str | None = None
    # A FlagGems-style benchmark; None for built-in ops. In run.json, its fields as an object.
    flaggems: FlagGemsOptions | None = None
    version: int = SPEC_VERSION

    @property
    def passes(self) -> bool:
        """Whether the run carries the one-off passes: IR collection, per-kernel attribution."""
        return self.only in (None, "passes")

    @property
    def token_timing(self) -> bool:
        """Whether its rows are timed at the token budget: its timings are for no comparison."""
        return self.only in ("passes", "configs")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict, where: str) -> RunSpec:
        if isinstance(data, dict) and data.get("version") != SPEC_VERSION:
            raise SpecError(f"{where}: spec version {clip(data.get('version'))}, expected {SPEC_VERSION}")
        fields = _fields(cls, data, "spec", where)
        check_types(cls, fields, where)
        if fields.get("flaggems") is not None:
            fields["flaggems"] = FlagGemsOptions.from_json(fields["flaggems"], where)
        spec = cls(**fields)
        if spec.mode not in MODES:
            raise SpecError(f"{where}: mode {clip(spec.mode)} not one of {MODES}")
        if spec.l2 not in L2_MODES:
            raise SpecError(f"{where}: l2 {clip(spec.l2)} not one of {L2_MODES}")
        if spec.timer not in TIMERS:
            raise SpecError(f"{where}: timer {clip(spec.timer)} not one of {TIMERS}")
        refusal = only_refusal(spec.only, spec.mode)
        if refusal is not None:
            raise SpecError(f"{where}: {refusal}")
        for name, (check, what) in RULES.items():
            if not check(getattr(spec, name)):
                raise SpecError(f"{where}: {name} {clip(getattr(spec, name))} is not {what}")
        refusal = cases_refusal(spec.cases, spec.mode)
        if refusal is not None:
            raise SpecError(f"{where}: {refusal}")
        return spec


def write(run_dir: Path, spec: RunSpec) -> None:
    rundir.merge_json(run_dir / rundir.RUN_JSON, {"spec": spec.to_json()})


def read(run_dir: Path) -> RunSpec:
    """The spec of an existing run dir, or SpecError saying exactly what is wrong with it."""
    return read_run(run_dir)[0]


def read_run(run_dir: Path) -> tuple[RunSpec, dict]:
    """(spec, observed) of an existing run dir; observed is {} when nothing was merged yet."""
    run_dir = Path(run_dir)
    problem = bounded.path_problem(run_dir, "dir")
    if problem is not None:
        raise SpecError(f"run dir {run_dir} {problem}")
    path = run_dir / rundir.RUN_JSON
    if not os.path.lexists(path):
        raise SpecError(f"{run_dir} is not a run dir: it has no {rundir.RUN_JSON}")
    try:
        data = rundir.read_json(path)
    except bounded.InputRefused as exc:  # it names the file and what it is
        raise SpecError(str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path} is corrupt: {exc}") from exc
    if not isinstance(data, dict) or "spec" not in data:
        raise SpecError(f"{path} has no 'spec' section")
    observed = data.get("observed", {})
    if not isinstance(observed, dict):
        raise SpecError(f"{path} is corrupt: 'observed' is not an object")
    return RunSpec.from_json(data["spec"], str(path)), observed
