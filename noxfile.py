"""zl_bench sessions: operator-level A/B performance testing for Triton compiler changes.

Every session runs in the Python environment nox was started from (`venv_backend="none"`):
that is where the user's compiler (Triton or a FlagTree build) and torch live, and no session
ever reinstalls either. The light packages the harness needs (harness.core.deps lists them: pytest,
pyyaml, tabulate, numpy, scipy, matplotlib, tqdm, jinja2) are taken from that environment when present;
only the missing ones are installed, into .nox/deps, keeping nothing that would shadow a package
the environment already has. So an offline GPU host with those packages works as is, and a fresh
networked machine needs no step.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import importlib.util
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import nox
import nox.command

nox.options.default_venv_backend = "none"
# A bare `nox` runs the project's own checks (and `nox -l` marks those selected); the benchmark sessions
# and mutants run when named. Not for `--json`: nox's JSON listing holds only the sessions a bare run
# selects, and `nox -l --json` must list every session (CI builds its job matrix from it).
_nox_args = sys.argv[1:sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
if "--json" not in _nox_args:
    nox.options.sessions = ["tests", "lint"]

HERE = Path(__file__).resolve().parent
DEPS_DIR = HERE / ".nox" / "deps"
MUTANTS_DIR = HERE / "mutants"
# nox probes for uv before every session, whatever its venv_backend (nox.virtualenv.get_virtualenv
# asks for OPTIONAL_VENVS first), and logs "uv binary not found." where there is none. No session
# here uses uv: the line only alarms.
logging.getLogger("nox").addFilter(lambda record: record.getMessage() != "uv binary not found.")
# What nox says of a command that a Ctrl-C or SIGTERM stopped: "Interrupted...", when nox got the Ctrl-C
# too, else "Command ... failed with exit code 130" (or 143).
_STOPPED_LINE = re.compile(rf"Interrupted\.\.\.|Command .* failed with exit code ({128 + signal.SIGINT}|"
                           rf"{128 + signal.SIGTERM})")
# The harness (and the tests' pytest, tests/conftest.py) stop when the process this names, nox, dies.
END_WITH_ENV = "ZL_BENCH_END_WITH_PID"
# How often a log (not a terminal) gets mutmut's status line, which it redraws every 0.1 s on a terminal,
# behind a spinner glyph (a braille pattern).
MUTMUT_STATUS_EVERY_S = 60.0
_SPINNER = re.compile(r"^[\u2800-\u28ff] ")


def _python() -> str:
    """The interpreter the sessions' commands run: the one nox runs in, whose compiler _require_compiler
    checked. Named `python` where that is what PATH finds first (the usual activated environment), else
    by its path: nox started as `/path/to/env/bin/nox` from another environment must not measure that
    other environment's compiler."""
    found = shutil.which("python")
    same = found is not None and os.path.dirname(os.path.abspath(found)) == os.path.dirname(sys.executable)
    return "python" if same else sys.executable


def _check(session: nox.Session, *args: str) -> str:
    """The last line `python -m harness.core.deps ARGS` prints in the session's Python; not echoed, it
    is bookkeeping (a failure still shows the command and its output)."""
    lines = session.run(_python(), "-m", "harness.core.deps", *args, silent=True, log=False).splitlines()
    return lines[-1] if lines else ""


# Beyond what `python -m harness` needs, the tests import: ray and submitit (the batch executor tests
# drive a local Ray instance, a two-node Ray cluster and a single-node Slurm on this machine) and
# jsonschema (reports are checked against their schemas); pytest-xdist runs them in parallel (the tests session).
TEST_EXTRAS = ("ray", "submitit", "jsonschema", "pytest-xdist")
# A worker a CPU: much of an end-to-end test is waiting (a subprocess's start-up, a timeout, a grace), which
# another worker's test fills. loadfile: a test file's tests run on one worker, one after another, as its
# module fixtures assume (tests/test_slurm_executor.py's `slurm` starts a Slurm where none answers and
# stops it at the module's end: a second worker's would stop the first one's). Not loadgroup: under pytest 9
# its xdist_group marks group nothing (xdist 3.8 renames a node through an attribute pytest no longer reads).
# posargs come after, so `-n 0` runs the tests in this one process.
TESTS_PARALLEL = ("-n", "auto", "--dist", "loadfile")


def _light_deps(session: nox.Session, command: str, *extra: str) -> None:
    """Install what `python -m harness COMMAND` (harness.core.deps.needed) and `extra` need and this
    environment lacks into .nox/deps, and put that on the session's PYTHONPATH."""
    session.env.pop("PYTHONPATH", None)  # the environment's own packages alone
    installed = _dist_names(DEPS_DIR) if DEPS_DIR.is_dir() else []
    if installed:
        # What the environment gained since (`pip install -e .` installs the light packages): its copy
        # in .nox/deps, first on PYTHONPATH, would shadow the environment's.
        _drop_shadowing(DEPS_DIR, set(_check(session, "present", *installed).split()))
    if DEPS_DIR.is_dir():
        session.env["PYTHONPATH"] = str(DEPS_DIR)
    missing = _check(session, "missing", command, *extra).split()
    if not missing:
        return
    session.log(f"installing into {DEPS_DIR}: {_check(session, 'install-line', *missing)}")
    # pip's own progress bar where a person watches; in a log, its errors only.
    quiet = () if sys.stdout.isatty() else ("--quiet", "--progress-bar", "off")
    session.run(_python(), "-m", "pip", "install", *quiet, "--disable-pip-version-check",
                "--target", str(DEPS_DIR), "--upgrade", *missing)
    session.env.pop("PYTHONPATH", None)
    _drop_shadowing(DEPS_DIR, set(_check(session, "present", *_dist_names(DEPS_DIR)).split()))
    session.env["PYTHONPATH"] = str(DEPS_DIR)


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
    # Found in this process, not imported (import torch alone costs seconds), and no subprocess:
    # the sessions run in the environment nox runs in.
    absent = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if absent:
        status = f"missing {' '.join(absent)} in {sys.executable}"
        session.error(
            f"this Python lacks torch or triton ({status}). Sessions use the compiler of the "
            "environment nox runs in: activate that environment (or install nox into it); "
            "on a fresh CPU machine: pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 "
            "&& pip install triton (PyPI's torch is the CUDA build, several GB)"
        )


def _run_harness(session: nox.Session, command: str) -> None:
    """`python -m harness COMMAND posargs`, which takes a Ctrl-C as it does without nox: nox does
    not cut its stop short (its default: SIGTERM 0.3 s after the interrupt, SIGKILL 0.2 s later;
    the harness bounds its own stop and kills what does not end in time), and the harness stops
    when nox dies (harness.core.launch.end_with).

    nox ends with 1 for any failed session; the harness's exit codes mean more (README, When things
    go wrong), so a failure ends nox with the harness's own code, after nox's line naming it. After a
    stop, the harness's own last lines, which say what it stopped and what it kept, end the output:
    nox's lines about the stop are left out, and so is its line saying the session was interrupted."""
    logging.getLogger("nox").addFilter(_not_a_stop_line)
    try:
        session.run(_python(), "-m", "harness", command, *session.posargs,
                    env={END_WITH_ENV: str(os.getpid())}, interrupt_timeout=None, terminate_timeout=None)
    except nox.command.CommandFailed as failed:
        # A child killed by signal N reads -N here; a shell would say 128+N.
        code = failed.return_code
        sys.exit(128 - code if code < 0 else code)
    except KeyboardInterrupt:  # nox got the Ctrl-C as well, and waited for the harness to stop
        sys.exit(128 + signal.SIGINT)
    finally:
        logging.getLogger("nox").removeFilter(_not_a_stop_line)


def _not_a_stop_line(record: logging.LogRecord) -> bool:
    return not _STOPPED_LINE.fullmatch(record.getMessage())


def _harness(session: nox.Session, command: str) -> None:
    _require_compiler(session)
    _light_deps(session, command)
    _run_harness(session, command)


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
def bisect(session: nox.Session) -> None:
    """The first build in an ordered list (or a git range) at which given rows moved; A/B probes."""
    _harness(session, "bisect")


@nox.session
def batch(session: nox.Session) -> None:
    """Screen many operators across devices: isolated, timeouts, retries, resume, CSVs."""
    _harness(session, "batch")


@nox.session(name="inventory-regen")
def inventory_regen(session: nox.Session) -> None:
    """Rebuild ops/inventory_<repo>.csv by a static scan (built-in ops, or --flaggems-dir checkouts)."""
    # A static scan imports no operator, so unlike the benchmark sessions this one runs without
    # torch or triton; --verify-collect runs pytest on the checkout, which brings its own needs.
    _light_deps(session, "inventory-regen")
    _run_harness(session, "inventory-regen")


@nox.session(tags=["ci"])
def tests(session: nox.Session) -> None:
    """The project's own tests (CPU only, interpreter backend), on every CPU (pytest-xdist)."""
    _require_compiler(session)
    _light_deps(session, "tests", *TEST_EXTRAS)
    _run_as_tree(session, _python(), "-m", "pytest", *TESTS_PARALLEL, *session.posargs,
                 env={END_WITH_ENV: str(os.getpid())})


@nox.session(venv_backend="virtualenv", tags=["ci"])
def lint(session: nox.Session) -> None:
    """Static checks: ruff, and the import layers of harness/ (import-linter, pyproject.toml)."""
    session.install("ruff", "import-linter")
    session.run("ruff", "check", ".")
    session.run("lint-imports")


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the logic modules against the fast tests; a score per module."""
    # What is mutated and which tests run: [tool.mutmut] in pyproject.toml. posargs go to `mutmut
    # run` (mutant name globs such as 'harness.providers.shapes.*', --max-children N).
    _require_compiler(session)
    _light_deps(session, "tests", *TEST_EXTRAS, "mutmut")  # the tests import what they test
    # mutmut keeps verdicts between runs and retests a survivor only when it is named: a fresh
    # tree makes the score that of the tests as they are now.
    shutil.rmtree(MUTANTS_DIR, ignore_errors=True)
    _run_without_spinner(session, _python(), "-m", "mutmut", "run", *session.posargs)
    results = session.run(_python(), "-m", "mutmut", "results", "--all", "true", silent=True, log=False)
    _print_mutation_scores(results)


def _run_as_tree(session: nox.Session, *args: str, **kwargs) -> None:
    """session.run(*args, **kwargs), nothing of which outlives the session: nox becomes the subreaper of
    what the command starts, a SIGTERM to nox (`timeout`, a job scheduler) is passed on to the command,
    and once the command ended, what is left of its tree is killed. A signal to the command or its group
    misses part of it: the tests start harness processes in sessions of their own, and mutmut's fork
    server and its pytest processes outlive a mutmut killed alone. A SIGTERM ends nox too (128+15), as
    it would without this handler: the sessions after this one (`nox -s tests lint`) do not start."""
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    stopped: list[int] = []
    ended = threading.Event()

    def pass_on(signum, frame) -> None:
        stopped.append(signum)
        if not _pass_on(signum, frame):  # the command has not started yet: it gets the signal once it has
            threading.Thread(target=_pass_on_once_started, args=(signum, ended), daemon=True).start()

    previous = signal.signal(signal.SIGTERM, pass_on)
    try:
        session.run(*args, **kwargs)
    finally:
        ended.set()
        signal.signal(signal.SIGTERM, previous)
        _end_children()
        if stopped:
            session.log(f"stopped by {signal.Signals(stopped[0]).name}: no further session runs")
            sys.exit(128 + stopped[0])


def _pass_on(signum, frame) -> int:
    """`signum` to this process's children: the session's command (and what came here as its subreaper);
    how many. nox's wait for the command goes on, and sees it end. Raised here as a KeyboardInterrupt
    instead, it could land as that wait reaps the command, and lose its exit status: Python's subprocess
    then reads the command as having exited 0, and nox calls the session successful."""
    children = _children()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    return len(children)


def _pass_on_once_started(signum: int, ended: threading.Event) -> None:
    """`signum` to the session's command as soon as it has started (a stop that came before it did would
    otherwise let it run whole), unless the session's run ends first."""
    while not ended.wait(0.05):
        if _pass_on(signum, None):
            return


def _end_children() -> None:
    """SIGKILL and reap every child of this process, and theirs as they come here (the subreaper),
    until none is left."""
    while children := _children():
        for pid in children:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def _children() -> list[int]:
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit():
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:  # the field after the name: its ppid
                        found.append(int(entry.name))
    return found


def _run_without_spinner(session: nox.Session, *args: str) -> None:
    """mutmut's `run`, which redraws its status line with a spinner every 0.1 s and has no option against
    it: as is on a terminal; into a log, the lines it ends, and its status once every
    MUTMUT_STATUS_EVERY_S."""
    if sys.stdout.isatty():
        _run_as_tree(session, *args)
        return
    read_fd, write_fd = os.pipe()
    copier = threading.Thread(target=_copy_status_lines, args=(read_fd, MUTMUT_STATUS_EVERY_S), daemon=True)
    copier.start()
    try:
        with os.fdopen(write_fd, "w") as writer:
            _run_as_tree(session, *args, stdout=writer)
    finally:
        copier.join()  # its last line, stopped or not: the tree is gone, nothing else holds the pipe open


def _copy_status_lines(read_fd: int, every_s: float) -> None:
    """Copy what arrives on `read_fd` to stdout: each line ended by a newline, and of the lines redrawn
    in place (ended by a carriage return) the latest, at most once every `every_s` and before the next
    ended line; the spinner glyph in front of them dropped."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending, latest, shown_at = "", "", time.monotonic()
    with os.fdopen(read_fd, "rb") as reader:
        while chunk := reader.read1(65536):
            *segments, pending = re.split(r"(?<=[\r\n])", pending + decoder.decode(chunk))
            for segment in segments:
                text = _SPINNER.sub("", segment[:-1]).rstrip()
                if segment.endswith("\n"):
                    print(text or latest, flush=True)
                    latest = ""
                elif text:
                    latest = text
                    if time.monotonic() - shown_at >= every_s:
                        print(latest, flush=True)
                        latest, shown_at = "", time.monotonic()
    last = _SPINNER.sub("", pending).rstrip() or latest  # the line it was redrawing
    if last:
        print(last, flush=True)


def _print_mutation_scores(results: str) -> None:
    """Print each mutant the tests did not catch, then killed / total per module (a timeout counts as
    killed: the mutant hung the tests). `results` is `mutmut results --all true`, one `KEY: STATUS`
    line per mutant, KEY = MODULE.x_FUNCTION__mutmut_N or MODULE.xǁCLASSǁMETHOD__mutmut_N."""
    caught = ("killed", "timeout")
    by_module: dict[str, Counter] = defaultdict(Counter)
    for key, status in re.findall(r"^\s+(\S+): (.+)$", results, re.MULTILINE):
        by_module[re.split(r"\.x[_ǁ]", key, maxsplit=1)[0]][status] += 1
        if status not in (*caught, "not checked"):
            print(f"{status:>12}  {key}")
    # Aligned by hand: tabulate may be only in .nox/deps, which this process (nox's own) does not see.
    width = max([len("module"), *map(len, by_module)]) + 2
    print(f"\n{'module':<{width}}{'killed / total':>16}  not killed")
    for module, counts in sorted(by_module.items()):
        killed, total = sum(counts[s] for s in caught), sum(counts.values())
        if counts["not checked"] == total:
            print(f"{module:<{width}}{'not run':>16}")
            continue
        rest = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in caught)
        print(f"{module:<{width}}{f'{killed} / {total}':>16}  {killed / total:4.0%}  {rest}")
    print("\none mutant's change: PYTHONPATH=.nox/deps python -m mutmut show KEY")
