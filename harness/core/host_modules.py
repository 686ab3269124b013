"""Triton's host modules, kept from one A/B to the next per side compiler: the C its driver builds
with the system compiler, not kernels (its utilities, and each kernel signature's launcher: on an H200
host each took 0.3-0.5 s to build). A side's Triton cache lives for one A/B (harness.sessions.ab.runner), so
every A/B, every op of a corpus A/B, built them again in A's record and B's passes step.

Triton names each by a digest of its C source, the platform and the build's flags, and stores it alone in
a dir of that name (`<cache>/<digest>/<module>.so`); a kernel's dir holds its metadata (.json) beside its
binaries. Kept under the side's compiler key (interpreter, Triton build, environment: ab.sides.side_compiler_key),
one side's modules never reach the other side's cache, and a rebuilt Triton keeps its own. Each A/B's side
cache links to those kept; what its steps built is kept as the A/B ends."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.core import paths


def store() -> Path:
    return paths.user_cache() / "triton_host_modules"


def _is_module(entry: Path) -> bool:
    """A dir Triton put one compiled host module in, and nothing else."""
    if entry.is_symlink() or not entry.is_dir():
        return False
    files = list(entry.iterdir())
    return len(files) == 1 and files[0].suffix == ".so" and files[0].is_file()


def link(cache: Path, key: str, root: Path | None = None) -> int:
    """Link the side's kept modules into its A/B cache `cache` (made here); how many."""
    kept = (root or store()) / key
    cache.mkdir(parents=True, exist_ok=True)
    linked = 0
    for entry in kept.iterdir() if kept.is_dir() else ():
        if _is_module(entry) and not entry.name.startswith(".") and not (cache / entry.name).exists():
            (cache / entry.name).symlink_to(entry)
            linked += 1
    return linked


def keep(cache: Path, key: str, root: Path | None = None) -> int:
    """Keep the modules the side's steps built into `cache` that are not kept yet; how many. Each is
    copied aside, then renamed into place: an A/B that dies meanwhile, or another keeping the same one
    at once, leaves no half of it."""
    kept = (root or store()) / key
    added = 0
    for entry in cache.iterdir() if cache.is_dir() else ():
        if not _is_module(entry) or (kept / entry.name).exists():
            continue
        kept.mkdir(parents=True, exist_ok=True)
        partial = kept / f".{entry.name}.{os.getpid()}"
        shutil.copytree(entry, partial, dirs_exist_ok=True)
        try:
            partial.rename(kept / entry.name)
            added += 1
        except OSError:  # kept meanwhile by another A/B
            shutil.rmtree(partial, ignore_errors=True)
    return added
