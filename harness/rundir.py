"""Run directories: claimed atomically, written atomically, merged under a lock.

Every file here is written whole to a temporary name and renamed into place, so a crash at any
moment leaves either the previous complete file or the new complete file, never half of one.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
from pathlib import Path
from typing import Any

import yaml

RUN_JSON = "run.json"
RESULTS_JSON = "results.json"
SHAPES_YAML = "shapes.yaml"
RUN_LOG = "run.log"
RECORDS_DIR = "autotune_records"


def claim_run_dir(root: Path, op: str, now: _dt.datetime | None = None) -> Path:
    """`root/<op>_<YYYYmmdd-HHMMSS>[-N]`: mkdir is the atomic claim, so two runs starting in the
    same second get distinct directories instead of sharing one."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = f"{op.replace('/', '_').replace(':', '_')}_{stamp}"
    for n in range(0, 10_000):
        candidate = root / (base if n == 0 else f"{base}-{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"could not claim a run directory under {root}")


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    """A yaml file whose top level is a mapping, or `error` naming the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{what} {path}: not valid yaml: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} {path}: top level must be {expect}")
    return data


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
