"""A run's results.json: {"format": RESULTS_FORMAT, "rows": [row, ...]}, one row per case the child
reported (harness.child.plugins.results). ResultRow is a row typed; every reader goes through
read_results, so a row that is not what the child writes is refused once, naming the file and the
row, instead of failing as a KeyError in whichever report reads it first."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import backends
from harness.core import rundir
from harness.core.bounded import InputRefused
from harness.core.errors import clip, clip_text
from harness.core.spec import check_types

RESULTS_FORMAT = 1
STATUSES = ("SUCCESS", "FAILED", "ERROR", "SKIPPED")
# An operator's own figures for a case (ops' bytes_moved and flops, FlagGems' upstream metrics): on
# disk beside the row's fields, as the child has always written them; in ResultRow, under `metrics`.
METRICS = ("gbps", "tflops", "numel")
# The fields written only when they hold something (absent on disk, None here).
_ABSENT_WHEN_NONE = ("samples", "benchmark", "error", "kernels", "gpu_state")
# The order the child has always written a row's keys in: no reader depends on it, a diff of two
# results.json files does.
_ORDER = ("op", "dtype", "shape", "params", "case", "status", "baseline_ms", "candidate_ms", "speedup", "timer",
          "measures_performance", "input_sha256", "samples", "markers", "configs", "nodeid")
_AFTER_METRICS = ("benchmark", "error", "kernels", "gpu_state")


class ResultsError(ValueError):
    """A results.json (or a row of it) that is not what the child writes."""


@dataclasses.dataclass(frozen=True)
class ResultRow:
    """One case's row, as read back: frozen, since it is a record of what the child measured."""

    op: str
    dtype: str | None  # None: a FlagGems node that failed as a whole
    shape: list | None  # ints; a FlagGems case's one label; None where the case is not known
    params: dict
    case: str
    status: str
    baseline_ms: float | None
    candidate_ms: float | None
    speedup: float | None
    timer: str | None
    input_sha256: str | None  # None where the inputs were never built
    markers: list[str]
    configs: dict
    nodeid: str
    # Whether the backend's timings are performance numbers (backends.Backend.measures_performance): on
    # every row, so a script or spreadsheet reading the row's latencies, speedup and metrics is told by
    # the row itself (the interpreter's are not).
    measures_performance: bool
    # Per side measured: its Measurement.summary() and up to MAX_RAW_SAMPLES raw latencies.
    samples: dict | None = None
    benchmark: str | None = None  # a FlagGems row: the upstream benchmark class
    error: str | None = None  # a row that did not succeed: why
    kernels: list[dict] | None = None  # the side under test's per-kernel attribution, where profiled
    gpu_state: dict | None = None  # {"before": ..., "after": ...}, where the GPU was monitored
    metrics: dict = dataclasses.field(default_factory=dict)  # METRICS the row carries

    @property
    def key(self) -> tuple:
        """What pairs a row across runs: (op, dtype, shape)."""
        return (self.op, self.dtype, tuple(self.shape or ()))

    def to_dict(self) -> dict:
        """The row as results.json holds it."""
        out = {**{name: getattr(self, name) for name in _ORDER}, **self.metrics,
               **{name: getattr(self, name) for name in _AFTER_METRICS}}
        return {k: v for k, v in out.items() if v is not None or k not in _ABSENT_WHEN_NONE}

    @classmethod
    def from_dict(cls, data, where: str) -> ResultRow:
        """ResultsError, prefixed with `where`, naming what is wrong with the first thing that is."""
        if not isinstance(data, dict):
            raise ResultsError(f"{where}: not an object")
        names = [f.name for f in dataclasses.fields(cls) if f.name != "metrics"]
        unknown = [k for k in data if k not in names and k not in METRICS]
        if unknown:
            raise ResultsError(f"{where}: unknown field(s) {clip_text(', '.join(map(repr, unknown)))}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ResultsError(f"{where}: lacks {', '.join(missing)}")
        fields = {k: v for k, v in data.items() if k in names}
        check_types(cls, fields, where, ResultsError)
        if fields["status"] not in STATUSES:
            raise ResultsError(f"{where}: status {clip(fields['status'])} not one of {STATUSES}")
        metrics = {k: data[k] for k in METRICS if k in data}
        for name, value in metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ResultsError(f"{where}: {name} is {value!r:.60}, not a number")
        # JSON as Python reads it takes NaN, Infinity and -1 for a latency: each reached the statistics.
        for name in ("baseline_ms", "candidate_ms", "speedup"):
            value = fields[name]
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ResultsError(f"{where}: {name} is {value!r:.60}, not a finite number >= 0")
        bad = _not_finite(fields.get("samples"))
        if bad is not None:
            raise ResultsError(f"{where}: samples hold {bad!r:.60}, not a finite number")
        return cls(**fields, metrics=metrics)


def _not_finite(value):
    """The first number in `value` (nested lists and dicts) that is NaN or infinite, else None."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return item
        if isinstance(item, dict):
            todo += item.values()
        elif isinstance(item, list):
            todo += item
    return None


def read_results(run_dir: Path) -> list[ResultRow]:
    """The rows of a run dir's results.json, or ResultsError saying, on one line, what is wrong."""
    path = Path(run_dir) / rundir.RESULTS_JSON
    try:
        data = rundir.read_json(path)
    except InputRefused as exc:  # it names the file and why: said as it is
        raise ResultsError(str(exc)) from exc
    except OSError as exc:
        raise ResultsError(f"{path} does not read as results: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ResultsError(f"{path} does not read as results: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ResultsError(f"{path} does not read as results: not an object")
    if data.get("format") != RESULTS_FORMAT:
        raise ResultsError(f"{path} does not read as results: format {clip(data.get('format'))}, "
                           f"expected {RESULTS_FORMAT}")
    if not isinstance(data.get("rows"), list):
        raise ResultsError(f"{path} does not read as results: it holds no 'rows' list")
    rows = data["rows"]
    if any(isinstance(row, dict) and "measures_performance" not in row for row in rows):
        measures = _backend_measures(Path(run_dir))
        rows = [{"measures_performance": measures, **row} if isinstance(row, dict) else row for row in rows]
    return [ResultRow.from_dict(row, f"{path} does not read as results: row {i}")
            for i, row in enumerate(rows)]


def _backend_measures(run_dir: Path) -> bool:
    """Whether the backend the run dir's run.json names measures performance: what a row written before
    rows said so themselves (a record kept from then, still replayed and compared) is taken to say."""
    path = run_dir / rundir.RUN_JSON
    try:
        name = rundir.read_json(path)["spec"]["backend"]
        return backends.get(name).measures_performance
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path.parent / rundir.RESULTS_JSON} does not read as results: its rows do not say "
                           f"whether they are performance numbers, and {path} does not name a known backend "
                           f"({clip_text(str(exc))})") from exc


def encode_row(row: ResultRow) -> str:
    """A row as results.json holds it, on one line: encoded once, however often the file is rewritten."""
    return json.dumps(row.to_dict(), default=str)


def write_results(run_dir: Path, encoded: list[str], durable: bool = True) -> None:
    """Atomically: the child rewrites the file after every row, and a crash must keep the last one whole.
    The rows as encode_row made them: the child keeps each row's encoding, since re-encoding every row on
    every rewrite (pretty-printed, in Python) cost a 42-row FlagGems step 0.6 s on an H100 host."""
    text = f'{{"format": {RESULTS_FORMAT}, "rows": [\n' + ",\n".join(encoded) + "\n]}\n"
    rundir.atomic_write_text(Path(run_dir) / rundir.RESULTS_JSON, text, durable)
