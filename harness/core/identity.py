"""What a run observed about its software: versions and a build identity for the compiler, so two
runs can tell whether they used the same Triton (a FlagTree rebuild keeps its version string)."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path


def versions() -> dict:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__}


def _git_revision(path: Path) -> str | None:
    # An editable (source) install of the compiler: its checkout's revision, dirty or not. An
    # installed wheel has none (a git repo above site-packages, e.g. pyenv's, is not the compiler's).
    if "site-packages" in path.parts or "dist-packages" in path.parts:
        return None
    try:
        out = subprocess.run(["git", "-C", str(path), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def files_digest(root: Path) -> str:
    """sha256 over the names, sizes and mtimes of the package's files: cheap (no file contents)
    and changes on any rebuild or reinstall."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                st = p.stat()
            except OSError:
                continue
            h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def compiler_identity() -> dict:
    return dict(_compiler_identity())


@functools.cache  # a process imports one Triton; a warm worker computes it once for all its steps
def _compiler_identity() -> dict:
    import triton

    root = Path(triton.__file__).resolve().parent
    return {
        "name": "triton",
        "version": triton.__version__,
        "path": str(root),
        "files_digest": files_digest(root),
        "git_revision": _git_revision(root),
    }
