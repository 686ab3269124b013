"""Batch dirs: what a batch leaves on disk, read and written here (the counterpart of rundir.py).

A batch dir holds `batch.json` (its selection and options, what makes a dir a batch dir), the
`.owner` lock of the batch running in it, `ops_status.csv` (one status row per op, rewritten
atomically), `summary.csv`, and one dir per op under `ops/` with the op's attempts and, once its
status is settled, a `.complete` marker a resume reads back.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import io
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from harness.core import bounded, paths, rundir
from harness.core.errors import UsageError, clip, clip_text
from harness.core.results import read_results

DONE = ("PASS", "SKIP")
FAIL_UPSTREAM = "FAIL_UPSTREAM"  # fails as the bare upstream node too: listed, not counted as ours
TIMEOUT_UPSTREAM = "TIMEOUT_UPSTREAM"  # the bare upstream node outlasts --op-timeout too: likewise
# Verdicts triage put on upstream: a resume keeps them (rerunning cannot change them), except a
# TIMEOUT_UPSTREAM when the resume gives a longer --op-timeout than the one it timed out under.
UPSTREAM_VERDICTS = (FAIL_UPSTREAM, TIMEOUT_UPSTREAM)
SETTLED = (*DONE, FAIL_UPSTREAM)  # kept by any resume; TIMEOUT_UPSTREAM by one under no longer a budget
UPSTREAM_DIR = "upstream"  # under an op's dir: the triage rerun as upstream's own pytest node
BATCH_JSON = "batch.json"  # what makes a dir a batch dir
OWNER_LOCK = ".owner"  # flocked by the batch that runs in the dir, and holding its pid
STATUS_CSV = "ops_status.csv"
SUMMARY_CSV = "summary.csv"
WORKERS_LOG = "workers.log"  # the warm workers that fork the ops (each op's own output is in its batch.log)
COMPLETE = ".complete"  # in an op's dir: its settled status, and for a timeout the budget it ran under
DEFAULT_OP_TIMEOUT = 1800.0

# A stored option's check: (whether a value is fine, what it should have been).
Check = tuple[Callable[[object], bool], str]


def is_batch_dir(path: Path) -> bool:
    """Whether `path` is a batch dir: it holds a batch.json (a run dir never does). Anything by that
    name counts: reading it then says what it is, where "not a batch dir" would hide it."""
    return os.path.lexists(Path(path) / BATCH_JSON)


# A corpus A/B's chunks of ops, each timed as one A/B (harness.sessions.corpus_ab): its dir under the batch's.
CHUNKS = "chunks"


def op_dir(batch_dir: Path, key: str) -> Path:
    """The dir of the op whose catalog key (`repo:op@op_file`) is `key`."""
    return batch_dir / "ops" / key.replace(":", "__", 1).replace("/", ".")


# --- ops_status.csv ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StatusRow:
    """One op's line of ops_status.csv, as a batch (or the executor task that ran the op) hands it
    back. A number the op never got (an op with no exit code: a timeout; a task that handed back no
    row) is None, an empty cell; `extra` holds a job's own columns (a corpus A/B's verdicts)."""

    op: str
    repo: str
    op_file: str = ""  # empty in the rows of batches from before it was kept
    status: str = ""
    exit_code: int | None = None
    attempts: int | None = None
    elapsed_s: float | None = None
    backend: str = ""
    device: int | None = None
    timer: str = ""
    rows: int | None = None
    timer_fallback_rows: int | None = None
    replay_fallback_rows: int | None = None
    run_dir: str = ""  # relative to the batch dir; empty when no attempt wrote one
    notes: str = ""
    extra: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def id(self) -> str:
        """The op's catalog id (`repo:op@op_file`), which keys the rows."""
        return f"{self.repo}:{self.op}@{self.op_file}"

    def to_csv(self) -> dict:
        """Its cells by column (None an empty one)."""
        cells = {c: getattr(self, c) for c in STATUS_COLUMNS}
        return {**{c: "" if v is None else v for c, v in cells.items()}, **self.extra}

    @classmethod
    def from_csv(cls, record: Mapping[str, str | None]) -> StatusRow:
        """ValueError when a number's cell holds no number (a hand-edited file)."""
        fields = {}
        for f in dataclasses.fields(cls):
            text = record.get(f.name)
            if f.name == "extra" or text is None:
                continue
            fields[f.name] = (text if f.type == "str" else None if text == "" else
                              int(text) if text.lstrip("-").isdigit() else float(text))
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in fields and f.name != "extra"
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:  # a torn or edited file: a row short of a cell, a header without the column
            raise ValueError(f"a row has no {', '.join(missing)}: {clip_text(str(dict(record)))}")
        extra = {c: v for c, v in record.items() if c not in STATUS_COLUMNS and c is not None and v is not None}
        return cls(**fields, extra=extra)


STATUS_COLUMNS = tuple(f.name for f in dataclasses.fields(StatusRow) if f.name != "extra")


def read_status(batch_dir: Path, missing_ok: bool = True) -> dict[str, StatusRow]:
    """The status rows by op id; none when no op finished yet (else, unless `missing_ok`, OSError)."""
    path = batch_dir / STATUS_CSV
    if missing_ok and not os.path.lexists(path):
        return {}
    try:
        text = bounded.read_text(path, STATUS_CSV)
    except bounded.InputRefused as exc:
        raise UsageError(f"{exc}; the op dirs are intact: start a new --batch-dir") from exc
    try:
        rows = [StatusRow.from_csv(r) for r in csv.DictReader(io.StringIO(text, newline=""))]
    except (ValueError, csv.Error) as exc:  # csv.Error: a cell past csv's field limit, a stray quote
        raise UsageError(f"{path} is corrupt ({clip_text(str(exc))}); the op dirs are intact: start a new "
                         "--batch-dir") from exc
    return {r.id: r for r in rows}


def write_status(batch_dir: Path, status: Mapping[str, StatusRow], columns: tuple[str, ...]) -> None:
    """Every row, sorted by op id, in `columns` (a missing one is empty)."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for key in sorted(status):
        cells = status[key].to_csv()
        w.writerow({c: cells.get(c, "") for c in columns})
    rundir.atomic_write_text(batch_dir / STATUS_CSV, out.getvalue())


def write_summary(batch_dir: Path) -> Path:
    """summary.csv, one row per measured case, from the per-op run dirs alone; each row says, as its
    results.json row does, whether its numbers are performance numbers."""
    status = read_status(batch_dir)
    columns = ("repo", "op", "dtype", "shape", "status", "baseline_ms", "candidate_ms", "speedup", "gbps",
               "tflops", "timer", "measures_performance", "markers", "run_dir")
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for key in sorted(status):
        st = status[key]
        if not st.run_dir:
            continue
        run_dir = batch_dir / st.run_dir
        if not (run_dir / rundir.RESULTS_JSON).is_file():
            continue
        for r in read_results(run_dir):
            w.writerow([st.repo, r.op, r.dtype, "x".join(map(str, r.shape or [])), r.status, r.baseline_ms,
                        r.candidate_ms, r.speedup, r.metrics.get("gbps"), r.metrics.get("tflops"), r.timer,
                        r.measures_performance, " | ".join(r.markers), st.run_dir])
    path = batch_dir / SUMMARY_CSV
    rundir.atomic_write_text(path, out.getvalue())
    return path


# --- the completion marker -----------------------------------------------------------------------
def mark_complete(op_dir: Path, status: str, op_timeout: float) -> None:
    """Record a status a resume keeps (read back by `completed`); any other status records nothing."""
    if status in SETTLED:
        rundir.atomic_write_text(op_dir / COMPLETE, status + "\n")
    elif status == TIMEOUT_UPSTREAM:
        rundir.atomic_write_text(op_dir / COMPLETE, f"{status} {op_timeout:g}\n")


def completed(batch_dir: Path, key: str, op_timeout: float = DEFAULT_OP_TIMEOUT) -> str | None:
    """The settled status of the op `key`, which a resume does not rerun; None when it must run (again)."""
    marker = op_dir(batch_dir, key) / COMPLETE
    if not marker.is_file():  # anything else settles nothing: the op runs again
        return None
    status, _, timed_out_under = bounded.read_text(marker, "completion marker").strip().partition(" ")
    if status in SETTLED and not timed_out_under:
        return status
    if status == TIMEOUT_UPSTREAM:
        with contextlib.suppress(ValueError):
            return status if op_timeout <= float(timed_out_under) else None
    return None


# --- the dir itself and its owner ----------------------------------------------------------------
def check_new(batch_dir: Path) -> None:
    """A new batch goes into a new or empty dir: never into another batch's, nor over other files."""
    if is_batch_dir(batch_dir):
        raise UsageError(f"--batch-dir {batch_dir} is an existing batch dir: to continue it add --resume; "
                                 "for a new batch give a new or empty dir")
    if batch_dir.exists() and not batch_dir.is_dir():
        raise UsageError(f"--batch-dir {batch_dir} is a file, not a directory")
    if batch_dir.is_dir() and any(batch_dir.iterdir()):
        raise UsageError(f"--batch-dir {batch_dir} is not empty and is not a batch dir (it has no "
                                 f"{BATCH_JSON}): give a new or empty dir")


def new(batch_dir: Path | None, out: Path | None, prefix: str = "batch") -> Path:
    """The dir a new batch runs in: `batch_dir` made, or else a fresh one claimed under `out`'s runs root."""
    if batch_dir is None:
        return rundir.claim_run_dir(paths.runs_root(out), prefix)
    batch_dir = batch_dir.resolve()
    try:
        batch_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--batch-dir {batch_dir}: cannot create it: {exc.strerror}") from exc
    return batch_dir


def own(batch_dir: Path):
    """Hold the batch dir's owner lock for this batch's life (the open file is the context manager).
    The kernel drops a flock when its process dies, even by SIGKILL, so a held lock means a live
    owner whatever pid numbers got reused; a second batch in the dir is refused, naming the owner."""
    f = rundir.open_write(batch_dir / OWNER_LOCK, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read(64).strip() or "unknown"  # a pid: a lock file replaced by anything else is not read whole
        f.close()
        raise UsageError(f"batch dir {batch_dir} belongs to batch pid {pid}, which is still running: wait "
                                 f"for it, or stop it (kill {pid}) and resume then") from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


# --- batch.json ----------------------------------------------------------------------------------
def write_batch_json(batch_dir: Path, facts: dict) -> None:
    """Merge `facts` into batch.json (a resume's into what the batch stored before)."""
    rundir.merge_json(batch_dir / BATCH_JSON, facts)


def read_batch_json(batch_dir: Path, checks: Mapping[str, Check]) -> dict:
    """batch.json, for a resume: each stored name in `checks` is checked by it (a stored value skips
    the parser; None is "not given" for every one); a name without a check is checked by whoever
    reads it (the run options, by their declarations as they are read: harness.core.options)."""
    path = batch_dir / BATCH_JSON
    try:
        data = rundir.read_json(path)
    except bounded.InputRefused as exc:
        raise UsageError(f"--resume: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume: {path} is corrupt ({exc}); the op dirs are intact: start a new --batch-dir "
                         "with the same selection and options") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--resume: {path} is corrupt: it holds a JSON {type(data).__name__}, not a batch's record "
                         "(an object)")
    # Without its request a resume would run with no options at all (no backend: whatever this host has).
    if not isinstance(data.get("request"), dict):
        found = "has no 'request'" if "request" not in data else f"request = {clip(data['request'])} is not an object"
        raise UsageError(f"--resume: {path} is corrupt: it {found} (the options and selection the batch ran with); "
                         "the op dirs are intact: start a new --batch-dir with the same selection and options")
    if not (data.get("selected") is None or is_strings(data["selected"])):
        raise UsageError(f"--resume: {path} is corrupt: selected = {clip(data['selected'])} is not a list of ops")
    for name, value in data.get("request", {}).items():
        check, what = checks.get(name, (lambda v: True, ""))
        if value is not None and not check(value):
            raise corrupt_field(path, name, value, what)
    return data


def corrupt_field(path: Path, name: str, value, what: str) -> UsageError:
    """A stored option of batch.json (at `path`) that is not what its flag takes, said in one line."""
    return UsageError(f"--resume: {path} is corrupt: request.{clip_text(name)} = {clip(value)} is not {what}; the op "
                      "dirs are intact: fix it, or start a new --batch-dir with the same selection and options")


def is_strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
