"""Where the checkout is, and the PYTHONPATH a harness subprocess gets (zl_bench runs from its
checkout; it is not installed)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

from harness.core import deps

REPO_ROOT = Path(__file__).resolve().parents[2]
OPS_DIR = REPO_ROOT / "ops"
SHAPES_DIR = REPO_ROOT / "shapes"
RUNS_DIR = REPO_ROOT / "runs"


def user_cache() -> Path:
    """The harness's dir in the user's cache folder (`$XDG_CACHE_HOME`, else ~/.cache): what it keeps
    between runs, apart from every source tree; deleting it loses only time."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zl_bench"


def bytecode_cache() -> Path:
    """Where harness subprocesses cache Python bytecode when the environment forbids writing it
    beside the sources (PYTHONDONTWRITEBYTECODE)."""
    return user_cache() / "pycache"


def keeps_no_bytecode(environ) -> bool:
    """PYTHONDONTWRITEBYTECODE set, no PYTHONPYCACHEPREFIX chosen, and torch installed without
    bytecode beside its sources (uv's default): every process would compile torch's sources afresh
    (the child's imports: 3.7 s instead of 1.6 s on such an H200 host). Where the install has its
    bytecode, a cache elsewhere would only be filled once for nothing."""
    return (bool(environ.get("PYTHONDONTWRITEBYTECODE")) and not environ.get("PYTHONPYCACHEPREFIX")
            and not has_bytecode("torch"))


@functools.cache
def has_bytecode(package: str) -> bool:
    """Whether the installed `package` has the bytecode of its __init__ beside its source (found
    without importing it); True where it is not installed or has no source: nothing to compile."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return True
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def harness_pythonpath(inherited: str | None) -> str:
    """PYTHONPATH for a harness subprocess: the checkout first, then whatever was inherited, then
    the checkout's .nox/deps when present (so a `python -m harness` started without nox hands its
    children the sessions' light packages)."""
    return os.pathsep.join([str(REPO_ROOT), *deps.search_path(inherited)])


def runs_root(out: Path | None) -> Path:
    """The parent of new run dirs: --out, else runs/ in the checkout."""
    return (out or RUNS_DIR).resolve()


# `zl_<kind>.<owner pid>.<random>` in the temp dir: a private dir that says whose it is.
_PRIVATE = re.compile(r"^zl_[a-z_]+\.(\d+)\.")


def make_private_dir(kind: str) -> Path:
    """A fresh dir in the temp dir for this process alone (a Triton cache), which its owner removes
    when done. One whose owner died first (kill -9) is removed here, by the next one made."""
    remove_abandoned()
    return Path(tempfile.mkdtemp(prefix=f"zl_{kind}.{os.getpid()}."))


@contextlib.contextmanager
def private_dir(kind: str):
    path = make_private_dir(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_abandoned() -> list[Path]:
    """Remove the private dirs whose owner is gone; those removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob("zl_*.*.*"):
        owner = _PRIVATE.match(path.name)
        if owner and path.is_dir() and not _running(int(owner[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    """Alive and not a zombie (a process killed outright, its parent yet to reap it, runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True  # no /proc: alive, as far as can be told
