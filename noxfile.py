"""zl_bench sessions: operator-level A/B performance testing for Triton compiler changes.

Every session runs in the Python environment nox was started from (`venv_backend="none"`):
that is where the user's compiler (Triton or a FlagTree build) and torch live, and no session
ever reinstalls either. The light packages the harness needs (pytest, pyyaml, tabulate, numpy,
scipy, matplotlib) are taken from that environment when present; only the missing ones are installed, into
.nox/deps, keeping nothing that would shadow a package the environment already has. So an
offline GPU host with those packages works as is, and a fresh networked machine needs no step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"

HERE = Path(__file__).resolve().parent
DEPS_DIR = HERE / ".nox" / "deps"
BENCH_DEPS = ("pytest", "pyyaml", "tabulate", "numpy", "scipy", "matplotlib", "tqdm")
TEST_DEPS = (*BENCH_DEPS, "ray")  # ray: the batch executor tests run it in local mode

_MISSING = (
    "import sys, importlib.metadata as m\n"
    "def have(d):\n"
    "    try: m.version(d); return True\n"
    "    except m.PackageNotFoundError: return False\n"
    "print('listed:', *[d for d in sys.argv[1:] if not have(d)])\n"
)
_COMPILER = (
    "import sys\n"
    "try:\n"
    "    import torch, triton\n"
    "    print('ok', torch.__version__, triton.__version__)\n"
    "except ImportError as e:\n"
    "    print('missing', sys.executable, e)\n"
)


def _light_deps(session: nox.Session, requirements: tuple[str, ...]) -> None:
    if DEPS_DIR.is_dir():
        session.env["PYTHONPATH"] = str(DEPS_DIR)
    missing = _listed(session.run("python", "-c", _MISSING, *requirements, silent=True))
    if not missing:
        return
    session.log(f"installing missing packages into {DEPS_DIR}: {' '.join(missing)}")
    session.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--target", str(DEPS_DIR), "--upgrade", *missing)
    session.env.pop("PYTHONPATH", None)
    present = _listed(session.run("python", "-c", _MISSING.replace("not have(d)", "have(d)"),
                                  *_dist_names(DEPS_DIR), silent=True))
    _drop_shadowing(DEPS_DIR, set(present))
    session.env["PYTHONPATH"] = str(DEPS_DIR)


def _listed(output: str) -> list[str]:
    # The helper's own line: warnings the interpreter prints around it must not read as names.
    line = next((x for x in output.splitlines() if x.startswith("listed:")), "listed:")
    return line.split()[1:]


def _dist_names(target: Path) -> list[str]:
    return [p.name.split("-")[0] for p in target.glob("*.dist-info")]


def _drop_shadowing(target: Path, present: set[str]) -> None:
    """Remove from `target` every distribution the environment already has (pip --target pulls
    in dependencies such as numpy; a second copy ahead on sys.path would shadow the user's)."""
    for info in target.glob("*.dist-info"):
        if info.name.split("-")[0] not in present:
            continue
        record = info / "RECORD"
        for line in record.read_text().splitlines() if record.exists() else []:
            path = target / line.split(",")[0]
            if path.is_file():
                path.unlink()
        shutil.rmtree(info, ignore_errors=True)
    for d in sorted(target.iterdir()):
        if d.is_dir() and not any(p.is_file() for p in d.rglob("*")):
            shutil.rmtree(d)


def _require_compiler(session: nox.Session) -> None:
    # The last line is the verdict; torch may print warnings (e.g. no numpy yet) before it.
    status = session.run("python", "-c", _COMPILER, silent=True).strip().splitlines()[-1]
    if not status.startswith("ok"):
        session.error(
            f"this Python lacks torch or triton ({status}). Sessions use the compiler of the "
            "environment nox runs in: activate that environment (or install nox into it); "
            "on a fresh CPU machine: pip install torch==2.13.0 triton"
        )


def _harness(session: nox.Session, command: str) -> None:
    _require_compiler(session)
    _light_deps(session, BENCH_DEPS)
    session.run("python", "-m", "harness", command, *session.posargs)


@nox.session
def record(session: nox.Session) -> None:
    """Run one operator over its shapes, sweep autotune, archive configs, shapes, results."""
    _harness(session, "record")


@nox.session
def replay(session: nox.Session) -> None:
    """Rerun a record run dir with its autotune configs, shapes and seeds pinned."""
    _harness(session, "replay")


@nox.session
def ab(session: nox.Session) -> None:
    """A records, then A and B replay A's configs interleaved; statistics and a report."""
    _harness(session, "ab")


@nox.session
def batch(session: nox.Session) -> None:
    """Screen many operators across devices: isolated, timeouts, retries, resume, CSVs."""
    _harness(session, "batch")


@nox.session(name="inventory-regen")
def inventory_regen(session: nox.Session) -> None:
    """Rebuild ops/inventory_<repo>.csv by a static scan (built-in ops, or --flaggems-dir checkouts)."""
    # A static scan imports no operator, so unlike the benchmark sessions this one runs without
    # torch or triton; --verify-collect runs pytest on the checkout, which brings its own needs.
    _light_deps(session, ("pytest", "pyyaml"))
    session.run("python", "-m", "harness", "inventory-regen", *session.posargs)


@nox.session(tags=["ci"])
def tests(session: nox.Session) -> None:
    """The project's own tests (CPU only, interpreter backend)."""
    _require_compiler(session)
    _light_deps(session, TEST_DEPS)
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(venv_backend="virtualenv", tags=["ci"])
def lint(session: nox.Session) -> None:
    """Static checks (ruff)."""
    session.install("ruff")
    session.run("ruff", "check", ".")
