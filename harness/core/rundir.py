"""Run directories: claimed atomically, written atomically, merged under a lock.

Every file here is written whole to a temporary name and renamed into place, so a crash at any
moment leaves either the previous complete file or the new complete file, never half of one.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any

import yaml

from harness.core.errors import UsageError
from harness.core.outcome import Outcome

RUN_JSON = "run.json"
RESULTS_JSON = "results.json"
SHAPES_YAML = "shapes.yaml"
RUN_LOG = "run.log"
RECORDS_DIR = "autotune_records"


def _candidates(root: Path, op: str, now: _dt.datetime | None):
    """`root/<op>_<YYYYmmdd-HHMMSS>[-N]` for N = 0 (no suffix), 1, ..., the op made path-safe."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = f"{op.replace('/', '_').replace(':', '_')}_{stamp}"
    return (root / (base if n == 0 else f"{base}-{n}") for n in range(0, 10_000))


def claim_run_dir(root: Path, op: str, now: _dt.datetime | None = None) -> Path:
    """The first free name of _candidates: mkdir is the atomic claim, so two runs starting in the
    same second get distinct directories instead of sharing one."""
    root.mkdir(parents=True, exist_ok=True)
    for candidate in _candidates(root, op, now):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"could not claim a run directory under {root}")


def unclaimed_run_dir(root: Path, op: str, now: _dt.datetime | None = None) -> Path:
    """The name claim_run_dir would take under `root` now, not created: a parent names its child's
    run dir so, under a dir only it writes into, and reads back exactly that (the child claims it)."""
    for candidate in _candidates(root, op, now):
        if not candidate.exists():
            return candidate
    raise RuntimeError(f"no free run directory name under {root}")


def claim_named_dir(path: Path, first_file: str) -> Path:
    """Exactly `path` (resolved), the dir a parent named: created with its parents, or one that
    exists and is empty. Creating its `first_file` exclusively is the claim, so two claimants of
    one path never share it; a dir that holds anything is refused in one line."""
    path = Path(path).resolve()
    taken = UsageError(f"--run-dir {path} exists and is not an empty dir: name a new or empty one")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file
        raise taken from None
    if any(path.iterdir()):
        raise taken
    try:
        (path / first_file).open("x").close()
    except FileExistsError:
        raise taken from None
    return path


class DiskFull(OSError):
    """No space (or quota) left where a run writes: the run cannot go on, and says so in one line."""

    def __init__(self, path: Path):
        super().__init__(errno.ENOSPC, f"no space left on device writing {path}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# A run's exit codes. The run's process exits with the one its outcome (run.json observed.outcome)
# records, never with a child's raw exit number: a child may exit with anything (an operator's
# os._exit(2) is no bad input of ours). 128+N: a signal N stopped it.
EXIT_FAILED_ROWS = 1
EXIT_BAD_INPUT = 2
EXIT_INCOMPLETE = 3  # stopped before its last case
EXIT_DISK_FULL = 75  # the disk filled: nothing more can be saved, so the child stops at once
# Kept free in a run dir until its child has recorded how it ended: a child that meets a full disk
# removes it, so its outcome still fits into run.json.
RESERVE = ".space_reserve"
RESERVE_BYTES = 128 * 1024


def disk_full(exc: BaseException, path: Path | str | None = None) -> DiskFull | None:
    """The DiskFull behind `exc` (itself, its cause or context chain, or a raw ENOSPC OSError,
    named by its own file name, else `path`)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return exc
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return DiskFull(Path(exc.filename or path or "?"))
        exc = exc.__cause__ or exc.__context__
    return None


def reserve_space(run_dir: Path) -> None:
    """Hold RESERVE_BYTES of the run dir's disk (written, not sparse) for the outcome of a run that
    fills the disk; DiskFull when even that does not fit."""
    path = Path(run_dir) / RESERVE
    try:
        with open(path, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise disk_full(exc, path) or exc from exc


def release_space(run_dir: Path) -> None:
    (Path(run_dir) / RESERVE).unlink(missing_ok=True)


def record_outcome(run_dir: Path, outcome: Outcome, **facts) -> None:
    """How the run ended, into run.json (`observed.outcome`, plus other `facts` of `observed`):
    what the run's process exits with (`outcome.exit_code`) and says in its last line."""
    merge_json(Path(run_dir) / RUN_JSON, {"observed": {"outcome": outcome.to_json(), **facts}})


def atomic_write_text(path: Path, text: str) -> None:
    """Write whole or not at all: on any failure the temporary file is removed and the previous
    file stays as it was; a full disk raises DiskFull naming `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            raise DiskFull(path) from exc
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def _locked(path: Path):
    lock = path.with_name(f".{path.name}.lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _deep_merge(dst: dict, src: dict) -> dict:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def merge_json(path: Path, facts: dict) -> dict:
    """Merge `facts` into the JSON object at `path` (deeply), atomically and under a lock, so
    the session and each plugin can add what they know without clobbering each other."""
    with _locked(path):
        data = json.loads(path.read_text()) if path.exists() else {}
        _deep_merge(data, facts)
        atomic_write_json(path, data)
        return data


def read_yaml_mapping(path: Path, error: type[Exception], what: str, expect: str = "a mapping") -> dict:
    """A yaml file whose top level is a mapping, or `error` in one line naming the file, the line
    where the parser stopped, and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path}: not valid yaml: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise error(f"{what} {path}: cannot be read: {exc.strerror or exc}") from exc
    except yaml.MarkedYAMLError as exc:
        # PyYAML's own text spans lines and calls the file "<unicode string>".
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or type(exc).__name__
        if exc.context and exc.context_mark and exc.context_mark is not mark:
            problem += f" ({exc.context} at line {exc.context_mark.line + 1})"
        raise error(f"{what} {where}: not valid yaml: {problem}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{what} {path}: not valid yaml: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} {path}: top level must be {expect}")
    return data


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
