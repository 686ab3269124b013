"""The A/B's runner: each op's steps (A's record with A's passes, B's passes, the interleaved repeats and,
with --repeats auto, the rounds after the first), each in a process of its own, fresh or forked by a
warm worker; the sides' Triton caches; ab.json and ab.log. In a chunk of ops, the records and passes of its
ops run --record-jobs at a time (`_Records`) before its repeats, or beside the repeats of its earlier ops,
sharing the device through a gate (harness.measure.device_gate)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import backends
from harness.child import host as measuring
from harness.core import abstate, forkserver, host_modules, launch, paths, rundir
from harness.core.request import RunRequest
from harness.core.results import read_results
from harness.providers import flaggems
from harness.sessions.ab.plan import Plan, PlanError, Side
from harness.sessions.ab.reporting import preload_reports
from harness.sessions.ab.sides import SideUnidentified, build_side_env, pythonpath, side_compiler_key
from harness.sessions.ab.steps import (
    STEP_GRACE_S,
    StepInterrupted,
    case_progress,
    same_args,
    went_through,
)

LOG_FILE = "ab.log"
# prewarmed: at most this many workers a side importing or waiting at once, whatever --repeats asks (a
# 5-repeat op begins 6 for A: its record and repeats). A step past them gets a worker begun as it
# starts, its imports paid before it times, nothing timed beside them.
PREWARM_MAX_PER_SIDE = 6
GATE_FILE = "device.gate"  # in the A/B's private dir: the lock its chunk's steps share the device through


@dataclasses.dataclass(frozen=True)
class _TimedOp:
    """An op recorded by A, ready for its repeats: its line tag, dir, runs so far and record."""

    op: str
    tag: str
    op_dir: Path
    runs: dict[str, list[Path]]
    record: Path


class Runner:
    """Runs the steps of one A/B in subprocesses and keeps ab.json current. Each step is a process
    of its own: started fresh, forked by its side's warm worker (step_start fork: the worker imported
    torch, triton and pytest once, a step pays only for its device and its work), or forked by a warm
    worker of its own begun before the op's first step (prewarmed). A worker that
    dies is restarted once for the step, which is retried in a new run dir; after that the step
    fails."""

    def __init__(self, plan: Plan, ab_dir: Path, earlier: list[dict] = (), op_dirs: dict[str, Path] | None = None):
        self.plan = plan
        self.dir = ab_dir
        # The completed steps of an interrupted A/B of this plan (--continue), by step and arguments: each
        # is taken over, not run again (see step).
        self.earlier = {(s["step"], same_args(s["args"])): s for s in earlier if s.get("usable") and s.get("step")}
        self.state = {"plan": {**plan.to_dict(), "device": plan.options.device}, "steps": [], "complete": False}
        # op -> its own A/B dir, kept as a single-op A/B's ab.json (a corpus A/B's chunk: each op's status row
        # names it, and a resume goes on from it with --continue): claimed by that ab.json, whole from the start.
        self.op_dirs = {op: rundir.claim_named_dir(path, "ab.json", rundir.json_text(self.op_state(op)))
                        for op, path in (op_dirs or {}).items()}
        self.log = rundir.open_write(ab_dir / LOG_FILE)
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
        # chunk > 1: each side's worker forking its hosted steps (they measure nothing: the host does),
        # the workers begun for its hosts to come, one a host, and the hosts of the repeat under way.
        self.step_workers: dict[str, forkserver.Worker] = {}
        self.host_spares: dict[str, list[forkserver.Worker]] = {}
        # (side, repeat) -> its host: each repeat of a chunk a host a side, replaying the chunk's ops in turn
        self.hosts: dict[tuple[str, int], measuring.Host] = {}
        self.hosts_started = 0
        self.hosted = False  # the chunk under way times in hosts: chunk > 1 and more than one op in it
        # The device gate of a chunk whose records and passes run beside its repeats (None: none do).
        self.gate: Path | None = None
        # A step beside the main thread's (its records and passes) shares the state, the log and `used`.
        self._lock = threading.RLock()
        # The record job (_Records) of the thread running a step beside the main one: its worker (fork) and the
        # ab.json key of its step under way (abstate.beside_key) are its own.
        self._job = threading.local()

    def _save(self) -> None:
        with self._lock:
            rundir.atomic_write_json(self.dir / "ab.json", self.state)
            for op, op_dir in self.op_dirs.items():
                rundir.atomic_write_json(op_dir / "ab.json", self.op_state(op))

    def op_state(self, op: str) -> dict:
        """ab.json as a single-op A/B of `op` would have it: the plan of that op alone, its steps (its run
        dirs stay in this A/B's dir), its rounds; `chunk` names the A/B it is part of."""
        name = op_dir_name(op)

        def mine(step: dict) -> bool:
            return Path(step["run_dir"]).parent.parent.name == name if step.get("run_dir") else \
                step.get("step", "").split("/")[0] == name

        state = self.state
        running = next((s for s in abstate.running_steps(state) if mine(s)), None)
        return {"plan": {**state["plan"], "ops": [op]}, "steps": [s for s in state["steps"] if mine(s)],
                **({"running": running} if running else {}),
                **({"rounds": {op: state["rounds"][op]}} if op in state.get("rounds", {}) else {}),
                **({"triton_caches": state["triton_caches"]} if "triton_caches" in state else {}),
                "complete": state["complete"], "chunk": str(self.dir)}

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
        self._end_hosts()
        every = [*self.workers.values(), *(w for spare in self.spares.values() for w in spare), *self.used,
                 *self.step_workers.values(), *(w for spare in self.host_spares.values() for w in spare)]
        for worker in every:
            worker.release()  # all told first: they end together
        for worker in every:
            worker.reap()
        self.workers.clear()
        self.spares.clear()
        self.used.clear()
        self.step_workers.clear()
        self.host_spares.clear()
        if self._cache_root is not None:
            for name, cache in self.caches.items():
                try:  # for the next A/B of the same side compiler
                    host_modules.keep(cache, self.state["triton_caches"][name]["digest"])
                except (OSError, RuntimeError) as exc:
                    print(f"side {name}: its Triton host modules not kept ({exc})", file=self.log, flush=True)
            shutil.rmtree(self._cache_root, ignore_errors=True)
            self._cache_root = None
        self.log.close()

    def step(self, side: Side, request: RunRequest, what: str, passes: bool = False,
             host: int | None = None, beside: threading.Event | None = None) -> Path | None:
        """One harness invocation; its run dir if it went through every case (rows that failed in it
        are reported as such, not dropped with the run), else None. A Ctrl-C goes on to the step
        (its own session: only through us), which writes its summary; then StepInterrupted.
        `host`: its child runs in the side's measuring host of that repeat. `beside`: it runs in a
        thread beside the main one's steps (_Records), stopped when that event is set."""
        request = dataclasses.replace(request, triton_cache=self.caches.get(side.name), device_gate=self.gate)
        # The op's dir and the step's (`softmax/B-4`): what a step is, across an A/B and its continuation.
        step_id = f"{request.run_dir.parent.parent.name}/{request.run_dir.parent.name}"
        done = self.earlier.get((step_id, same_args(request.to_argv())))
        if done is not None:  # completed by the interrupted A/B this one continues: not run twice
            print(f"{what}: done before ({done['run_dir']})", flush=True)
            with self._lock:
                self.state["steps"].append({**done, "what": what, "taken_over": True})
                self._save()
            return Path(done["run_dir"])
        # A line a step as it ends where steps run beside others (a chunk's records beside its repeats).
        whole = beside is not None or self.gate is not None
        if not whole:
            print(f"{what} ...", end="", flush=True)
        if host is not None:
            request = dataclasses.replace(request, measuring_host=self._host(side, host))
        # The step under way, until it joins `steps`: where a stopped A/B was (a corpus A/B reads it). A step
        # beside the main thread's is its record job's (`running_beside`, `running_beside_2`, ...).
        running = abstate.RUNNING if beside is None else abstate.beside_key(self._job_number())
        started = round(time.time(), 1)
        with self._lock:
            self.state[running] = {"what": what, "side": side.name, "args": request.to_argv(),
                                   "run_dir": str(request.run_dir), "started": started}
            self._save()
        start = time.monotonic()
        code, interrupted = self._launch(side, request, host) if beside is None else \
            self._launch_beside(side, request, beside)
        if interrupted is not None:
            raise StepInterrupted(interrupted)
        elapsed = time.monotonic() - start
        run_dir = request.run_dir if (request.run_dir / rundir.RUN_JSON).is_file() else None
        usable = run_dir is not None and (code == 0 or went_through(run_dir))
        said = "ok" if code == 0 else f"finished with failed rows (exit {code})" if usable else f"FAILED (exit {code})"
        print(f"{what}: {said} ({elapsed:.0f} s)" if whole else f" {said} ({elapsed:.0f} s)", flush=True)
        with self._lock:
            del self.state[running]
            self.state["steps"].append({"what": what, "step": step_id, "side": side.name, "args": request.to_argv(),
                                        "exit": code, "usable": usable, "run_dir": str(run_dir) if run_dir else None,
                                        "started": started, "seconds": round(elapsed, 1),
                                        **({"passes": True} if passes else {}),
                                        **({"beside": True} if beside is not None else {})})
            self._save()
        if code == rundir.EXIT_DISK_FULL:  # the step's outcome says a write failed: so would the next step's
            raise rundir.RunWriteFault(what, request.run_dir)
        return run_dir if usable else None

    def _launch_beside(self, side: Side, request: RunRequest, stop: threading.Event) -> tuple[int, int | None]:
        """A step of a thread beside the main one: forked by the side's next worker, as `_launch` forks it,
        stopped when `stop` is set (the main thread was stopped). (its exit code, SIGINT if stopped or None)"""
        if self.plan.step_start == "fresh":
            raise ValueError("a step beside the repeats is forked by a warm worker")
        worker = self._worker(side)
        try:
            try:
                code, stopped = launch.run_beside(request.to_argv(), stop=stop, grace_s=STEP_GRACE_S,
                                                  starter=worker.start, log=self.log, on_stdout=lambda line: None)
            except forkserver.WorkerDied as exc:  # it never came up, or died before forking the step
                self.log.write(f"side {side.name}: {exc}\n")
                worker.died = True
                code, stopped = 1, False
        finally:
            self._done_with(worker)
        return code, signal.SIGINT if stopped else None

    def _done_with(self, worker: forkserver.Worker) -> None:
        """prewarmed: one step a worker, which ends now; those that exited are collected as they go, the rest
        (still exiting) at close."""
        if self.plan.step_start == "prewarmed":
            worker.release()
            with self._lock:
                self.used = [w for w in (*self.used, worker) if not w.ended()]

    def _launch(self, side: Side, request: RunRequest, host: int | None = None) -> tuple[int, int | None]:
        """(the step's exit code, the signal forwarded to it or None)."""
        how = {"grace_s": STEP_GRACE_S, "forward": (signal.SIGINT, signal.SIGTERM), "log": self.log,
               "on_stdout": case_progress if self.gate is None else lambda line: None,
               "on_stop": lambda s: print(f"\ninterrupted ({signal.Signals(s).name}): stopping the running side "
                                          "and reporting what completed", flush=True)}
        if self.plan.step_start == "fresh":
            return launch.run(request.command_line(side.python), env=side.env, pythonpath=pythonpath(side), **how)
        if request.measuring_host is not None:
            worker = self.step_workers.get(side.name)
            if worker is None:
                worker = self.step_workers[side.name] = self._new_worker(side, preload=False)
            code, interrupted = self._forked(side, worker, request, how)
            if interrupted is None and worker.died:
                self.log.write(f"side {side.name}: the worker of its hosted steps died during the step\n")
            self._end_host_if_done(side, host, request.run_dir)
            return code, interrupted
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
            self._done_with(worker)
        return code, interrupted

    def _job_number(self) -> int:
        """The record job of this thread (0: the main thread's, or the first job's)."""
        return getattr(self._job, "number", 0)

    def _worker(self, side: Side) -> forkserver.Worker:
        """The worker to fork the side's next step: fork, the side's one (a record job's own past the first:
        a worker forks one step at a time); prewarmed, its next spare (a new one where none is left, e.g.
        after an interrupted op)."""
        with self._lock:
            if self.plan.step_start == "prewarmed":
                spare = self.spares.get(side.name)
                return spare.pop(0) if spare else self._new_worker(side)
            job = self._job_number()
            key = side.name if job == 0 else f"{side.name}/{job + 1}"
            worker = self.workers.get(key)
            if worker is None:
                worker = self.workers[key] = self._new_worker(side)
            return worker

    def _new_worker(self, side: Side, preload: bool = True) -> forkserver.Worker:
        """`preload`: the A/B's operator libraries imported too (not for a worker of hosted steps, whose
        children run in the host)."""
        # The backend's child environment too: it can change what importing triton does (the interpreter).
        env = {**side.env, **backends.get(self.plan.options.backend).child_env}
        options = self.plan.options
        preload = self._preload if preload else None
        if preload is not None:  # the side's first worker reads the device's facts, the others find them
            facts = self._open_cache_root() / f"{side.name}-device-facts.json"
            preload = dataclasses.replace(preload, facts_file=str(facts))
        return forkserver.Worker(side.python or sys.executable, self.log, env, pythonpath(side),
                                 str(self._open_cache_root()), options.backend, preload)

    @functools.cached_property
    def _preload(self) -> forkserver.Preload | None:
        """What every worker of this A/B preloads: the checkouts of its FlagGems ops."""
        options = self.plan.options
        return flaggems.preload_for(self.plan.ops, options.flaggems_dirs, options.flagtune, options.device)

    def _prewarm(self, record: bool, next_record: bool = False) -> None:
        """prewarmed: a worker begun for each step to come, importing while no step measures. Before
        the op's record (`record`): the record's and B's passes step's; as the record ends, each
        repeat's, and the next op's record's where one follows (`next_record`), importing beside B's
        untimed passes step: begun as that record began, its imports were on the record's clock (4-11
        s of a FlagGems record on an H100). Fewer import faster: on an H200 host the record's worker,
        begun with all 12 others of a 3-repeat op, took 2.8 s. Where every step runs the passes (no
        untimed step), all the op's workers are begun before its record."""
        plan = self.plan
        passes = 1 if plan.step_passes == "once" else 0
        # --repeats auto: round 2's too, ready before round 1 times (used if any row is left open).
        repeats = plan.first_repeats + int(plan.sequential) if not record or not passes else 0
        repeats = 0 if self.hosted else repeats  # hosted: their hosts' workers are begun per chunk (_prewarm_hosts)
        ahead = int(next_record and passes)  # given as a record ends: its B-passes step is what it imports beside
        with self._lock:  # record jobs prewarm beside each other
            for side, steps in ((plan.a, int(record) + repeats + ahead), (plan.b, passes + repeats)):
                spare = self.spares.setdefault(side.name, [])
                while len(spare) < min(steps, PREWARM_MAX_PER_SIDE):
                    spare.append(self._new_worker(side))
                    spare[-1].begin()

    def _prewarm_round(self) -> None:
        """prewarmed, --repeats auto: a worker a side for the round about to run, its imports done before
        the round times (as before the first timed step): round 2's were begun with round 1's, each
        later round's here, after the look that opened it. Hosted: its hosts' workers."""
        if self.hosted:
            self._prewarm_hosts(1)
        else:
            for side in (self.plan.a, self.plan.b):
                spare = self.spares.setdefault(side.name, [])
                if not spare:
                    spare.append(self._new_worker(side))
                    spare[-1].begin()
        self._ready_before_timing()

    def _prewarm_hosts(self, hosts: int) -> None:
        """Hosted: a worker begun for each of the next `hosts` hosts a side, importing before anything times."""
        for side in (self.plan.a, self.plan.b):
            spare = self.host_spares.setdefault(side.name, [])
            while len(spare) < min(hosts, PREWARM_MAX_PER_SIDE):
                spare.append(self._new_worker(side))
                spare[-1].begin()

    @contextlib.contextmanager
    def _hosting(self):
        """One repeat (or round) of a chunk: each side's timed steps hand their children to one measuring
        host, started as the side's first step needs it and ended with the repeat. Without chunks: nothing."""
        try:
            yield
        finally:
            self._end_hosts()

    def _end_hosts(self) -> None:
        for host in self.hosts.values():
            with self._lock:
                self.used.append(host.worker)
            host.close()
        self.hosts.clear()

    def _end_host_if_done(self, side: Side, r: int, run_dir: Path) -> None:
        """The side's host of repeat `r` ends after a run that changed what it cannot put back (its run.json
        says so): closed here, before the next step could reach it as it exits; the next op gets a new one."""
        host = self.hosts.get((side.name, r))
        try:
            ended = rundir.read_json(run_dir / rundir.RUN_JSON)["observed"]["measuring_host"].get("ended_after")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        if host is None or not ended:
            return
        self.log.write(f"side {side.name}: measuring host {host.pid} ends after {run_dir.name}: {ended}\n")
        with self._lock:
            self.used.append(host.worker)
        host.close()
        del self.hosts[(side.name, r)]

    def _host(self, side: Side, r: int) -> Path | None:
        """The socket of the side's host for repeat `r`: started if none is, or if the last ended (a crash
        in an earlier op's run: said); None where none could be started (said: the step runs in a process
        of its own)."""
        key = (side.name, r)
        host = self.hosts.get(key)
        if host is not None and not host.alive():
            print(f" (side {side.name}'s measuring host ended during an earlier op: a new one)", end="", flush=True)
            self.log.write(f"side {side.name}: measuring host {host.pid} ended; a new one for the chunk's later ops\n")
            with self._lock:
                self.used.append(host.worker)
            host.close()
            del self.hosts[key]
        if key not in self.hosts:
            spare = self.host_spares.get(side.name)
            worker = spare.pop(0) if spare else self._new_worker(side)
            self.hosts_started += 1
            path = Path(self._open_cache_root()) / f"host-{side.name}-{self.hosts_started}.sock"
            try:
                self.hosts[key] = measuring.Host(worker, path, self.log)
            except (measuring.HostGone, forkserver.WorkerDied) as exc:
                print(f" (no measuring host: {exc}; this step in a process of its own)", end="", flush=True)
                self.log.write(f"side {side.name}: no measuring host ({exc})\n")
                with self._lock:
                    self.used.append(worker)
                worker.release()
                return None
            self.log.write(f"side {side.name}: measuring host {self.hosts[key].pid} at {path}\n")
        return self.hosts[key].path

    def _ready_before_timing(self, hosts_only: bool = False) -> None:
        """prewarmed: every begun worker's imports done before the first timed step. The repeats' are
        begun as the record ends and mostly done within B's passes step, but not where that was
        quick or the workers many (2 x --repeats at once). `hosts_only`: the hosts' and their steps'
        workers (the others are a thread's beside the repeats, begun as it goes)."""
        spares = (self.host_spares,) if hosts_only else (self.spares, self.host_spares)
        for worker in (*(w for kind in spares for spare in kind.values() for w in spare),
                       *self.step_workers.values()):
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
            replay = self.step(side, timed, f"{what}: {side.name} replays A", host=r if self.hosted else None)
            if replay is not None:
                runs[side.name].append(replay)

    def _rounds(self, timed_ops: list[_TimedOp]) -> None:
        """--repeats auto, after the first round: look at each op's rows (reports.sequential.settle over
        compare.pair of its runs so far, as the report pairs them), and while some are open and a side
        has fewer than max_repeats, one more repeat per side of the open rows alone, the chunk's ops
        with open rows together (one host a side, where hosted). Each look is a round in ab.json
        `rounds[op]`. A settled row stays so (settle's rule: its repeats after its settling look are not
        used), and is not timed again."""
        from reports import compare, sequential  # imported beside the record by preload_reports

        plan = self.plan
        schedule = sequential.Schedule(first=plan.first, cap=plan.max_repeats, resolve=plan.resolve)
        performance = backends.get(plan.options.backend).measures_performance
        looks = {t.op: self.state.setdefault("rounds", {}).setdefault(t.op, []) for t in timed_ops}
        timed: dict[str, list[str] | None] = {t.op: None for t in timed_ops}  # the first round times every row
        for n in range(plan.first, plan.max_repeats + 1):  # repeats per side after each round
            todo = []
            for t in (t for t in timed_ops if t.op in timed):
                # `expected` the first round's: a row every run of which skipped is dropped, as the report drops it.
                rows = compare.pair(t.runs["A"], t.runs["B"], plan.first, performance=performance,
                                    profiled=compare.profiled_runs(t.runs))
                said = sequential.settle(rows, schedule, plan.fdr)
                # A row settle does not name stays open: timed on, never dropped unjudged.
                settled = {row.label: said[row.label] for row in rows
                           if said.get(row.label, sequential.OPEN) != sequential.OPEN}
                still = [row for row in rows if row.label not in settled]
                rounds = looks[t.op]
                rounds.append({"repeats": n, "timed": timed[t.op], "open": [row.label for row in still],
                               "settled": dict(settled)})
                self._save()
                print(_round_line(t.tag, len(rounds), len(rows), still, settled, n == plan.max_repeats), flush=True)
                if not still or n == plan.max_repeats:
                    del timed[t.op]
                    continue
                timed[t.op] = [row.label for row in still]
                todo.append((t, still, len(rounds)))
            if not todo:
                return
            if plan.step_start == "prewarmed":
                self._prewarm_round()
            with self._hosting():
                for t, still, k in todo:
                    cases = _case_ids(t.record, t.runs, [row.key for row in still])
                    self._repeat(t.op_dir, t.runs, t.record, n + 1,
                                 f"{t.tag} repeat {n + 1}/{plan.max_repeats} (round {k + 1}, {len(still)} rows)", cases)

    def _record_and_passes(self, i: int, op: str, beside: threading.Event | None = None) -> _TimedOp | None:
        """Op `i`'s record by A (carrying A's passes) and B's passes step; what its repeats need (None: no
        record). `beside`: run in a thread beside the repeats (step)."""
        plan = self.plan
        tag = f"[{i}/{len(plan.ops)} {op}]"
        if plan.step_start == "prewarmed":
            self._prewarm(record=True)
        with self._lock:
            runs = self.results.setdefault(op, {"record": [], "A": [], "B": []})
        op_dir = self.dir / op_dir_name(op)
        # Each step's run dir is named here, `<op>_<ts>` in a step dir of its own, and read back from there.
        record_dir = rundir.unclaimed_run_dir(op_dir / "A-record", op_dir.name)
        once = plan.step_passes == "once"
        # Where passes run once A's record carries A's (IR, per-kernel attribution of the configs it picked,
        # its sweeps' launches left out), timed at a token budget: the A/B reads its configs, not its
        # timings. A step of A's own replaying them cost a process, every case's inputs and its profiler
        # pass again (a FlagGems op's record and passes steps were each 20-45 s at its own shapes).
        record = self.step(plan.a, plan.request("record", op, record_dir, "passes" if once else None),
                           f"{tag} A records", passes=once, beside=beside)
        if record is None:
            return None
        runs["record"].append(record)
        if plan.step_start == "prewarmed":
            self._prewarm(record=False, next_record=i < len(plan.ops))
        if once:
            from reports import compare  # imported beside the record by preload_reports

            runs.setdefault(compare.passes_key(plan.a.name), []).append(record)
            # B's one-off passes in a step of its own whose timings no verdict uses (so it times at a
            # token budget): a kernel timed in a process after the profiler ran in it is slower (on an
            # H200, 1-2 us kernels by 10-20%, for the rest of the process), so the repeats never
            # profile. It also compiles B's kernels before any repeat times them.
            side = plan.b
            passes_dir = rundir.unclaimed_run_dir(op_dir / compare.passes_key(side.name), op_dir.name)
            passed = self.step(side, plan.request("replay", str(record), passes_dir, "passes"),
                               f"{tag} {side.name}'s IR and kernels (not timed for the verdict)", passes=True,
                               beside=beside)
            if passed is not None:
                runs.setdefault(compare.passes_key(side.name), []).append(passed)
        return _TimedOp(op, tag, op_dir, runs, record)

    def _timed_repeat(self, t: _TimedOp, r: int) -> None:
        """Repeat `r` of op `t` in the first round (every repeat of a fixed --repeats)."""
        of = f"{r}/{self.plan.repeats}" if not self.plan.sequential else f"{r}/{self.plan.first} (round 1)"
        self._repeat(t.op_dir, t.runs, t.record, r, f"{t.tag} repeat {of}")

    def _chunk_in_turn(self, chunk: list[tuple[int, str]], preload) -> list[_TimedOp]:
        """The chunk's records and passes (--record-jobs at a time), then its repeats: each repeat a host a
        side (where hosted) replaying the chunk's ops in turn."""
        if self.plan.record_jobs > 1 and len(chunk) > 1 and self.plan.records_in_jobs:
            timed_ops = self._records_together(chunk)
        else:
            timed_ops = [t for i, op in chunk if (t := self._record_and_passes(i, op)) is not None]
        preload.join()  # before any timed step: no import of the parent's beside one
        if not timed_ops:
            return []
        if self.plan.step_start == "prewarmed":
            self._ready_before_timing()
        for r in range(1, self.plan.first_repeats + 1):
            with self._hosting():
                for t in timed_ops:
                    self._timed_repeat(t, r)
        return timed_ops

    def _records_together(self, chunk: list[tuple[int, str]]) -> list[_TimedOp]:
        """The chunk's records and B's passes, --record-jobs at a time, sharing the device through the gate
        (their cases one at a time, their compiles beside each other's); then, alone, those of an op whose
        steps failed beside others (a failure of its own fails again; one of the device's memory that the
        others held does not). In the chunk's order."""
        with self._recording(chunk) as records:
            done: dict[int, _TimedOp | None] = dict(records)
        timed_ops = []
        for i, op in chunk:
            t = done.get(i)
            if self._needs_alone(t):
                name = op_dir_name(op)
                with self._lock:
                    self.results[op] = {"record": [], "A": [], "B": []}
                    for step in self.state["steps"]:  # not the A/B's failures: what this op reads is the run alone
                        if str(step.get("step", "")).split("/")[0] == name and not step.get("taken_over"):
                            step["run_again"] = True
                    self._save()
                print(f"[{i}/{len(self.plan.ops)} {op}] its record or B's passes failed beside others' (a crash, or "
                      "a device fault in a row): again, alone", flush=True)
                t = self._record_and_passes(i, op)
            if t is not None:
                timed_ops.append(t)
        return timed_ops

    def _needs_alone(self, t: _TimedOp | None) -> bool:
        """Its record or B's passes, run beside others', did not go through, or a row of theirs failed on what
        the backend calls a device fault (capture_markers.fatal: out of memory among them), which the others'
        memory or work may have caused."""
        if t is None:
            return True
        from reports import compare  # imported beside the record by preload_reports

        dirs = [t.record, *t.runs.get(compare.passes_key(self.plan.b.name), [])]
        if self.plan.step_passes == "once" and len(dirs) < 2:
            return True
        fatal = backends.get(self.plan.options.backend).capture_markers.fatal
        try:
            return any(row.error and any(marker in row.error for marker in fatal)
                       for run_dir in dirs for row in read_results(run_dir))
        except (OSError, ValueError):
            return True

    @contextlib.contextmanager
    def _recording(self, chunk: list[tuple[int, str]]):
        """The chunk's records and B's passes, --record-jobs threads taking its ops in turn (_Records, yielded),
        all of the section's steps sharing the device through the gate (harness.measure.device_gate)."""
        self.gate = self._open_cache_root() / GATE_FILE
        with self._lock:  # who holds it, for a corpus A/B's --op-timeout (device_gate.holder)
            self.state["device_gate"] = str(self.gate)
            self._save()
        try:
            records = _Records(self, chunk, self.plan.record_jobs)
            try:
                yield records
            finally:
                records.close()
        finally:
            self.gate = None
            with self._lock:
                self.state.pop("device_gate", None)
                self._save()

    def _chunk_beside(self, chunk: list[tuple[int, str]], preload) -> list[_TimedOp]:
        """The chunk's records and passes in threads beside its repeats (_Records, --record-jobs of them), and
        each op's repeats as soon as its passes are done, while the next ops record: each repeat a host a
        side for the whole chunk, replaying its ops in turn as `_chunk_in_turn`'s do. They share the device
        through the gate: a timed row holds it while it is timed, a record or passes step while its cases
        run the device, not while they compile (harness.measure.device_gate)."""
        timed_ops: list[_TimedOp] = []
        with self._recording(chunk) as records, self._hosting():
            for _, t in records:
                if t is None:
                    continue
                if not timed_ops:
                    preload.join()  # before any timed step: no import of the parent's beside one
                    self._ready_before_timing(hosts_only=True)
                timed_ops.append(t)
                for r in range(1, self.plan.first_repeats + 1):
                    self._timed_repeat(t, r)
        return timed_ops

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
        numbered = list(enumerate(plan.ops, 1))
        for start in range(0, len(numbered), plan.chunk):
            chunk = numbered[start:start + plan.chunk]
            self.hosted = plan.chunk > 1 and len(chunk) > 1
            if self.hosted and plan.step_start != "fresh":
                # The chunk's hosts' workers, and its hosted steps', import beside its records and passes.
                self._prewarm_hosts(plan.first_repeats)
                for side in (plan.a, plan.b):
                    if side.name not in self.step_workers:
                        self.step_workers[side.name] = self._new_worker(side, preload=False)
                        self.step_workers[side.name].begin()
            if self.hosted and plan.chunk_records == "beside" and plan.step_start != "fresh":
                timed_ops = self._chunk_beside(chunk, preload)
            else:
                timed_ops = self._chunk_in_turn(chunk, preload)
            if plan.sequential and timed_ops:
                self._rounds(timed_ops)
        self.state["complete"] = True
        self._save()
        return results


class _Records:
    """A chunk's records and B's passes, op after op, in `jobs` threads beside the main one (which times repeats,
    or waits). Iterated (by the main thread): (each op's number, what its repeats need or None where its record
    failed) as its passes end. A step of it that raised (a worker, a write) raises there too, once every job
    has ended. `close`: stops the steps under way (the main thread was stopped, or is done) and waits for the
    jobs."""

    def __init__(self, runner: Runner, chunk: list[tuple[int, str]], jobs: int = 1):
        self.runner = runner
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        for item in chunk:
            self.todo.put(item)
        self.stop = threading.Event()
        self.ready: queue.Queue = queue.Queue()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(n,), name=f"record job {n + 1}", daemon=True)
                        for n in range(max(1, min(jobs, len(chunk))))]
        self.left = len(self.threads)
        for thread in self.threads:
            thread.start()

    def _run(self, number: int) -> None:
        self.runner._job.number = number
        try:
            while not self.stop.is_set():
                try:
                    i, op = self.todo.get_nowait()
                except queue.Empty:
                    return
                self.ready.put((i, self.runner._record_and_passes(i, op, beside=self.stop)))
        except BaseException as exc:  # StepInterrupted once stopped: the main thread's own stop says so
            self.errors.append(exc)
            self.stop.set()  # the other jobs start no more steps: the A/B ends on the error
        finally:
            self.ready.put(None)

    def __iter__(self):
        while self.left:
            try:
                item = self.ready.get(timeout=0.5)  # in steps: a Ctrl-C reaches the main thread between them
            except queue.Empty:
                continue
            if item is None:
                self.left -= 1
            else:
                yield item
        raised = [exc for exc in self.errors if not isinstance(exc, StepInterrupted)]
        if raised:
            raise raised[0]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def op_dir_name(op: str) -> str:
    """The dir of an op's steps in the A/B's dir."""
    return op.replace(":", "-").replace("@", "-").replace("/", "-")


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
