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
import stat
import threading
from pathlib import Path
from typing import IO, Any

import yaml

from harness.core import bounded
from harness.core.errors import UsageError, clip_text
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
            candidate.mkdir()  # a link planted at the name is taken, never followed
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"could not claim a run directory under {root}")


def unclaimed_run_dir(root: Path, op: str, now: _dt.datetime | None = None) -> Path:
    """The name claim_run_dir would take under `root` now, not created: a parent names its child's
    run dir so, under a dir only it writes into, and reads back exactly that (the child claims it)."""
    for candidate in _candidates(root, op, now):
        if not os.path.lexists(candidate):  # a dangling link is no free name
            return candidate
    raise RuntimeError(f"no free run directory name under {root}")


def claim_named_dir(path: Path, first_file: str, text: str = "") -> Path:
    """Exactly `path` (its parent resolved), the dir a parent named: created with its parents, or one
    that exists and is empty. Its `first_file`, holding `text`, appearing there is the claim: written
    aside, then linked to its name, which fails where the name exists, so two claimants of one path
    never share it, and no reader (nor a crash) ever finds the file without its whole text. A dir that
    holds anything is refused in one line, a link at `path` as LinkRefused (a dir is created or found,
    never adopted through a link)."""
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path = path.parent.resolve() / path.name
    taken = UsageError(f"--run-dir {path} exists and is not an empty dir: name a new or empty one")
    try:
        make_dir(path)
    except FileExistsError:  # a file
        raise taken from None
    if any(path.iterdir()):
        raise taken
    try:
        atomic_write_text(path / first_file, text, exclusive=True)
    except FileExistsError:
        raise taken from None
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()  # empty, as checked: a claim that failed leaves no run dir
        raise
    return path


class LinkRefused(OSError):
    """A file or dir the harness writes in a run or batch dir that is a symlink (or not a plain file
    or dir): refused, never followed. The harness often runs as root, and a link planted there would
    send its writes anywhere. One line naming it (harness.cli prints `strerror: filename`)."""

    def __init__(self, path: Path | str, what: str = "a symlink"):
        super().__init__(errno.ELOOP, f"refusing to write through {what}", str(path))

    def __str__(self) -> str:
        return f"{self.strerror}: {self.filename}"


# What open_write opens with: never through a final symlink (O_NOFOLLOW), never left to a child
# (O_CLOEXEC), never blocking on a FIFO planted at the name (O_NONBLOCK, cleared once open).
_WRITE_FLAGS = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_HOW = {"a": os.O_WRONLY | os.O_APPEND, "w": os.O_WRONLY | os.O_TRUNC, "x": os.O_WRONLY | os.O_EXCL,
        "a+": os.O_RDWR | os.O_APPEND}


def open_write(path: Path | str, how: str = "a", binary: bool = False) -> IO:
    """`path` opened to append ("a", "a+" to read too), to rewrite ("w") or as a new file ("x"), as
    a text file in UTF-8 unless `binary`: the one way the harness opens a file for writing in a run or
    batch dir. A symlink at `path`, or anything but a plain file with that one name (a FIFO, a device,
    a hard link to another file), is refused as LinkRefused before a byte is written."""

    def opener(name, flags) -> int:
        try:
            fd = os.open(name, _WRITE_FLAGS | _HOW[how], 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):  # a final symlink; a FIFO with no reader
                raise LinkRefused(path, "a symlink" if exc.errno == errno.ELOOP else "a FIFO") from None
            raise
        st = os.fstat(fd)
        refusal = ("something not a plain file" if not stat.S_ISREG(st.st_mode) else
                   "a hard link" if st.st_nlink > 1 else None)
        if refusal is not None:
            os.close(fd)
            raise LinkRefused(path, refusal)
        os.set_blocking(fd, True)
        return fd

    mode = {"x": "w"}.get(how, how) + ("b" if binary else "")
    return open(path, mode, opener=opener, **({} if binary else {"encoding": "utf-8"}))


def make_dir(path: Path, under: Path | None = None) -> Path:
    """`path` as a dir of ours: created (with its missing parents below `under`, each checked alike),
    or one found there that is a real dir, not a link to one (LinkRefused). FileExistsError when a
    file holds the name."""
    path = Path(path)
    chain = [path]
    if under is not None:
        Path(under).mkdir(parents=True, exist_ok=True)  # the batch's own dir: the user's to name, a link or not
        chain = [Path(under) / Path(*path.relative_to(under).parts[:i + 1])
                 for i in range(len(path.relative_to(under).parts))]
    for part in chain:
        try:
            part.mkdir()
        except FileExistsError:
            pass
        st = os.lstat(part)
        if stat.S_ISLNK(st.st_mode):
            raise LinkRefused(part, "a symlink as a dir")
        if not stat.S_ISDIR(st.st_mode):
            raise FileExistsError(errno.EEXIST, "exists and is not a dir", str(part))
    return path


class WriteFault(OSError):
    """A write where a run or batch keeps its state that failed for good (no space, a file-size
    limit, an I/O error): the run cannot go on, and says so in one line naming the file."""

    def __init__(self, path: Path | str, code: int):
        super().__init__(code, os.strerror(code), str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"{self.strerror[:1].lower()}{self.strerror[1:]} writing {self.path}"

    @property
    def reason(self) -> str:
        """Why the run stopped, as its outcome says it."""
        return f"write failed: {self}"


class RunWriteFault(WriteFault):
    """A run (an A/B's step, a batch's op) that ended by a failed write of its own (its exit EXIT_DISK_FULL:
    the disk filled, a file-size limit, EIO): nothing after it could write either, so what started it
    stops there, and exits so too. One line wherever it is not caught (harness.cli)."""

    def __init__(self, what: str, run_dir: Path | str):
        super().__init__(run_dir, errno.EIO)
        self.what = what

    def __str__(self) -> str:
        return f"{self.what} stopped: a write failed in its run dir {self.path} (exit {EXIT_DISK_FULL})"

    @property
    def reason(self) -> str:
        return f"write failed during {self.what}"


class DiskFull(WriteFault):
    """No space (or quota) left where a run writes."""

    def __init__(self, path: Path):
        # Its file named as any OSError names one: a batch's device thread passes such a fault on as one line.
        OSError.__init__(self, errno.ENOSPC, f"no space left on device writing {path}", str(path))
        self.path = path

    def __str__(self) -> str:
        return self.strerror

    @property
    def reason(self) -> str:
        return "no space left on device"


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What a write meets that no retry of it mends (EFBIG: a file-size limit, RLIMIT_FSIZE or the file system's).
FAULT_ERRNOS = (*FULL_ERRNOS, errno.EFBIG, errno.EIO)
# A run's exit codes. The run's process exits with the one its outcome (run.json observed.outcome)
# records, never with a child's raw exit number: a child may exit with anything (an operator's
# os._exit(2) is no bad input of ours). 128+N: a signal N stopped it.
EXIT_FAILED_ROWS = 1
EXIT_BAD_INPUT = 2
EXIT_INCOMPLETE = 3  # stopped before its last case
EXIT_DISK_FULL = 75  # a write failed for good (WriteFault: the disk filled, a file-size limit, EIO): it stops at once
# Kept free in a run dir until its child has recorded how it ended: a child that meets a full disk
# removes it, so its outcome still fits into run.json.
RESERVE = ".space_reserve"
RESERVE_BYTES = 128 * 1024


def disk_full(exc: BaseException, path: Path | str | None = None) -> DiskFull | None:
    """The DiskFull behind `exc` (itself, its cause or context chain, or a raw ENOSPC OSError,
    named by its own file name, else `path`)."""
    fault = write_fault(exc, path)
    return fault if isinstance(fault, DiskFull) else None


def write_fault(exc: BaseException, path: Path | str | None = None) -> WriteFault | None:
    """The WriteFault behind `exc` (itself, its cause or context chain, or a raw OSError of
    FAULT_ERRNOS, named by its own file name, else `path`): DiskFull for no space."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, WriteFault):
            return exc
        if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
            where = Path(exc.filename or path or "?")
            return DiskFull(where) if exc.errno in FULL_ERRNOS else WriteFault(where, exc.errno)
        exc = exc.__cause__ or exc.__context__
    return None


def reserve_space(run_dir: Path) -> None:
    """Hold RESERVE_BYTES of the run dir's disk (written, not sparse) for the outcome of a run that
    fills the disk; DiskFull when even that does not fit."""
    path = Path(run_dir) / RESERVE
    try:
        with open_write(path, "w", binary=True) as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise write_fault(exc, path) or exc from exc


def release_space(run_dir: Path) -> None:
    (Path(run_dir) / RESERVE).unlink(missing_ok=True)


def record_outcome(run_dir: Path, outcome: Outcome, **facts) -> None:
    """How the run ended, into run.json (`observed.outcome`, plus other `facts` of `observed`):
    what the run's process exits with (`outcome.exit_code`) and says in its last line."""
    merge_json(Path(run_dir) / RUN_JSON, {"observed": {"outcome": outcome.to_json(), **facts}})


def atomic_write_text(path: Path, text: str, durable: bool = True, exclusive: bool = False) -> None:
    """Write whole or not at all: on any failure the temporary file is removed and the previous
    file stays as it was; a full disk raises DiskFull naming `path`, any other failed write an
    OSError naming it. The temporary file is new (O_EXCL, never a link: open_write) in a dir that is
    no link, so the rename puts a file of ours at `path`, whatever was planted there. Not `durable`:
    whole after the process dies, not after the machine does (no fsync: ~3 ms a write, four a row).
    `exclusive`: a new file, linked to its name rather than renamed over it, FileExistsError where
    the name exists (the claim of a named dir: two claimants never both get it)."""
    path = Path(path)
    # Each writer its own: this process's threads too (a named dir's claimants, a step beside the main one).
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")
    if os.path.islink(path.parent):
        raise LinkRefused(path.parent, "a symlink as a dir")
    made = False
    try:
        tmp.unlink(missing_ok=True)  # this pid's leftover (a write it died in): not a file of anyone else's
        with open_write(tmp, "x") as f:
            made = True
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException as exc:
        if made:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            raise DiskFull(path) from exc
        if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:  # named: one line, not a traceback
            raise WriteFault(path, exc.errno) from exc
        raise


def json_text(data: Any) -> str:
    """`data` as every JSON file of a run or batch dir holds it."""
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"


def atomic_write_json(path: Path, data: Any, durable: bool = True) -> None:
    atomic_write_text(path, json_text(data), durable)


@contextlib.contextmanager
def _locked(path: Path):
    lock = path.with_name(f".{path.name}.lock")
    with open_write(lock) as f:
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


def merge_json(path: Path, facts: dict, durable: bool = True) -> dict:
    """Merge `facts` into the JSON object at `path` (deeply), atomically and under a lock, so
    the session and each plugin can add what they know without clobbering each other."""
    with _locked(path):
        data = read_json(path) if path.exists() else {}
        _deep_merge(data, facts)
        atomic_write_json(path, data, durable)
        return data


def read_yaml_mapping(path: Path, error: type[Exception], what: str, expect: str = "a mapping") -> dict:
    """A yaml file whose top level is a mapping, or `error` in one line naming the file, the line
    where the parser stopped, and what is wrong. Read as bounded.CAPS[what] allows, without aliases."""
    path = Path(path)
    problem = bounded.path_problem(path, "file")
    if problem is not None:
        raise error(f"{what} {path} {problem}")
    try:
        data = bounded.load_yaml(bounded.read_bounded(path, what).decode("utf-8"))
    except bounded.InputRefused as exc:
        raise error(f"{what} {exc}") from exc
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
        raise error(f"{what} {where}: not valid yaml: {clip_text(problem)}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{what} {path}: not valid yaml: {clip_text(' '.join(str(exc).split()))}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} {path}: top level must be {expect}")
    return data


def read_json(path: Path, kind: str | None = None) -> Any:
    """A run or batch dir's JSON file: bounded.read_json (its kind by its name unless given)."""
    return bounded.read_json(path, kind)
