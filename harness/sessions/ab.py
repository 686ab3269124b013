"""The A/B experiment: side A records once, each side replays A's configs once, untimed, for its IR
and per-kernel attribution (the passes steps), then both sides replay A's configs in separate
processes, interleaved A B A B ... for N repeats, so drift and heat hit both sides alike.

A side differs from the other by environment variables (a compiler switch) and/or a Python
interpreter (a second compiler build installed side by side). Every step's output goes to
ab.log; ab.json says what completed, so an interrupted A/B still reports what it has.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import backends
from harness.core import bounded, deps, forkserver, host_modules, identity, launch, paths, rundir
from harness.core import spec as spec_mod
from harness.core.errors import UsageError, clip, clip_text
from harness.core.options import (
    AUTO,
    DEFAULT_MAX_REPEATS,
    DEFAULT_RESOLVE,
    FDR,
    FIRST_REPEATS,
    MAX_REPEATS,
    MAX_RESOLVE,
    MIN_RESOLVE,
    STEP_PASSES,
    STEP_STARTS,
    UPSTREAM,
    ExperimentOptions,
    RunOptions,
    percent,
    percent_text,
    valid_fdr,
    valid_max_repeats,
    valid_repeats_choice,
    valid_resolve,
)
from harness.core.outcome import Outcome
from harness.core.request import RunRequest
from harness.core.results import ResultsError, read_results
from harness.measure import ir
from harness.providers import catalog, flaggems, probe, registry
from harness.sessions import resolve

DEFAULT_PLAN = paths.REPO_ROOT / "ops" / "ab_default.yaml"
SIDE_FIELDS = {"label", "env", "python", "requirements"}
SEQUENTIAL_FIELDS = ("first", "max_repeats", "resolve")  # a plan's, with repeats auto only
STEP_GRACE_S = 30  # for an interrupted step to write its results and summary
LOG_FILE = "ab.log"
# prewarmed: at most this many workers a side importing or waiting at once, whatever --repeats asks (a
# 3-repeat op begins 5 for A: its record, passes and repeats). A step past them gets a worker begun as it
# starts, its imports paid before it times, nothing timed beside them.
PREWARM_MAX_PER_SIDE = 6


class PlanError(ValueError):
    pass


@dataclasses.dataclass
class Side:
    name: str
    label: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    python: str | None = None
    requirements: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        parts = [self.label] if self.label else []
        parts += [f"{k}={v}" for k, v in self.env.items()]
        if self.python:
            parts.append(f"python={self.python}")
        if self.requirements:
            parts.append(f"pip: {' '.join(self.requirements)}")
        return " ".join(parts) or "as is"


@dataclasses.dataclass
class Plan:
    name: str
    ops: list[str]
    a: Side
    b: Side
    repeats: int | str = 3  # or AUTO: sequential repeats, in rounds (Runner.run)
    # With repeats AUTO: the first round's repeats per side, the most any row gets, and the smallest change
    # (a fraction: stored so; a plan file may say `1%`) a row is timed to resolve; reports.sequential.Schedule
    # (Schedule.from_plan reads them back from ab.json). In a stored plan only when AUTO.
    first: int = FIRST_REPEATS
    max_repeats: int = DEFAULT_MAX_REPEATS
    resolve: float = DEFAULT_RESOLVE
    # The false discovery rate of the report's FASTER/SLOWER calls (reports.stats.adjust).
    fdr: float = FDR
    # Where and what A's record runs and how it measures. Both sides' replays are given only what a
    # replay takes (RunOptions.for_replay): the backend, FlagGems level, switch and cache and the
    # measurement stay the record's, so both sides run the same level, switch and tuning space.
    options: RunOptions = RunOptions()
    # prewarmed: fresh processes at fork's pace; fork's repeats came out more alike on an H200 (docs/performance.md)
    step_start: str = "prewarmed"
    step_passes: str = "once"

    def request(self, command: str, target: str, run_dir: Path, only: str | None = None,
                cases: tuple[str, ...] | None = None) -> RunRequest:
        """One step of this plan, run in `run_dir`: A's record, or a replay of it (of `cases` only, where given)."""
        options = self.options if command == "record" else self.options.for_replay()
        return RunRequest(command, target, options, color="never", run_dir=run_dir, only=only, cases=cases)

    def to_dict(self) -> dict:
        """The plan as the yaml `load_plan` reads (its paths absolute); no device: a corpus A/B gives
        each op's A/B its own."""
        sides = {s.name.lower(): {k: v for k, v in dataclasses.asdict(s).items() if k != "name"}
                 for s in (self.a, self.b)}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("a", "b", "options")}
        if not self.sequential:
            own = {k: v for k, v in own.items() if k not in SEQUENTIAL_FIELDS}
        return {**own, **sides, **self.options.to_dict()}

    @property
    def sequential(self) -> bool:
        return self.repeats == AUTO

    def describe_repeats(self) -> str:
        if not self.sequential:
            return f"{self.repeats} repeats interleaved"
        return (f"repeats {AUTO}: {self.first} interleaved, then one more per side a round for the rows still open, "
                f"up to {self.max_repeats} (resolving {percent_text(self.resolve)})")

    @property
    def first_repeats(self) -> int:
        """The repeats per side every row gets: all of them, or the first round's."""
        return self.first if self.sequential else self.repeats


def _side(data, name: str, where: str, base: Path) -> Side:
    if data is None:
        return Side(name, "")
    if not isinstance(data, dict):
        raise PlanError(f"{where}: side '{name}' must be a mapping")
    unknown = set(data) - SIDE_FIELDS
    if unknown:
        raise PlanError(f"{where}: side '{name}': unknown fields {clip(sorted(map(str, unknown)))} "
                        f"(allowed: {sorted(SIDE_FIELDS)})")
    requirements = data.get("requirements") or []
    if isinstance(requirements, str):  # a requirements file, relative to the plan
        try:
            requirements = bounded.read_lines(base / requirements, "requirements file")
        except bounded.InputRefused as exc:
            raise PlanError(f"{where}: side '{name}': requirements file {exc}") from exc
    if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
        raise PlanError(f"{where}: side '{name}': requirements must be a list of pip specifiers or a file name")
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise PlanError(f"{where}: side '{name}': env must be a mapping of NAME: value")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise PlanError(f"{where}: side '{name}': env name {clip(key)} is not a variable name")
        # yaml reads `true`, `null` and `on` as non-strings, whose str() is no value a switch expects.
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise PlanError(f"{where}: side '{name}': env {clip_text(key)}: {clip(value)} is not a string or a number "
                            "(quote it: '1', 'true')")
    for field in ("label", "python"):
        if data.get(field) is not None and not isinstance(data[field], str):
            raise PlanError(f"{where}: side '{name}': {field} must be a string, not {data[field]!r:.60}")
    python = data.get("python")
    if python is not None:
        # Relative to the plan, like its other paths; absolute, since each step runs from elsewhere. Not
        # resolved: a venv's python is a link whose target has none of the venv's packages.
        python = os.path.abspath(base / python)
        problem = bounded.path_problem(python, "executable")
        if problem is not None:
            raise PlanError(f"{where}: side '{name}': python {python} {problem}")
    return Side(name, str(data.get("label") or ""), {str(k): str(v) for k, v in env.items()}, python,
                requirements)


def load_plan(path: Path) -> Plan:
    path = Path(path)
    return plan_from_data(rundir.read_yaml_mapping(path, PlanError, "plan"), path)


def plan_from_data(data: dict, path, base: Path | None = None) -> Plan:
    """A plan from its mapping (a plan file's, or the one a corpus A/B stored in its batch.json),
    every field checked for type and range; relative paths are relative to `base` (default: the
    plan file's folder)."""
    base = Path(path).parent if base is None else base
    if not isinstance(data, dict):
        raise PlanError(f"plan {path}: top level must be a mapping")
    allowed = {f.name for f in dataclasses.fields(Plan) if f.name != "options"} | {
        f.name for f in dataclasses.fields(RunOptions)}
    unknown = set(data) - allowed
    if unknown:
        raise PlanError(f"plan {path}: unknown fields {clip(sorted(map(str, unknown)))} (allowed: {sorted(allowed)})")
    if data.get("name") is not None and not isinstance(data["name"], str):
        raise PlanError(f"plan {path}: 'name' must be a string, not {data['name']!r:.60}")
    options = RunOptions.from_dict(
        data, lambda name, value, what: PlanError(f"plan {path}: '{name}' must be {what}, not {value!r:.60}"), base)
    ops = data.get("ops")
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
        raise PlanError(f"plan {path}: 'ops' must be a non-empty list of operator names")
    repeats = data.get("repeats", 3)
    if not valid_repeats_choice(repeats):
        raise PlanError(f"plan {path}: 'repeats' must be an integer from 2 to {MAX_REPEATS} (a row's spread between "
                        f"repeats is its noise) or {AUTO}, not {clip(repeats)}")
    sequential = _sequential_fields(data, path) if repeats == AUTO else {}
    given = [name for name in SEQUENTIAL_FIELDS if data.get(name) is not None]
    if repeats != AUTO and given:
        raise PlanError(f"plan {path}: {', '.join(given)}: only with repeats: {AUTO} (its repeats are {repeats})")
    fdr = data.get("fdr", FDR)
    if not valid_fdr(fdr):
        raise PlanError(f"plan {path}: 'fdr' must be a number between 0 and 1, not {clip(fdr)}")
    for name, choices in (("step_start", STEP_STARTS), ("step_passes", STEP_PASSES)):
        if data.get(name) is not None and data[name] not in choices:
            raise PlanError(f"plan {path}: '{name}' must be one of {', '.join(choices)}, not {clip(data[name])}")
    steps = {name: data[name] for name in ("step_start", "step_passes") if data.get(name) is not None}
    return Plan(name=str(data.get("name") or Path(path).stem), ops=ops, repeats=repeats, fdr=float(fdr),
                options=options, **sequential, a=_side(data.get("a"), "A", str(path), base),
                b=_side(data.get("b"), "B", str(path), base), **steps)


def _sequential_fields(data: dict, path) -> dict:
    """A sequential plan's first, max_repeats and resolve (`1%` as --resolve takes it, or the fraction
    0.01 as a stored plan keeps it), each checked."""
    out = {}
    max_repeats = data.get("max_repeats", DEFAULT_MAX_REPEATS)
    if not valid_max_repeats(max_repeats):
        raise PlanError(f"plan {path}: 'max_repeats' must be an integer from {FIRST_REPEATS} to {MAX_REPEATS}, "
                        f"not {clip(max_repeats)}")
    out["max_repeats"] = max_repeats
    first = data.get("first", FIRST_REPEATS)
    if type(first) is not int or not FIRST_REPEATS <= first <= max_repeats:
        raise PlanError(f"plan {path}: 'first' must be an integer from {FIRST_REPEATS} to max_repeats "
                        f"({max_repeats}), not {clip(first)}")
    out["first"] = first
    resolve = data.get("resolve", DEFAULT_RESOLVE)
    if isinstance(resolve, str):
        try:
            resolve = percent(resolve)
        except argparse.ArgumentTypeError as exc:  # said in the plan's terms
            raise PlanError(f"plan {path}: 'resolve' {exc}") from exc
    if not valid_resolve(resolve):
        raise PlanError(f"plan {path}: 'resolve' must be a percentage above {percent_text(MIN_RESOLVE)} and below "
                        f"{percent_text(MAX_RESOLVE)} (`1%`, or the fraction 0.01), not {clip(data['resolve'])}")
    out["resolve"] = float(resolve)
    return out


SIDE_ENVS = paths.REPO_ROOT / ".nox" / "ab-envs"
_SITE_DIRS = "import json, site; print(json.dumps(site.getsitepackages() + [site.getusersitepackages()]))"


def build_side_env(side: Side, log, root: Path = SIDE_ENVS) -> str:
    """A virtual environment for a side's pip requirement set; returns its interpreter.

    The new env sees the base environment's packages through a .pth file placed after its own
    site-packages, so only what the requirements name (say, another triton) differs from the
    base, and nothing is installed into the base. Envs are cached by base interpreter and
    requirement set; a failed build leaves no env marked complete."""
    import hashlib
    import json

    base = side.python or sys.executable
    key = hashlib.sha256("\n".join([base, *sorted(side.requirements)]).encode()).hexdigest()[:12]
    env_dir = root / key
    python = env_dir / "bin" / "python"
    if (env_dir / ".complete").is_file():
        return str(python)
    shutil.rmtree(env_dir, ignore_errors=True)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"building side {side.name}'s env ({' '.join(side.requirements)}) in {env_dir} ...", flush=True)
    subprocess.run([base, "-m", "venv", str(env_dir)], check=True, stdout=log, stderr=subprocess.STDOUT)
    site_dirs = json.loads(subprocess.run([base, "-c", _SITE_DIRS], check=True, capture_output=True,
                                          text=True).stdout)
    own_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
    # "zz" sorts last: the base's packages, then the PYTHONPATH entries the harness runs with and
    # .nox/deps (the sessions' light packages), come after the side's own. The side runs with only
    # the checkout on PYTHONPATH, which would otherwise shadow what its requirements installed.
    inherited = [p for p in deps.search_path(os.environ.get("PYTHONPATH")) if Path(p).is_dir()]
    (Path(own_site) / "zz_zl_base_env.pth").write_text(
        "\n".join(d for d in [*site_dirs, *inherited] if Path(d).is_dir()) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *side.requirements], check=True, stdout=log, stderr=subprocess.STDOUT)
    (env_dir / ".complete").write_text("\n".join(side.requirements) + "\n")
    return str(python)


_TRITON_DIR = ("import importlib.util; s = importlib.util.find_spec('triton'); "
               "print(s.submodule_search_locations[0] if s else '')")


class SideUnidentified(RuntimeError):
    """The side's Python could not say which Triton it imports."""


def side_compiler_key(side: Side) -> dict:
    """What a side's compiled kernels depend on: its interpreter, the build of the Triton that
    interpreter imports under the side's environment (identity.files_digest: changes on any rebuild
    or reinstall), and that environment (compiler switches). Found without importing Triton."""
    python = side.python or sys.executable
    try:
        probe = subprocess.run([python, "-c", _TRITON_DIR], capture_output=True, text=True, timeout=60,
                               env={**os.environ, **side.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SideUnidentified(f"{python}: {exc}") from exc
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or [""])[-1]
        raise SideUnidentified(f"{python} exited {probe.returncode}" + (f": {last}" if last else ""))
    found = probe.stdout.strip()
    triton = {"path": found, "files_digest": identity.files_digest(Path(found))} if found else {"path": None}
    key = {"python": str(Path(python).resolve()), "triton": triton, "env": dict(sorted(side.env.items()))}
    key["digest"] = hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:16]
    return key


def _same_args(argv: list[str]) -> tuple[str, ...]:
    """A step's arguments less what each A/B names afresh (its run dir, its sides' caches): equal for the
    same step of an A/B and of its continuation, down to the record a replay replays and its cases."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--run-dir", "--triton-cache"):
            skip = True
        else:
            out.append(arg)
    return tuple(out)


class StepInterrupted(launch.Stopped):
    """A Ctrl-C or a SIGTERM reached the A/B during a step, went on to the step, and the step has
    stopped."""


ROW_LINE = re.compile(r"\[(\d+)/(\d+|\?)\] ")  # a run's line per case as its row lands (results plugin)


def _case_progress(line: str) -> None:
    """A step's cases as they land, `1/4 2/4 ...` after its `... A records ...` line: a record or
    replay of big shapes (or on the interpreter) takes minutes, and a silent one looks hung."""
    found = ROW_LINE.match(line)
    if found:
        print(f" {found[1]}/{found[2]}", end="", flush=True)


class Runner:
    """Runs the steps of one A/B in subprocesses and keeps ab.json current. Each step is a process
    of its own: started fresh, forked by its side's warm worker (step_start fork: the worker imported
    torch, triton and pytest once, a step pays only for its device and its work), or forked by a warm
    worker of its own begun before the op's first step (prewarmed). A worker that
    dies is restarted once for the step, which is retried in a new run dir; after that the step
    fails."""

    def __init__(self, plan: Plan, ab_dir: Path, earlier: list[dict] = ()):
        self.plan = plan
        self.dir = ab_dir
        # The completed steps of an interrupted A/B of this plan (--continue), by step and arguments: each
        # is taken over, not run again (see step).
        self.earlier = {(s["step"], _same_args(s["args"])): s for s in earlier if s.get("usable") and s.get("step")}
        self.log = rundir.open_write(ab_dir / LOG_FILE)
        self.state = {"plan": {**plan.to_dict(), "device": plan.options.device}, "steps": [], "complete": False}
        # op -> {"record": [dir], "A": [replay dirs], "B": [replay dirs]}, filled as steps finish,
        # so an interrupted A/B still reports what completed.
        self.results: dict[str, dict[str, list[Path]]] = {}
        # Side name -> its Triton cache for this A/B (see run): removed when the A/B ends.
        self.caches: dict[str, Path] = {}
        self._cache_root: Path | None = None
        self.workers: dict[str, forkserver.Worker] = {}  # fork: each side's one worker
        # prewarmed: each side's workers begun for the op's steps to come, one a step, and those used
        self.spares: dict[str, list[forkserver.Worker]] = {}
        self.used: list[forkserver.Worker] = []

    def _save(self) -> None:
        rundir.atomic_write_json(self.dir / "ab.json", self.state)

    def _open_caches(self) -> None:
        """One Triton cache per side under the cache root, keyed by that side's compiler identity and
        environment: A's record feeds A's replays, B's passes step B's repeats, and no kernel crosses
        sides. Every step still runs in a fresh process and its IR is what its own compiler built: a
        cache hit loads the kernel this same build compiled for the same source, options and
        switches (Triton keys its cache by those too), and the IR plugin reads what was launched."""
        root = self._open_cache_root()
        keys = {}
        for side in (self.plan.a, self.plan.b):
            try:
                key = side_compiler_key(side)
            except SideUnidentified as exc:
                # Its steps compile into their own private caches, as without reuse; likely they fail.
                print(f"side {side.name}: no kernel reuse across its steps: its Triton could not be "
                      f"identified ({exc})", file=self.log, flush=True)
                continue
            keys[side.name] = key
            self.caches[side.name] = root / f"{side.name}-{key['digest']}"
            try:  # Triton's host modules this side's compiler built in earlier A/Bs: not built again
                linked = host_modules.link(self.caches[side.name], key["digest"])
                print(f"side {side.name}: {linked} of its Triton host modules linked from {host_modules.store()}",
                      file=self.log, flush=True)
            except (OSError, RuntimeError) as exc:  # RuntimeError: no home dir to keep them in
                print(f"side {side.name}: its kept Triton host modules not linked ({exc}): its steps build them",
                      file=self.log, flush=True)
        self.state["triton_caches"] = {name: {**key, "dir": str(self.caches[name]),
                                              "removed": "as the A/B ends (if it died first: by the next run)"}
                                       for name, key in keys.items()}

    def _open_cache_root(self) -> Path:
        """The dir of both sides' caches, this process's private dir (the next run removes it if the
        A/B dies first), made once."""
        if self._cache_root is None:
            self._cache_root = paths.make_private_dir("ab_triton_cache")
        return self._cache_root

    def close(self) -> None:
        every = [*self.workers.values(), *(w for spare in self.spares.values() for w in spare), *self.used]
        for worker in every:
            worker.release()  # all told first: they end together
        for worker in every:
            worker.reap()
        self.workers.clear()
        self.spares.clear()
        self.used.clear()
        if self._cache_root is not None:
            for name, cache in self.caches.items():
                try:  # for the next A/B of the same side compiler
                    host_modules.keep(cache, self.state["triton_caches"][name]["digest"])
                except (OSError, RuntimeError) as exc:
                    print(f"side {name}: its Triton host modules not kept ({exc})", file=self.log, flush=True)
            shutil.rmtree(self._cache_root, ignore_errors=True)
            self._cache_root = None
        self.log.close()

    def step(self, side: Side, request: RunRequest, what: str, passes: bool = False) -> Path | None:
        """One harness invocation; its run dir if it went through every case (rows that failed in it
        are reported as such, not dropped with the run), else None. A Ctrl-C goes on to the step
        (its own session: only through us), which writes its summary; then StepInterrupted."""
        request = dataclasses.replace(request, triton_cache=self.caches.get(side.name))
        # The op's dir and the step's (`softmax/B-4`): what a step is, across an A/B and its continuation.
        step_id = f"{request.run_dir.parent.parent.name}/{request.run_dir.parent.name}"
        done = self.earlier.get((step_id, _same_args(request.to_argv())))
        if done is not None:  # completed by the interrupted A/B this one continues: not run twice
            print(f"{what}: done before ({done['run_dir']})", flush=True)
            self.state["steps"].append({**done, "what": what, "taken_over": True})
            self._save()
            return Path(done["run_dir"])
        print(f"{what} ...", end="", flush=True)
        # The step under way, until it joins `steps`: where a stopped A/B was (a corpus A/B reads it).
        self.state["running"] = {"what": what, "side": side.name, "args": request.to_argv(),
                                 "run_dir": str(request.run_dir)}
        self._save()
        start = time.monotonic()
        code, interrupted = self._launch(side, request)
        if interrupted is not None:
            raise StepInterrupted(interrupted)
        elapsed = time.monotonic() - start
        run_dir = request.run_dir if (request.run_dir / rundir.RUN_JSON).is_file() else None
        usable = run_dir is not None and (code == 0 or went_through(run_dir))
        said = "ok" if code == 0 else f"finished with failed rows (exit {code})" if usable else f"FAILED (exit {code})"
        print(f" {said} ({elapsed:.0f} s)", flush=True)
        del self.state["running"]
        self.state["steps"].append({"what": what, "step": step_id, "side": side.name, "args": request.to_argv(),
                                    "exit": code, "usable": usable, "run_dir": str(run_dir) if run_dir else None,
                                    "seconds": round(elapsed, 1), **({"passes": True} if passes else {})})
        self._save()
        return run_dir if usable else None

    def _launch(self, side: Side, request: RunRequest) -> tuple[int, int | None]:
        """(the step's exit code, the signal forwarded to it or None)."""
        how = {"grace_s": STEP_GRACE_S, "forward": (signal.SIGINT, signal.SIGTERM), "log": self.log,
               "on_stdout": _case_progress,
               "on_forward": lambda s: print(f"\ninterrupted ({signal.Signals(s).name}): stopping the running side "
                                             "and reporting what completed", flush=True)}
        if self.plan.step_start == "fresh":
            return launch.run(request.command_line(side.python), env=side.env, pythonpath=_pythonpath(side), **how)
        worker = self._worker(side)
        try:
            code, interrupted = self._forked(side, worker, request, how)
            if interrupted is None and worker.died:
                print(" (its warm worker died: restarted, the step retried)", end="", flush=True)
                self.log.write(f"side {side.name}: the warm worker died during the step: restarting it, retrying\n")
                # The retry claims the same run dir afresh: nothing the dead attempt wrote stays in it.
                shutil.rmtree(request.run_dir, ignore_errors=True)
                code, interrupted = self._forked(side, worker, request, how)
        finally:
            if self.plan.step_start == "prewarmed":  # one step a worker: it ends now
                worker.release()
                # Those that exited are collected as they go, the rest (still exiting) at close.
                self.used = [w for w in (*self.used, worker) if not w.ended()]
        return code, interrupted

    def _worker(self, side: Side) -> forkserver.Worker:
        """The worker to fork the side's next step: fork, the side's one; prewarmed, its next spare
        (a new one where none is left, e.g. after an interrupted op)."""
        if self.plan.step_start == "prewarmed":
            spare = self.spares.get(side.name)
            return spare.pop(0) if spare else self._new_worker(side)
        worker = self.workers.get(side.name)
        if worker is None:
            worker = self.workers[side.name] = self._new_worker(side)
        return worker

    def _new_worker(self, side: Side) -> forkserver.Worker:
        # The backend's child environment too: it can change what importing triton does (the interpreter).
        env = {**side.env, **backends.get(self.plan.options.backend).child_env}
        options = self.plan.options
        preload = self._preload
        if preload is not None:  # the side's first worker reads the device's facts, the others find them
            facts = self._open_cache_root() / f"{side.name}-device-facts.json"
            preload = dataclasses.replace(preload, facts_file=str(facts))
        return forkserver.Worker(side.python or sys.executable, self.log, env, _pythonpath(side),
                                 str(self._open_cache_root()), options.backend, preload)

    @functools.cached_property
    def _preload(self) -> forkserver.Preload | None:
        """What every worker of this A/B preloads: the checkouts of its FlagGems ops."""
        options = self.plan.options
        return flaggems.preload_for(self.plan.ops, options.flaggems_dirs, options.flagtune, options.device)

    def _prewarm(self, record: bool) -> None:
        """prewarmed: a worker begun for each step to come, importing while no step measures. Before
        the op's record (`record`): the record's and each side's passes step's; as the record ends,
        each repeat's, importing beside the untimed passes steps. Fewer import faster: on an H200
        host the record's worker, begun with all 12 others of a 3-repeat op, took 2.8 s. Where every
        step runs the passes (no untimed step), all the op's workers are begun before its record."""
        plan = self.plan
        passes = 1 if plan.step_passes == "once" else 0
        # --repeats auto: round 2's too, ready before round 1 times (used if any row is left open).
        repeats = plan.first_repeats + int(plan.sequential) if not record or not passes else 0
        for side, steps in ((plan.a, int(record) + passes + repeats), (plan.b, passes + repeats)):
            spare = self.spares.setdefault(side.name, [])
            while len(spare) < min(steps, PREWARM_MAX_PER_SIDE):
                spare.append(self._new_worker(side))
                spare[-1].begin()

    def _prewarm_round(self) -> None:
        """prewarmed, --repeats auto: a worker a side for the round about to run, its imports done before
        the round times (as before the first timed step): round 2's were begun with round 1's, each
        later round's here, after the look that opened it."""
        for side in (self.plan.a, self.plan.b):
            spare = self.spares.setdefault(side.name, [])
            if not spare:
                spare.append(self._new_worker(side))
                spare[-1].begin()
        self._ready_before_timing()

    def _ready_before_timing(self) -> None:
        """prewarmed: every begun worker's imports done before the first timed step. The repeats' are
        begun as the record ends and mostly done within the passes steps, but not where those were
        quick or the workers many (2 x --repeats at once)."""
        for worker in (w for spare in self.spares.values() for w in spare):
            try:
                worker.wait_ready()
            except forkserver.WorkerDied as exc:
                self.log.write(f"{exc}: its step begins another\n")

    def _forked(self, side: Side, worker: forkserver.Worker, request: RunRequest, how: dict) -> tuple[int, int | None]:
        try:
            return launch.run(request.to_argv(), starter=worker.start, gated=True, **how)
        except forkserver.WorkerDied as exc:  # it never came up, or died before forking the step
            self.log.write(f"side {side.name}: {exc}\n")
            worker.died = True
            return 1, None

    def _repeat(self, op_dir: Path, runs: dict[str, list[Path]], record: Path, r: int, what: str,
                cases: tuple[str, ...] | None = None) -> None:
        """Repeat `r`: A, then B, replay A's record (its `cases` only, where given) in the step dirs `A-r`, `B-r`."""
        once = self.plan.step_passes == "once"
        for side in (self.plan.a, self.plan.b):
            replay_dir = rundir.unclaimed_run_dir(op_dir / f"{side.name}-{r}", op_dir.name)
            timed = self.plan.request("replay", str(record), replay_dir, "timing" if once else None, cases)
            replay = self.step(side, timed, f"{what}: {side.name} replays A")
            if replay is not None:
                runs[side.name].append(replay)

    def _rounds(self, op: str, tag: str, op_dir: Path, runs: dict[str, list[Path]], record: Path) -> None:
        """--repeats auto, after the first round: look at the op's rows (reports.sequential.settle over
        compare.pair of its runs so far, as the report pairs them), and while some are open and a side
        has fewer than max_repeats, one more repeat per side of the open rows alone. Each look is a
        round in ab.json `rounds[op]`. A settled row stays so (settle's rule: its repeats after its
        settling look are not used), and is not timed again."""
        from reports import compare, sequential  # imported beside the record by preload_reports

        plan = self.plan
        schedule = sequential.Schedule(first=plan.first, cap=plan.max_repeats, resolve=plan.resolve)
        performance = backends.get(plan.options.backend).measures_performance
        rounds = self.state.setdefault("rounds", {})[op] = []
        timed: list[str] | None = None  # the first round times every row
        for n in range(plan.first, plan.max_repeats + 1):  # repeats per side after each round
            # `expected` the first round's: a row every run of which skipped is dropped, as the report drops it.
            rows = compare.pair(runs["A"], runs["B"], plan.first, performance=performance,
                                profiled=compare.profiled_runs(runs))
            said = sequential.settle(rows, schedule, plan.fdr)
            # A row settle does not name stays open: timed on, never dropped unjudged.
            settled = {row.label: said[row.label] for row in rows
                       if said.get(row.label, sequential.OPEN) != sequential.OPEN}
            still = [row for row in rows if row.label not in settled]
            rounds.append({"repeats": n, "timed": timed, "open": [row.label for row in still],
                           "settled": dict(settled)})
            self._save()
            print(_round_line(tag, len(rounds), len(rows), still, settled, n == plan.max_repeats), flush=True)
            if not still or n == plan.max_repeats:
                return
            if plan.step_start == "prewarmed":
                self._prewarm_round()
            timed = [row.label for row in still]
            cases = _case_ids(record, runs, [row.key for row in still])
            self._repeat(op_dir, runs, record, n + 1,
                         f"{tag} repeat {n + 1}/{plan.max_repeats} (round {len(rounds) + 1}, {len(still)} rows)", cases)

    def run(self) -> dict[str, dict[str, list[Path]]]:
        """op -> {"A": [replay dirs], "B": [replay dirs], "record": [dir]}"""
        plan = self.plan
        for side in (plan.a, plan.b):
            if side.requirements:
                try:
                    side.python = build_side_env(side, self.log)
                except subprocess.CalledProcessError as exc:
                    raise PlanError(f"side {side.name}: building its env failed ({exc}); "
                                    f"see {self.dir / 'ab.log'}") from exc
                self.log.flush()
        if plan.step_start == "prewarmed":
            self._prewarm(record=True)  # the first op's workers import while the sides are identified
        self._open_caches()
        if plan.step_start == "fork":
            for side in (plan.a, plan.b):  # both import at once, B's while A records
                self._worker(side).begin()
        preload = preload_reports()
        results = self.results
        self._save()
        for i, op in enumerate(plan.ops, 1):
            tag = f"[{i}/{len(plan.ops)} {op}]"
            if plan.step_start == "prewarmed":
                self._prewarm(record=True)
            runs = results.setdefault(op, {"record": [], "A": [], "B": []})
            op_dir = self.dir / op.replace(":", "-").replace("@", "-").replace("/", "-")
            # Each step's run dir is named here, `<op>_<ts>` in a step dir of its own, and read back from there.
            record_dir = rundir.unclaimed_run_dir(op_dir / "A-record", op_dir.name)
            once = plan.step_passes == "once"
            # Where passes run once the A/B reads the record's configs alone: not its IR, nor its timings.
            record = self.step(plan.a, plan.request("record", op, record_dir, "configs" if once else None),
                               f"{tag} A records")
            if record is None:
                continue
            runs["record"].append(record)
            if plan.step_start == "prewarmed":
                self._prewarm(record=False)
            if once:
                from reports import compare  # imported beside the record by preload_reports

                # Each side's one-off passes (IR, per-kernel attribution) in a step of their own whose
                # timings no verdict uses (so it times at a token budget): a kernel timed in a process
                # after the profiler ran in it is slower (on an H200, 1-2 us kernels by 10-20%, for the
                # rest of the process), so the repeats never profile. It also compiles B's kernels
                # before any repeat times them.
                for side in (plan.a, plan.b):
                    passes_dir = rundir.unclaimed_run_dir(op_dir / compare.passes_key(side.name), op_dir.name)
                    passed = self.step(side, plan.request("replay", str(record), passes_dir, "passes"),
                                       f"{tag} {side.name}'s IR and kernels (not timed for the verdict)", passes=True)
                    if passed is not None:
                        runs.setdefault(compare.passes_key(side.name), []).append(passed)
            preload.join()  # before any timed step: no import of the parent's beside one
            if plan.step_start == "prewarmed":
                self._ready_before_timing()
            for r in range(1, plan.first_repeats + 1):
                of = f"{r}/{plan.repeats}" if not plan.sequential else f"{r}/{plan.first} (round 1)"
                self._repeat(op_dir, runs, record, r, f"{tag} repeat {of}")
            if plan.sequential:
                self._rounds(op, tag, op_dir, runs, record)
        self.state["complete"] = True
        self._save()
        return results


# What the report imports that the A/B's start does not: our report modules (numpy, jinja2: 0.25 s of the
# A/B's 0.44 s of imports on an H200 host, before any worker was begun), its statistics and its plot's
# matplotlib (with the Agg canvas its savefig picks; 1-2.5 s and 0.3-1 s).
REPORT_MODULES = ("reports.ab_report", "reports.corpus", "reports.explain", "scipy.stats", "matplotlib.figure",
                  "matplotlib.ticker", "matplotlib.backends.backend_agg")


def preload_reports() -> threading.Thread:
    """The report's modules (REPORT_MODULES), imported in a thread beside the A/B's first steps (its
    record waits for a worker's imports anyway), not before them. Joined before the first timed
    step. A failed import here is the report's to raise when it imports the module itself."""
    thread = threading.Thread(target=_import_quietly, args=REPORT_MODULES, name="preload-reports", daemon=True)
    thread.start()
    return thread


def _import_quietly(*names: str) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # the report's own import raises it, where it is read
            pass


def _round_line(tag: str, k: int, rows: int, still: list, settled: dict[str, str], cap: bool) -> str:
    """`[1/2 softmax] round 4: 3 of 12 rows open (9 settled: 7 same, 2 called)`, and at the cap the rows
    it leaves unresolved."""
    reasons = collections.Counter(settled.values())
    said = ", ".join(f"{count} {reason}" for reason, count in reasons.most_common())
    line = f"{tag} round {k}: {len(still)} of {rows} rows open ({len(settled)} settled{': ' + said if said else ''})"
    if cap and still:
        line += f"; at --max-repeats: {', '.join(row.label for row in still)} not resolved"
    return line


def _case_ids(record: Path, runs: dict[str, list[Path]], keys: list[tuple]) -> tuple[str, ...]:
    """The case ids of the rows `keys` (op, dtype, shape), as the op's runs named them (results.json `case`)."""
    ids = {}
    for run_dir in (record, *runs["A"], *runs["B"]):
        for row in read_results(run_dir):
            ids.setdefault(row.key, row.case)
    return tuple(ids[key] for key in keys)


def _pythonpath(side: Side) -> str | None:
    """A pip-built side already sees the base env's paths and .nox/deps, after its own (see
    build_side_env): it gets the checkout alone."""
    return str(paths.REPO_ROOT) if side.requirements else None


def went_through(run_dir: Path) -> bool:
    """Whether a run that exited non-zero still ran every case (its outcome COMPLETE): some rows
    failed, and those rows are results an A/B must show, e.g. B computing wrong answers."""
    try:
        outcome = Outcome.from_json(spec_mod.read_run(run_dir)[1].get("outcome"))
    except ValueError:  # a SpecError, or no outcome recorded
        return False
    return outcome.complete and (run_dir / rundir.RESULTS_JSON).is_file()


def validity(results: dict[str, dict[str, list[Path]]]) -> tuple[list[str], dict]:
    """Warnings about what the A/B can and cannot conclude, and the IR comparison per op."""
    from reports import compare

    warnings, per_op = [], {}
    for op, runs in results.items():
        if not runs["A"] or not runs["B"]:
            continue
        a, b = compare.profiled_runs(runs)
        if not ir.index_path(a).is_file() or not ir.index_path(b).is_file():
            per_op[op] = "IR not collected"
            continue
        rows = ir.compare(a, b)
        counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("identical", "changed", "only_in_a",
                                                                           "only_in_b")}
        per_op[op] = counts
    compared = {op: c for op, c in per_op.items() if isinstance(c, dict)}
    if compared and all(c["identical"] > 0 and c["identical"] == sum(c.values()) for c in compared.values()):
        warnings.append("the A/B axis changed NOTHING: both sides compiled byte-identical IR at every stage for "
                        "every launched kernel; a switch that no longer exists looks exactly like this")
    if any(c == "IR not collected" for c in per_op.values()):
        warnings.append("IR was not collected on some ops (see run.json observed.ir): cannot tell whether the "
                        "axis changed the generated code there")
    return warnings, per_op


def report(ab_dir: Path, groups: list[dict[str, list[Path]]], context: dict, warnings: list[str],
           backend_names: set[str], expected: int | None = None, fdr: float = FDR, schedule=None) -> int:
    """Pair and compare each group (one op's runs: its A repeats against its B repeats, each side's
    passes run, where it had one, for IR and kernels), then report them all;
    `expected` is the planned repeats per side, so a short side is flagged on every row. Verdicts
    are judged over all the groups' rows at once (compare.judge: calls at `fdr`). On a backend whose
    timings are not performance numbers the pipeline runs all the same, but every report says so at
    its top and calls no verdict. `schedule` (reports.sequential.Schedule): the rows were timed in
    rounds (--repeats auto), `expected` their first round's; judged look by look (reports.sequential)."""
    from reports import ab_report, compare, corpus, corpus_html, explain, sequential, table

    given_warnings = list(warnings)  # the page finds the calls on identical IR itself

    not_measuring = sorted(n for n in backend_names if not backends.get(n).measures_performance)
    note = table.not_performance_note(", ".join(not_measuring)) if not_measuring else None
    paired = []
    for runs in groups:
        if runs["A"] or runs["B"]:
            profiled = compare.profiled_runs(runs)
            paired.append((*profiled, compare.pair(runs["A"], runs["B"], expected, performance=note is None,
                                                   profiled=profiled)))
    rows = [row for *_, op_rows in paired for row in op_rows]
    sequential.judge(rows, fdr, schedule)
    summary = compare.summarize(rows, fdr)
    if note is None:
        # The IR is compared between each side's profiled run, as the corpus report does.
        identical = corpus.identical_ir_rows([(a, b, op_rows) for a, b, op_rows in paired if a and b])
        calls = [r for r in identical if r.verdict in corpus.CALLS]
        if calls:
            warnings = [*warnings, corpus.identical_ir_line([r.label for r in calls])]
        checked = compare.calibration([r for r in identical if r.in_headline], summary.calls, fdr)
        if checked is not None:
            line, alarming = checked
            if alarming:
                warnings = [*warnings, line]
            else:
                context = {**context, "calibration": line}
    # What the FASTER/SLOWER rows' compiled code changed, between the same runs as the IR.
    what_changed = {key: record for a, b, op_rows in paired if a and b
                    for key, record in explain.for_runs(a, b, op_rows).items()}
    print()
    print(ab_report.render(rows, summary, warnings, context, note=note, what_changed=what_changed))
    files = ab_report.write(ab_dir, rows, summary, warnings, context, note, what_changed)
    # The same rows on the corpus report's page (filter, sort, each row's IR and what changed), offline.
    page = corpus.from_paired([(", ".join(dict.fromkeys(r.op for r in op_rows)), op_rows, a, b)
                               for a, b, op_rows in paired if op_rows], context, given_warnings, note, fdr,
                               schedule)
    files.append(ab_dir / "report.html")
    rundir.atomic_write_text(files[-1], corpus_html.render(page, corpus.headline(page)))
    print("report: " + ", ".join(str(f) for f in files))
    return 0 if rows and summary.headline_rows == summary.rows else 1


def _env_pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0]:
            raise UsageError(f"{flag} {item!r}: expected KEY=VAL")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def say_if_a_a(plan: Plan) -> None:
    if plan.a.env == plan.b.env and plan.a.python == plan.b.python:
        print("note: sides A and B are identical: this is an A/A run (measures noise)")


def resolve_plan(args) -> Plan:
    try:
        if args.plan is not None or not args.ops:
            plan = load_plan(args.plan or DEFAULT_PLAN)
        else:
            plan = Plan(name="adhoc", ops=args.ops, a=Side("A", "as is"), b=Side("B", ""))
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    if args.ops:
        plan.ops = args.ops
    experiment = ExperimentOptions.from_namespace(args)
    if experiment.repeats is not None:  # in range: the parser checked it as the option declares
        plan.repeats = experiment.repeats
    sequential = {name: value for name, value in (("max_repeats", experiment.max_repeats),
                                                  ("resolve", experiment.resolve)) if value is not None}
    if sequential and not plan.sequential:
        flags = " and ".join("--" + name.replace("_", "-") for name in sequential)
        raise UsageError(f"{flags}: only with --repeats {AUTO} (this A/B's repeats are {plan.repeats})")
    if sequential.get("max_repeats", plan.max_repeats) < plan.first:
        raise UsageError(f"--max-repeats {sequential['max_repeats']}: below the plan's first round ({plan.first})")
    for name, value in sequential.items():
        setattr(plan, name, value)
    if experiment.fdr is not None:
        plan.fdr = experiment.fdr  # between 0 and 1: the parser checked it as the option declares
    plan.step_start = experiment.step_start or plan.step_start
    plan.step_passes = experiment.step_passes or plan.step_passes
    for side, env, python, key in ((plan.a, experiment.a_env, experiment.a_python, "a"),
                                   (plan.b, experiment.b_env, experiment.b_python, "b")):
        side.env.update(_env_pairs(list(env), f"--{key}-env"))
        if python:
            problem = bounded.path_problem(python, "executable")
            if problem is not None:
                raise UsageError(f"--{key}-python {python} {problem}")
            side.python = os.path.abspath(python)
    given = RunOptions.from_namespace(args)
    over = given.given()
    if given.shapes is not None:
        over["shapes"] = _shape_file(given.shapes, Path.cwd())
    # Operator sources add to the plan's; every other option given replaces the plan's.
    over.update(ops_paths=plan.options.ops_paths + given.ops_paths,
                flaggems_dirs=plan.options.flaggems_dirs + given.flaggems_dirs)
    options = dataclasses.replace(plan.options, **over)
    # Unknown names, or no accelerator when none is named, fail before anything runs.
    backend = resolve.resolve_backend(options.backend)
    resolve.check_measurement(backend, options.timer, options.l2)
    options = dataclasses.replace(options, backend=backend.name)
    fitting = paths.SHAPES_DIR / backend.default_shapes
    if (given.shapes is None and not backend.runs_shipped_shapes and options.shapes is not None
            and options.shapes.parent == paths.SHAPES_DIR and options.shapes != fitting):
        print(f"note: backend '{backend.name}' runs {fitting} instead of the plan's {options.shapes} (sized for a GPU, "
              "far too slow here); --shapes picks another")
        options = dataclasses.replace(options, shapes=fitting)
    plan.options = options
    return plan


def _shape_file(value, base: Path) -> Path:
    """A shape file given on the command line as an absolute path (relative to `base`), or `upstream` as it is."""
    return Path(UPSTREAM) if str(value) == UPSTREAM else (base / value).resolve()


def _check_plan(plan: Plan) -> None:
    """Every op of the plan resolves, and its shape file exists, before the first step: a typo would
    otherwise surface only after the A/Bs before it ran. Built-in and FlagGems names resolve without importing
    torch (a corpus A/B starts one A/B per op); a user op is loaded, as its record would."""
    shapes, ops_paths = plan.options.shapes, list(plan.options.ops_paths)
    problem = None if shapes is None or str(shapes) == UPSTREAM else bounded.path_problem(shapes, "file")
    if problem is not None:
        raise UsageError(f"shape file {shapes} {problem}")
    try:
        dirs = flaggems.parse_dirs(plan.options.flaggems_dirs)
        for op in plan.ops:
            if flaggems.is_target(op):
                flaggems.resolve_target(op, dirs)
    except flaggems.FlagGemsError as exc:
        raise UsageError(str(exc)) from exc
    ours = {text: catalog.Selection.parse(text).op for text in plan.ops if not flaggems.is_target(text)}
    if ops_paths and ours:
        try:  # the user's modules import in a probe process, once for all the plan's ops
            found, skipped = probe.load(sorted(set(ours.values())), ops_paths)
        except registry.OperatorNotFound as exc:
            raise UsageError(str(exc)) from exc
        failed = next((found[op] for op in ours.values() if isinstance(found[op], registry.OperatorNotFound)), None)
        if failed is not None:
            raise UsageError(str(failed))
        for text, op in ours.items():
            resolve.check_selection(text, op, found[op][1])
        resolve.warn(skipped)  # the terminal's one word on them: each step's own goes to ab.log
    elif ours:
        for text, op in ours.items():
            if op not in registry.builtin_names():
                resolve.load_op(op, [], [])  # says which operators there are
            resolve.check_selection(text, op, "builtin")


def _continued(earlier_dir: Path, plan: Plan) -> list[dict]:
    """The steps of the interrupted A/B in `earlier_dir` (--continue) to take over, where it ran this plan
    (its device aside: a step on another device is not taken over, its arguments differ); none, said,
    where it ran another (a corpus A/B's op resumed under a dtype fallback, say)."""
    path = Path(earlier_dir) / "ab.json"
    try:
        state = rundir.read_json(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--continue {earlier_dir}: no readable ab.json ({exc})") from exc
    stored = {k: v for k, v in state.get("plan", {}).items() if k != "device"}
    if stored != json.loads(json.dumps(plan.to_dict())):
        print(f"--continue {earlier_dir}: that A/B ran another plan: none of its steps is taken over")
        return []
    return state.get("steps", [])


def run_from_args(args) -> int:
    """`python -m harness ab ...`"""
    if args.compare:
        from reports import compare

        dir_a, dir_b = args.compare
        backend_names = set()
        for d in (dir_a, dir_b):
            try:
                backend_names.add(spec_mod.read(d).backend)
                compare.load_rows(d)
            except (spec_mod.SpecError, ResultsError) as exc:
                raise UsageError(f"--compare: {exc}") from exc
        fdr = FDR if args.fdr is None else args.fdr
        out = rundir.claim_run_dir(paths.runs_root(args.out), "compare")
        warnings, _ = validity({"runs": {"A": [dir_a], "B": [dir_b]}})
        context = {"name": f"{dir_a.name} vs {dir_b.name}", "a": str(dir_a), "b": str(dir_b),
                   "note": "single runs: each run's raw samples stand in for repeats"}
        return report(out, [{"A": [dir_a], "B": [dir_b]}], context, warnings, backend_names, fdr=fdr)
    plan = resolve_plan(args)
    _check_plan(plan)  # a corpus A/B's ops are a batch selection, checked by the batch
    say_if_a_a(plan)  # once the plan is known to run: not before an error in it
    if args.named_run_dir is not None:  # a corpus A/B names each op's A/B dir, to read it back from there
        ab_dir = rundir.claim_named_dir(args.named_run_dir, LOG_FILE)
    else:
        ab_dir = rundir.claim_run_dir(paths.runs_root(args.out), f"ab_{plan.name}")
    print(f"A/B {plan.name}: A = {plan.a.describe()}; B = {plan.b.describe()}; ops {' '.join(plan.ops)}; "
          f"{plan.describe_repeats()}\nab dir: {ab_dir}")
    if not backends.get(plan.options.backend).measures_performance:
        from reports import table

        print(table.not_performance_note(plan.options.backend))
    runner = Runner(plan, ab_dir, _continued(args.continue_from, plan) if args.continue_from else ())
    interrupted = None
    try:
        # A SIGTERM stops the A/B as Ctrl-C does (a corpus A/B stops each op's A/B so): the running
        # step is stopped, the side caches removed and what completed reported.
        with launch.stops_on_signals():
            results = runner.run()
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    except KeyboardInterrupt as exc:
        interrupted = launch.stopped_by(exc)
        if not isinstance(exc, StepInterrupted):  # a step that was stopped said so already
            print(f"\ninterrupted ({signal.Signals(interrupted).name}): reporting what completed", flush=True)
        results = runner.results
    finally:
        runner.close()
    warnings, ir_per_op = validity(results)
    if interrupted or not runner.state["complete"]:
        done = sum(1 for s in runner.state["steps"] if s["usable"])
        warnings.insert(0, f"INCOMPLETE: interrupted after {done} completed steps; rows below cover only those")
    failed = [s["what"] for s in runner.state["steps"] if not s["usable"]]
    if failed:
        warnings.append(f"{len(failed)} step(s) failed (see ab.log): " + "; ".join(failed))
    unmeasured = [op for op, runs in results.items() if not runs["A"] or not runs["B"]]
    if unmeasured:
        warnings.append(f"no rows to compare for {', '.join(unmeasured)}: a side has no completed run")
    context = {"name": plan.name, "a": plan.a.describe(), "b": plan.b.describe(), "repeats": plan.repeats,
               "ir": ir_per_op}
    schedule = None
    if plan.sequential:
        from reports import sequential

        schedule = sequential.Schedule(first=plan.first, cap=plan.max_repeats, resolve=plan.resolve)
    code = report(ab_dir, list(results.values()), context, warnings, {plan.options.backend},
                  plan.first_repeats, plan.fdr, schedule)
    return 128 + interrupted if interrupted else 1 if failed or unmeasured else code
