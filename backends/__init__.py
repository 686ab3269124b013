"""Backend registry: canonical names, aliases, and a fail-closed lookup."""

from __future__ import annotations

import importlib

from .base import (
    ALL_VISIBILITY_KEYS,
    FATAL,
    POISONED,
    RECOVERABLE,
    Backend,
    BackendUnavailable,
    DeviceTouched,
)

NAMES = ("cuda", "rocm", "musa", "ascend", "interpreter")

__all__ = [
    "ALL_VISIBILITY_KEYS",
    "FATAL",
    "NAMES",
    "POISONED",
    "RECOVERABLE",
    "Backend",
    "BackendUnavailable",
    "DeviceTouched",
    "UnknownBackend",
    "auto_detect",
    "get",
]


class UnknownBackend(ValueError):
    pass


def _load(name: str) -> Backend:
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def _alias_table() -> dict[str, str]:
    table = {}
    for name in NAMES:
        for alias in (name, *_load(name).aliases):
            table[alias] = name
    return table


def get(name: str) -> Backend:
    """The backend for a name or alias; unknown names fail with the list of known ones."""
    table = _alias_table()
    canonical = table.get(name.strip().lower())
    if canonical is None:
        known = ", ".join(f"{n} ({'/'.join(_load(n).aliases)})" for n in NAMES)
        raise UnknownBackend(f"unknown backend '{name}'; known: {known}")
    return _load(canonical)


def auto_detect() -> Backend:
    """The accelerator backend whose devices this machine shows; never the interpreter, which
    must be asked for (a silent CPU fallback would report meaningless timings)."""
    for name in NAMES:
        backend = _load(name)
        if backend.triton_driver and backend.enumerate_devices():
            return backend
    raise BackendUnavailable(
        "no accelerator found on this machine; to run the pipeline without a GPU "
        "use --backend interpreter"
    )
