"""Tests run on the CPU: kernels go through Triton's interpreter, which must be switched on
before triton decorates any kernel (i.e. before any ops module is imported)."""

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.core import launch, paths

os.environ["TRITON_INTERPRET"] = "1"
# The tests' own compiler cache, empty at start: a test must not pass only because the user's
# ~/.triton/cache happens to hold a kernel, nor write into it. A private dir: removed at the end,
# or, when this run was killed, by the next private dir made (paths.make_private_dir).
os.environ["TRITON_CACHE_DIR"] = str(paths.make_private_dir("tests_triton_cache"))
atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
# Those of runs the tests killed outright (a batch's kill, a parent's SIGKILL), the last ones included.
atexit.register(paths.remove_abandoned)
REPO = Path(__file__).resolve().parent.parent

# Fixtures shaped like other projects' test suites (a FlagGems checkout): run by our tests, never
# collected as ours.
collect_ignore = ["resources"]


def harness_env(**extra: str) -> dict[str, str]:
    """The environment of a `python -m harness` subprocess, as the nox sessions give it: the checkout on its
    path, and each backend choosing for itself whether Triton interprets (not this process's setting);
    `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def run_harness(*args, cwd=REPO, timeout=600):
    """`python -m harness ...` in a subprocess, as the nox sessions run it."""
    env = harness_env()
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_dir_of(proc) -> Path:
    for line in reversed(proc.stdout.splitlines()):
        if "run dir: " in line:
            return Path(line.split("run dir: ", 1)[1].strip())
    raise AssertionError(f"no run dir in output:\n{proc.stdout}\n{proc.stderr}")


def load(path: Path):
    return json.loads(Path(path).read_text())


def ab_dir_in(out: str) -> Path:
    """The A/B dir an `ab` names in its output ("ab dir: D")."""
    return Path(next(line for line in out.splitlines() if line.startswith("ab dir: "))[len("ab dir: "):])


# Two pointwise rows and a softmax row, small enough for the interpreter: an A/B of built-ins or test ops.
AB_SHAPES = ("pointwise:\n  shapes: [[300], [2, 700]]\n  dtypes: [fp32]\n"
             "softmax:\n  shapes: [[4, 300]]\n  dtypes: [fp32]\n")


def ab_request(tmp_path: Path, ops: list[str], *extra: str):
    """An interpreter `ab` request over `ops` at AB_SHAPES, its runs under tmp_path/runs."""
    from harness import cli  # here, not above: nothing may import Triton before TRITON_INTERPRET is set

    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(AB_SHAPES)
    return cli.parse_request(["ab", "--ops", *ops, "--backend", "interpreter", "--shapes", str(shapes),
                              "--out", str(tmp_path / "runs"), *extra])


@pytest.fixture
def harness():
    return run_harness


# Whatever a test's processes leave running (however detached) is reparented to this process, where
# `leaves_no_process` finds it.
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
LEFTOVER_GRACE_S = 30  # for a process a test stopped to finish its own stop
RUN_PID = os.getpid()


def _end_run(signum, frame):
    """A SIGTERM (`timeout`, a job scheduler, the end of the nox session that started us) ends the run,
    and first every process a test started, however detached (they all end up our children, the
    subreaper): the default action would end pytest alone, and a test's `python -m harness batch`,
    in a session of its own, would run on."""
    if os.getpid() != RUN_PID:  # a fork a test made of this process: as if this handler were not here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    while children := launch.children():
        launch.kill_and_reap(children)
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


signal.signal(signal.SIGTERM, _end_run)
launch.end_with_starter()  # under `nox -s tests`: SIGTERM once nox is gone, however it died


@pytest.fixture
def pythons_ctrl_c():
    """Python's own Ctrl-C handler (a KeyboardInterrupt) for the test, whatever the test runner installed
    (mutmut's workers ignore SIGINT); the runner's back after it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def closes_the_pipes_of_its_children(monkeypatch):
    """Every test: the pipes of each child it started are closed after it (once leaves_no_process, torn
    down first, ended what still ran). A test that fails while reading its child leaves the Popen to its
    traceback; its files would be finalized unclosed in some later test, which the suite's warnings-as-
    errors would fail instead."""
    started = []

    class Tracked(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Tracked)
    yield
    for proc in started:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # stdin's last flush to a child that is gone
                    stream.close()
        proc.poll()  # its exit noted, where leaves_no_process reaped it: not "still running" when collected


@pytest.fixture(autouse=True)
def leaves_no_process():
    """Every test: no process it started, nor any of theirs, is left running after it (those left
    are killed, and the test fails)."""
    before = set(launch.children())
    yield
    # multiprocessing's resource tracker serves this pytest process for its lifetime (started by the
    # first spawn pool a test makes in-process): it is ours, not the test's, ends with us, and is not
    # waited for (the grace would then hold every such test for its whole length).
    before.update(p for p in launch.children() if "multiprocessing.resource_tracker" in _cmdline(p))
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := [p for p in launch.children() if p not in before and alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    named = {pid: _cmdline(pid) for pid in left}
    launch.kill_and_reap(left)
    assert not named, f"processes left running: {named}"


@pytest.fixture(autouse=True)
def leaves_no_private_dir():
    """Every test: no private dir this process made (paths.make_private_dir: an A/B's side caches, a run's
    Triton cache) is left after it: what opens one must remove it (ab.Runner.close), not the next run."""
    ours = f"zl_*.{os.getpid()}.*"
    before = set(Path(tempfile.gettempdir()).glob(ours))
    yield
    left = sorted(str(p) for p in set(Path(tempfile.gettempdir()).glob(ours)) - before)
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"private dirs left behind: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


# --- processes (faults tests: what a kill or a stop left running) ---------------------------------
def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (a run or batch dir a leftover would name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def exits_of(signum: int) -> tuple[int, ...]:
    """The exit statuses of a harness stopped by `signum`: 128 + signum; after a SIGINT also killed by it once
    its report or line is out (Python ends so when a KeyboardInterrupt reaches its top; seen on loaded CI
    machines only). A shell reads both as 130."""
    return (128 + signum, -signum) if signum == signal.SIGINT else (128 + signum,)


def wait_gone(text: str, seconds: float = 20) -> list[int]:
    """Wait until no process mentions `text`; those still there after `seconds`."""
    deadline = time.monotonic() + seconds
    while pids_mentioning(text) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids_mentioning(text)


def group_pids(pgid: int) -> list[int]:
    """The live members of process group `pgid` (a batch op's, as its `.running` names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it runs nothing and holds no device)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate, timeout: float, interval: float = 0.5) -> bool:
    """Poll `predicate` every `interval` s until it holds (True) or `timeout` seconds pass (then a
    last look decides)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def in_a_case(under: Path) -> bool:
    """Whether a run somewhere under `under` is measuring a case (its child is past start-up):
    what a test that stops a run mid-case waits for, whatever the machine's load."""
    for run_json in under.rglob("run.json"):
        try:
            if json.loads(run_json.read_text()).get("observed", {}).get("running_case"):
                return True
        except (OSError, ValueError):
            continue
    return False


# --- autotuning ---------------------------------------------------------------------------------
class PersistentCache:
    """FlagGems' sqlite config cache in miniature: a mapping that is not a dict."""

    def __init__(self, rows=None):
        self.rows = dict(rows or {})

    def __contains__(self, key):
        return key in self.rows

    def __getitem__(self, key):
        return self.rows[key]

    def __setitem__(self, key, config):
        self.rows[key] = config


# --- kernels compiled for sm_90 on this CPU, launched through a stand-in driver ---------------------
IR_KERNELS = REPO / "tests" / "resources" / "ir_kernels"


def compiling_env(cache_dir: Path) -> dict:
    """A process that compiles for sm_90: Triton out of interpreter mode, the given cache dir."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), TRITON_DEFAULT_FP_FUSION="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


# module name -> a cache dir its `launch_all()` filled, once per test session: Triton's cache is
# content-addressed, so tests that only load from it can share it.
_COMPILED: dict[str, Path] = {}


def _compiled(module_name: str) -> Path:
    if module_name not in _COMPILED:
        import standin_triton

        cache_dir = Path(tempfile.mkdtemp(prefix=f"zl_tests_sm90_{module_name}_"))
        atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
        argv = [sys.executable, standin_triton.__file__, str(IR_KERNELS / f"{module_name}.py")]
        proc = subprocess.run(argv, env=compiling_env(cache_dir), capture_output=True, text=True)
        if proc.returncode != 0:
            # Only a Triton build without the CUDA backend's tools (ptxas) cannot do this.
            assert "ptxas" in proc.stderr, proc.stderr
            pytest.skip(f"cannot compile for sm_90 here: {proc.stderr.strip().splitlines()[-1]}")
        _COMPILED[module_name] = cache_dir
    return _COMPILED[module_name]


def _load_through_standin(monkeypatch, module_name: str, cache_dir: Path | None):
    """`module_name` (in resources/ir_kernels) imported afresh with Triton's JIT on, its launches going
    to a stand-in driver (tests/standin_triton.py). Its compiles go to `cache_dir`, an empty one of
    the test's; with None, to a cache a fresh process filled by launching it first (`launch_all`),
    so this one only loads."""
    import standin_triton

    env = compiling_env(cache_dir or _compiled(module_name))
    for key in ("TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION"):
        monkeypatch.setenv(key, env[key])
    # The JIT's argument binder imports gluon, whose import asserts interpreter mode once triton.jit
    # builds JITFunctions: imported here while the suite's interpreter mode still holds.
    import triton.experimental.gluon  # noqa: F401

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # so triton.jit builds a JITFunction, as in the compiling process
    driver = standin_triton.activate(monkeypatch)
    monkeypatch.syspath_prepend(str(IR_KERNELS))
    sys.modules.pop(module_name, None)
    return importlib.import_module(module_name), driver  # left in sys.modules, as an operator's is


@pytest.fixture
def load_through_standin(monkeypatch):
    """`_load_through_standin`, and at teardown, while the stand-in is still the active driver, the
    loaded kernels released: a CompiledKernel unloads its module from the active driver when it goes."""
    from triton.runtime.jit import JITFunction

    loaded = []

    def load(module_name: str, cache_dir: Path | None = None):
        module, driver = _load_through_standin(monkeypatch, module_name, cache_dir)
        loaded.append(module)
        return module, driver

    yield load
    for module in loaded:
        sys.modules.pop(module.__name__, None)
        for obj in vars(module).values():
            while obj is not None and not isinstance(obj, JITFunction):
                obj = getattr(obj, "fn", None)
            if obj is not None:
                obj.device_caches.clear()
    loaded.clear()
    gc.collect()
