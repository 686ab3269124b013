"""The light packages the harness needs, and the checkout's .nox/deps where the nox sessions put
the ones the environment lacks.

The noxfile runs `python -m harness.core.deps missing|present|install-line ...` in the session's Python instead of
inline `python -c` scripts. Nothing here imports torch or triton: importing torch costs seconds.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

DEPS_DIR = Path(__file__).resolve().parents[2] / ".nox" / "deps"
# Distribution names, as pip installs them.
HARNESS = ("pytest", "pyyaml", "tabulate", "numpy", "scipy", "matplotlib", "tqdm", "jinja2")
# inventory-regen is a static scan: it imports no operator, so it runs without torch and the rest.
NEEDS = {"inventory-regen": ("pytest", "pyyaml")}


# Rough installed size (MB) of each distribution a session may install, with the dependencies it pulls in
# that an environment holding torch usually lacks: the line before an install says what it will cost
# (the tests' ray, submitit and jsonschema came to ~585 MB, a silent minute or more). Estimates measured
# once on Linux x86_64 (2026-12); a distribution not listed is said as of unknown size.
SIZES_MB = {"pytest": 4, "pyyaml": 2, "tabulate": 0.2, "numpy": 60, "scipy": 110, "matplotlib": 60, "tqdm": 0.3,
            "jinja2": 1, "ray": 580, "submitit": 1, "jsonschema": 5, "pytest-xdist": 0.3, "mutmut": 25, "ruff": 30,
            "import-linter": 3}


def needed(command: str | None) -> tuple[str, ...]:
    """The distributions `python -m harness COMMAND` needs."""
    return NEEDS.get(command, HARNESS)


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(dists) -> list[str]:
    return [d for d in dists if not _installed(d)]


def install_line(dists) -> str:
    """What installing `dists` costs, roughly, in one line: `3 packages, ~586 MB with what they pull in
    (rough): ray ~580 MB, ...`."""
    unknown = [d for d in dists if d not in SIZES_MB]
    rough = "rough" + (f"; {len(unknown)} of unknown size" if unknown else "")
    each = ", ".join(f"{d} {_megabytes(SIZES_MB[d])}" if d in SIZES_MB else f"{d} (size unknown)" for d in dists)
    return (f"{len(dists)} package{'s' * (len(dists) != 1)}, {_megabytes(sum(SIZES_MB.get(d, 0) for d in dists))} "
            f"with what they pull in ({rough}): {each}")


def _megabytes(mb: float) -> str:
    return "<1 MB" if mb < 1 else f"~{mb:.0f} MB"


def search_path(inherited: str | None) -> list[str]:
    """The inherited PYTHONPATH entries, then .nox/deps when it exists and is not among them: last,
    so it never shadows a package the environment has."""
    entries = [p for p in (inherited or "").split(os.pathsep) if p]
    if DEPS_DIR.is_dir() and str(DEPS_DIR) not in entries:
        entries.append(str(DEPS_DIR))
    return entries


def use_deps_dir() -> None:
    """Make this process find what a nox session installed into .nox/deps (`python -m harness`
    started without nox)."""
    for entry in search_path(None):
        if entry not in sys.path:
            sys.path.append(entry)


def main(argv: list[str]) -> int:
    """missing COMMAND [DIST...]: what COMMAND (a harness command, or `tests`) needs plus DIST, that
    this environment lacks; present DIST...: those it has; install-line DIST...: what installing them
    costs (install_line)."""
    what, args = argv[0], argv[1:]
    if what == "missing":
        print(*missing([*needed(args[0]), *args[1:]]))
    elif what == "present":
        print(*[d for d in args if _installed(d)])
    elif what == "install-line":
        print(install_line(args))
    else:
        print(f"error: unknown request {what!r}; expected missing, present or install-line", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
