"""Batch screening: many operators, isolated, across devices, with timeouts, retries and resume.

Each operator is one `python -m harness record|replay` subprocess in its own process group, so
its per-op dir is exactly a single run's (replayable alone later). Operators are sharded over
devices by a stable hash (a resumed batch lands each op on the same device) and run serially
within a device. `ops_status.csv` is rewritten atomically after every op, and a per-op
completion marker makes `--resume` skip ops that already PASSed or SKIPped, or that triage found
failing or timing out upstream too. This module is the scheduler: the batch dir's files are
harness.core.batchdir's, and which ops run is harness.providers.selection's.

Each op's record or replay is forked by its device thread's warm worker (harness.core.forkserver:
torch, triton and pytest imported once a device, not once an op; `--op-start fresh` starts a new
interpreter per op instead). The forked op leads its own group and holds its op dir's `.running` lock
as a guard would; its worker ends it when the batch dies (the worker's death signal, then the step's),
a crash ends only the op, and a worker that died is started again for the op's retry. An op started
fresh (and every corpus A/B op, and triage's upstream node) runs under harness.core.opguard, the
leader of its group, which ends it when the batch dies, however it died.
A batch holds its dir's owner lock while it runs and stores its selection and options in
batch.json; `--resume` refuses a dir whose owner still runs, stops what a dead owner left
running (before it uses that device), and reuses what the command line does not give again.

A FlagGems operator runs as `record NAME:OP@OP_FILE --flaggems-dir NAME=PATH` (replay: the run dir
plus `--flaggems-dir`). Its dtypes are known only once it runs, so when it rejects the requested
ones the fallback goes straight to the rescue run without a dtype filter. A rejection is a fact,
not log text: our own is the exit code of DtypeRejected, FlagGems' is run.json's
`observed.dtype_rejected` (see `_dtype_rejected`).

Triage (on unless `--no-triage`): a FlagGems op that still fails after its retries is rerun once as
the bare upstream pytest node, with upstream's own timing, in the op's `upstream/` dir. When that
fails too the op is FAIL_UPSTREAM (listed, but not our failure: it leaves the exit code alone);
when it passes the op stays FAIL, ours. A timed-out one is rerun the same way under the same
timeout: TIMEOUT_UPSTREAM when upstream does not finish either (likewise not ours), else TIMEOUT,
its notes saying whether upstream finishes. A resume keeps both upstream verdicts.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import math
import os
import queue
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import backends
from harness.core import batchdir, bounded, forkserver, launch, opguard, paths, rundir
from harness.core.errors import DtypeRejected, UsageError
from harness.core.options import BatchOptions, RunOptions, declared, split_dir
from harness.core.outcome import Outcome
from harness.core.request import RunRequest
from harness.core.results import read_results
from harness.providers import catalog, flaggems, selection
from harness.providers.catalog import Entry
from harness.sessions import ray_executor, resolve, slurm_executor

MAX_RETRIES = 2
KILL_GRACE_S = 10
# batch.json written before its options took their fields' names (2026-12): read under the new ones.
RENAMED = {"ops_path": "ops_paths", "flaggems_dir": "flaggems_dirs"}


@dataclasses.dataclass(frozen=True)
class Options:
    """What a batch runs its ops with, resolved: the backend's name, absolute paths, each FlagGems
    checkout as NAME=PATH. `run` is what each op's record is given (its device is the op's shard's);
    a replay from --replay-root keeps its record's."""

    run: RunOptions
    devices: list[int]
    op_timeout: float = batchdir.DEFAULT_OP_TIMEOUT
    replay_root: Path | None = None
    triage: bool = True  # rerun a failing FlagGems op as the bare upstream node
    op_start: str = "fork"  # a key of harness.core.options.OP_STARTS

    @property
    def backend(self) -> str:
        return self.run.backend

    @property
    def checkouts(self) -> dict[str, str]:
        """The FlagGems checkouts given, repo -> checkout."""
        return dict(split_dir(item) for item in self.run.flaggems_dirs)


def shard(key: str, n: int) -> int:
    """Stable across processes and Python versions (unlike hash())."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % n


def _run_facts(run_dir: Path | None) -> dict:
    if run_dir is None or not (run_dir / rundir.RESULTS_JSON).is_file():
        return {"rows": 0, "timer": "", "timer_fallback_rows": 0, "replay_fallback_rows": 0, "statuses": {},
                "skip_reason": ""}
    rows = read_results(run_dir)
    timers = sorted({r.timer for r in rows if r.timer})
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {"rows": len(rows), "timer": "+".join(timers),
            "timer_fallback_rows": sum(1 for r in rows if any(m.startswith("TIMER_FALLBACK") for m in r.markers)),
            "replay_fallback_rows": sum(1 for r in rows
                                        if any(m.startswith("AUTOTUNE_REPLAY_FALLBACK") for m in r.markers)),
            "statuses": statuses,
            "skip_reason": next((r.error for r in rows if r.status == "SKIPPED" and r.error), "")}


class Batch:
    """Runs the per-op job of every selected op: a `record` (or `replay`) run here. The job's hooks
    (`_run_dir`, `_wrote`, `_command`, `_passed`, `_rejected`, `_stopped_in`, `_facts`, `_columns`, `tally`,
    `done_line`, `summarize`) are what harness.sessions.corpus_ab.CorpusAB overrides to run a whole
    single-op A/B instead; selection, sharding, process groups, timeouts, retries and resume stay here."""

    OPTIONS = Options
    COLUMNS = batchdir.STATUS_COLUMNS
    TRIAGE = True  # whether --triage applies to this job
    FORKS = True  # whether its ops may be forked by a warm worker (--op-start)
    # A typical op's wall, for the rough cost a large selection is told up front: a FlagGems op's record
    # at its own (core) shapes, the median of a batch screen on one H200 (issue 45: 21 s).
    TYPICAL_OP_S = 21
    LARGE_SELECTION = 50  # ops above which that cost is said
    # The guard's file in an op dir while it runs; `--resume` stops what a dead batch left running by it.
    running_name = opguard.RUNNING

    def __init__(self, batch_dir: Path, opts: Options, op_dtypes: dict[str, tuple[str, ...]]):
        self.dir = batch_dir
        self.opts = opts
        self.op_dtypes = op_dtypes  # entry id -> the dtypes it accepts (built-in and --ops-path ops)
        self.status = batchdir.read_status(batch_dir)
        self.replay_sources = batchdir.read_status(opts.replay_root) if opts.replay_root else {}
        self.lock = threading.Lock()
        self.children: dict[int, launch.Child] = {}
        self.stopping = threading.Event()
        self.events: queue.Queue = queue.Queue()  # each op's status row, as its device thread finishes it
        # Device -> the warm worker that forks its ops (the local executor's device threads, --op-start fork).
        self.workers: dict[int, forkserver.Worker] = {}
        self.worker_notes: dict[int, str] = {}  # device -> why its ops start fresh from here, for its next row

    # --- what a job and a batch are made of (overridden by a corpus A/B) -------------------------
    @classmethod
    def prepare(cls, args, stored: dict, run: RunOptions) -> tuple[dict, RunOptions, list[str] | None]:
        """(extra fields of this job's Options, from the command line or what a resumed batch stored
        (stored with the request, so a resume gets them back); the run options its ops get; the ops
        to select when the command line names none, None for the stored selection)."""
        if "plan" in stored:
            raise UsageError(f"--batch-dir {args.batch_dir} is a corpus A/B: resume it with nox -s ab -- --resume "
                             "--batch-dir DIR")
        return {}, run, None

    @classmethod
    def dir_prefix(cls, extra: dict) -> str:
        return "batch"

    def _run_dir(self, entry: Entry, attempt_dir: Path) -> Path:
        """The run dir an attempt's child claims, named here and read back from exactly there."""
        return rundir.unclaimed_run_dir(attempt_dir, entry.op)

    def _wrote(self, run_dir: Path) -> bool:
        """Whether the attempt's child claimed its run dir and said what it ran in it."""
        return (run_dir / rundir.RUN_JSON).is_file()

    def _passed(self, code: int, run_dir: Path) -> bool:
        """Exit 0 and the outcome its run recorded COMPLETE: the status follows what the run says
        of itself."""
        outcome = _recorded_outcome(run_dir)
        return code == 0 and outcome is not None and outcome.complete

    def _failure(self, run_dir: Path) -> str:
        """How a failed attempt ended, as its run recorded it ("" when it says nothing more than
        its exit code)."""
        outcome = _recorded_outcome(run_dir)
        if outcome is None or outcome.complete:
            return ""
        return f"INCOMPLETE {outcome.rows()} rows: {outcome.reason}{outcome.during()}"

    def _rejected(self, code: int, run_dir: Path) -> bool:
        return _dtype_rejected(code, run_dir)

    def _stopped_in(self, run_dir: Path) -> Path:
        """The run the attempt was in when it was killed."""
        return run_dir

    def _facts(self, run_dir: Path | None) -> dict:
        return _run_facts(run_dir)

    def _columns(self, facts: dict) -> dict:
        """Status columns of this job beyond STATUS_COLUMNS."""
        return {}

    def tally(self, row: batchdir.StatusRow) -> collections.Counter:
        """What the progress bar counts for a finished op."""
        return collections.Counter([row.status])

    def done_line(self, row: batchdir.StatusRow) -> str:
        return (f"{row.status:<8} {row.repo}:{row.op} device={row.device} {row.elapsed_s} s "
                f"rows={row.rows}{'  ' + row.notes if row.notes else ''}")

    def summarize(self) -> str:
        """The files that sum the batch up, rewritten from its dir; said in the last line."""
        return f"summary: {batchdir.write_summary(self.dir)}"

    # --- one op ----------------------------------------------------------------------------------
    def _command(self, entry: Entry, device: int, dtypes: list[str] | None, run_dir: Path) -> list[str] | None:
        """The op's `python -m harness record|replay` arguments (after `python -m harness`), run in
        `run_dir`; None when --replay-root has no PASSed run of it to replay."""
        checkout = self.opts.checkouts.get(entry.repo)
        flaggems_dirs = (f"{entry.repo}={checkout}",) if checkout else ()
        if self.opts.replay_root is not None:
            earlier = self.replay_sources.get(entry.id)
            if earlier is None or earlier.status != "PASS" or not earlier.run_dir:
                return None
            where = RunOptions(ops_paths=self.opts.run.ops_paths, flaggems_dirs=flaggems_dirs, device=device)
            return RunRequest("replay", str(self.opts.replay_root / earlier.run_dir), where, color="never",
                              run_dir=run_dir).to_argv()
        options = dataclasses.replace(self.opts.run, device=device, dtypes=tuple(dtypes) if dtypes else None)
        if checkout:
            target = f"{entry.repo}:{entry.op}@{entry.op_file}"
            options = dataclasses.replace(options, flaggems_dirs=flaggems_dirs)
        else:  # only a FlagGems op gets its checkout and upstream's options
            target = entry.op
            options = dataclasses.replace(options, **{f.name: f.default for f, meta in declared(options)
                                                      if meta.group == "flaggems"})
        return RunRequest("record", target, options, color="never", run_dir=run_dir).to_argv()

    def _run_attempt(self, argv: list[str], log_path: Path, device: int) -> tuple[int | None, float]:
        """`python -m harness ARGV` for one attempt: forked by the device's warm worker where it has
        one, else fresh under the guard. A worker that cannot fork it (it never came up) is said in the
        op's log and its next row's notes, and the device's ops start fresh from here on."""
        worker = self.workers.get(device)
        if worker is not None:
            try:
                code, seconds = self._watched(
                    lambda log, running, gate: worker.start(argv, log, _dropped, guard=running, gate=gate), log_path)
            except forkserver.WorkerDied as exc:
                worker.close()
                del self.workers[device]
                self._say(device, log_path, f"its warm worker could not fork it ({exc}): device {device}'s ops "
                                            "start fresh from here")
            else:
                if worker.died:  # restarted by its next start: the retry is forked again
                    self._say(device, log_path, "its warm worker died during the attempt, which was killed with it")
                return code, seconds
        return self._attempt([sys.executable, "-m", "harness", *argv], log_path)

    def _say(self, device: int, log_path: Path, why: str) -> None:
        """In the op's log, and in the notes of the row its device finishes next."""
        self.worker_notes[device] = why
        with rundir.open_write(log_path) as log:
            log.write(f"\n{why}\n")

    def _attempt(self, cmd: list[str], log_path: Path, **start_kw) -> tuple[int | None, float]:
        """(exit code or None on timeout, seconds) of CMD started fresh.

        The op runs under harness.core.opguard, the leader of its process group, which ends the group
        when this process dies (by SIGKILL too) and marks it in the op dir's `.running` meanwhile."""
        # The guard, not a parent-death signal, ties the op to this batch: these are worker threads.
        return self._watched(lambda log, running, gate: launch.start(opguard.command(running, cmd, gate), log=log,
                                                                     with_parent=False, pass_fds=(gate,), **start_kw),
                             log_path)

    def _watched(self, start_child, log_path: Path) -> tuple[int | None, float]:
        """(exit code or None on timeout, seconds) of the child `start_child(log, running, gate)` starts, which
        `stop` reaches while it runs and --op-timeout ends; its `.running` (the op dir's) is gone after it.

        A stop is final: the child waits at `gate` (a pipe's read end) until it is known here, and that
        is decided under the lock `stop` takes to collect the children it kills. A stop set before that
        closes the gate (the child exits having run nothing: NotStarted); one set after finds the child
        among those it kills. However a signal lands (before the check, between the check and the
        start, during the start), no op runs past a stop."""
        start = time.monotonic()
        running = log_path.parent / self.running_name
        gate, opener = os.pipe()
        try:
            with rundir.open_write(log_path) as log:
                try:
                    child = start_child(log, running, gate)
                finally:
                    os.close(gate)
                with self.lock:
                    self.children[child.pid] = child
                    go = not self.stopping.is_set()
                if go:
                    with contextlib.suppress(BrokenPipeError):  # it is gone already: its wait says how
                        os.write(opener, opguard.GO)
                os.close(opener)
                opener = None
                try:
                    if not go:
                        child.wait()  # it reads the closed gate and exits
                        raise NotStarted
                    code = child.wait(self.opts.op_timeout)
                    if code is None:
                        child.stop(KILL_GRACE_S)
                finally:
                    with self.lock:
                        self.children.pop(child.pid, None)
                    running.unlink(missing_ok=True)  # the guard's own removal is skipped when SIGKILL ends it
        finally:
            if opener is not None:
                os.close(opener)
        return code, time.monotonic() - start

    def run_op(self, entry: Entry, device: int) -> batchdir.StatusRow:
        row = self.measure_op(entry, device)
        self.record(entry, row)
        return row

    def measure_op(self, entry: Entry, device: int) -> batchdir.StatusRow:
        """Run the op's job (its attempts, retries, triage) and return its status row, not yet
        recorded in ops_status.csv: an executor on other hosts hands rows back to the one that records."""
        op_dir = rundir.make_dir(batchdir.op_dir(self.dir, entry.key), under=self.dir)
        (op_dir / batchdir.COMPLETE).unlink(missing_ok=True)
        log_path = op_dir / "batch.log"
        notes, attempts, elapsed, codes = [], 0, 0.0, []
        dtypes = list(self.opts.run.dtypes) if self.opts.run.dtypes else None
        status, code, run_dirs = "FAIL", None, []
        while not self.stopping.is_set():
            run_dir = self._run_dir(entry, op_dir / f"attempt{attempts + 1}")
            argv = self._command(entry, device, dtypes, run_dir)
            if argv is None:
                status, notes = "FAIL", [f"no PASSed run of this op to replay in {self.opts.replay_root}"]
                break
            rundir.make_dir(run_dir.parent)  # the attempt's dir: made here, where no planted link is followed
            try:
                code, seconds = self._run_attempt(argv, log_path, device)
            except NotStarted:  # the stop came first: this attempt ran nothing, and is not counted
                status = "INTERRUPTED"
                break
            attempts += 1
            if device in self.worker_notes:
                notes.append(self.worker_notes.pop(device))
            run_dirs.append(run_dir)
            elapsed += seconds
            passed = code is not None and self._passed(code, run_dir)
            # An op that finished and passed before the stop reached it is done: a resume need not rerun it.
            if self.stopping.is_set() and not passed:
                status = "INTERRUPTED"
                break
            if code is None:
                status = "TIMEOUT"
                stopped_in = self._stopped_in(run_dir)
                what = f"timeout after {self.opts.op_timeout:.0f} s {_killed_during(stopped_in)}"
                notes.append(f"{what} (killed, not retried)")
                _killed_note(stopped_in, log_path, what)
                break
            if passed:
                status = "PASS"
                break
            if dtypes is not None and self._rejected(code, run_dir):
                # Built-in ops narrow to the dtypes they take first; others go straight to the rescue.
                accepted = [d for d in dtypes if d in self.op_dtypes.get(entry.id, ())]
                if accepted and accepted != dtypes:
                    notes.append(f"dtype fallback {','.join(dtypes)} -> {','.join(accepted)}")
                    dtypes = accepted
                else:
                    notes.append(f"dtype rescue: {','.join(dtypes)} rejected, ran without a dtype filter")
                    dtypes = None
                continue
            # The run's own account, so a failure that ends the same way twice (not only with the
            # same exit code: a crash's own exit number is part of its account) is deterministic.
            if code == rundir.EXIT_DISK_FULL:  # its run met a full disk (a failed write): so would every op after it
                raise rundir.RunWriteFault(entry.key, run_dir)  # the batch stops, one line; a resume reruns the op
            failure = self._failure(run_dir)
            said = f"exit {code}" + (f" ({failure})" if failure else "")
            codes.append((code, failure.split(" during case ")[0]))
            if code == UsageError.exit_code:  # refused before it ran: a retry is refused the same way
                notes.append(f"bad input, not retried: {_error_line(log_path)}")
                break
            if len(codes) >= 2 and codes[-1] == codes[-2]:
                notes.append(f"exit {code} twice in a row{' the same way' if failure else ''}: deterministic, "
                             "not retried further")
                break
            if len(codes) > MAX_RETRIES:
                notes.append(said)
                break
            notes.append(f"retry after {said}")
        if not attempts and self.stopping.is_set():
            status = "INTERRUPTED"  # stopped before its first attempt (a Slurm task cancelled as it started)
        ran = (status == "FAIL" and code is not None) or status == "TIMEOUT"
        if ran and self.opts.triage and catalog.needs_checkout(entry.repo) and entry.repo in self.opts.checkouts:
            status, note, seconds = self._triage(status, entry, device, dtypes, op_dir)
            notes.append(note)
            elapsed += seconds
        # The row names its last attempt's run dir that was written (a later attempt may have stopped before).
        run_dir = next((d for d in reversed(run_dirs) if self._wrote(d)), None)
        facts = self._facts(run_dir)
        if status == "PASS" and facts["statuses"] and set(facts["statuses"]) == {"SKIPPED"}:
            status = "SKIP"
            notes.append(f"skipped: {facts['skip_reason']}")  # upstream's reason, or the operator's
        row = batchdir.StatusRow(
            entry.op, entry.repo, entry.op_file, status, exit_code=code, attempts=attempts,
            elapsed_s=round(elapsed, 1), backend=self.opts.backend, device=device, timer=facts["timer"],
            rows=facts["rows"], timer_fallback_rows=facts["timer_fallback_rows"],
            replay_fallback_rows=facts["replay_fallback_rows"],
            run_dir=str(run_dir.relative_to(self.dir)) if run_dir else "", notes="; ".join(notes),
            extra=self._columns(facts))
        batchdir.mark_complete(op_dir, status, self.opts.op_timeout)
        return row

    def _triage(self, status: str, entry: Entry, device: int, dtypes: list[str] | None,
                op_dir: Path) -> tuple[str, str, float]:
        """Rerun the FAILed or TIMEOUT FlagGems op as upstream's own pytest node. A failure: whether
        upstream fails too (FAIL_UPSTREAM) or not (ours). A timeout: whether upstream alone is as
        slow (TIMEOUT_UPSTREAM, an op too long for the budget) or not (TIMEOUT, the note saying
        whether upstream finishes). (status, note, seconds)."""
        try:
            code, seconds, where = self._upstream_rerun(entry, device, dtypes, op_dir)
        except NotStarted:
            return "INTERRUPTED", "triage: interrupted before the upstream rerun started", 0.0
        if self.stopping.is_set():
            return "INTERRUPTED", "triage: interrupted during the upstream rerun", seconds
        budget = f"{self.opts.op_timeout:.0f} s"
        if code is None and status == "TIMEOUT":
            return (batchdir.TIMEOUT_UPSTREAM, f"upstream too: the bare node did not finish in {budget} either "
                    f"(killed; {where})", seconds)
        if code is None:
            return status, f"triage undecided: the upstream rerun timed out after {budget} (killed; {where})", seconds
        line = _pytest_line(self.dir / where, code)
        if status == "TIMEOUT":
            # Upstream finishing in the budget makes the time ours; its failing fast says no more than that.
            outcome = "ours: upstream passes" if code == 0 else "upstream fails"
            return status, f"{outcome} in {seconds:.0f} s ({line}; {where})", seconds
        if code == 0:
            return status, f"ours: upstream passes ({line}; {where})", seconds
        return batchdir.FAIL_UPSTREAM, f"upstream fails too: {line} ({where})", seconds

    def _upstream_rerun(self, entry: Entry, device: int, dtypes: list[str] | None,
                        op_dir: Path) -> tuple[int | None, float, Path]:
        """The op as upstream's own pytest node (same checkout, level, dtypes and vendor; upstream's
        timing; the same --op-timeout) in the op's upstream/ dir: (exit code or None on a timeout,
        seconds, its log relative to the batch dir)."""
        root = Path(self.opts.checkouts[entry.repo])
        out = op_dir / batchdir.UPSTREAM_DIR
        shutil.rmtree(out, ignore_errors=True)  # a resumed batch's earlier triage (a link there is refused below)
        rundir.make_dir(out)
        log_path = out / "pytest.log"
        cmd = [sys.executable, "-m", "pytest", f"{entry.file}::test_{entry.op}",
               "--level", self.opts.run.level or "core"]
        for dtype in dtypes or ():
            cmd += ["--dtypes", flaggems.TORCH_DTYPES[dtype]]
        backend = backends.get(self.opts.backend)
        env = {"GEMS_VENDOR": backend.flaggems_vendor} if backend.flaggems_vendor else {}
        if self.opts.run.flagtune is not None:
            env["USE_FLAGTUNE"] = self.opts.run.flagtune
        found = flaggems.package_dir(root)
        # The checkout's package first, as in our child; the harness after it for the op's guard only.
        pythonpath = os.pathsep.join([*([str(found[1])] if found else []),
                                      paths.harness_pythonpath(os.environ.get("PYTHONPATH"))])
        code, seconds = self._attempt(cmd, log_path, cwd=root, env=env, visible=(backend, device),
                                      pythonpath=pythonpath)
        return code, seconds, log_path.relative_to(self.dir)

    def record(self, entry: Entry, row: batchdir.StatusRow) -> None:
        with self.lock:
            self.status[entry.id] = row
            batchdir.write_status(self.dir, self.status, self.COLUMNS)

    # --- all ops ---------------------------------------------------------------------------------
    def device_of(self, entry: Entry) -> int:
        """The op's device: a stable hash over --devices, so a resumed batch puts it on the same one."""
        return self.opts.devices[shard(entry.id, len(self.opts.devices))]

    def run(self, todo: list[Entry], on_done) -> None:
        devices = self.opts.devices
        shards: dict[int, list[Entry]] = {d: [] for d in devices}
        for e in todo:
            shards[self.device_of(e)].append(e)

        forks = self.FORKS and self.opts.op_start == "fork"
        workers_log = rundir.open_write(self.dir / batchdir.WORKERS_LOG) if forks and todo else None

        def device_thread(device: int) -> None:
            try:
                if forks and shards[device]:
                    self._begin_worker(device, workers_log, shards[device])
                for entry in shards[device]:
                    if self.stopping.is_set():
                        return
                    self.events.put(self.run_op(entry, device))
            except BaseException as exc:  # a fault of ours: raised by the batch, not left to hang it
                self.events.put(exc)
            finally:
                worker = self.workers.pop(device, None)
                if worker is not None:
                    worker.close()

        threads = [threading.Thread(target=device_thread, args=(d,), daemon=True) for d in devices]
        remaining = len(todo)
        try:
            for t in threads:
                t.start()  # in the try: a stop that lands as they start stops them too
            while remaining:
                try:
                    row = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if isinstance(row, OSError) and row.filename is not None:
                    raise row  # a file of the batch it could not write (a refused link, a full disk): one line
                if isinstance(row, BaseException):
                    raise RuntimeError("a device thread of the batch failed (its running ops were stopped; "
                                       "resume with --resume --batch-dir)") from row
                remaining -= 1
                on_done(row)
        except BaseException:  # Ctrl-C, SIGTERM, a device thread's fault: no op runs on
            self.stop()
            raise
        finally:
            for t in threads:
                t.join(timeout=KILL_GRACE_S + 5)
            launch.end_orphans()  # what an op's guard, killed outright, left behind
            paths.remove_abandoned()  # the private cache of an op killed outright (a stopped one, on timeout)
            if workers_log is not None:
                workers_log.close()

    def _begin_worker(self, device: int, log, entries: list[Entry]) -> None:
        """The device's warm worker, begun by its device thread, which it outlives by nothing (its death
        signal follows the thread); where it cannot be started, the device's ops start fresh, as the
        first one's notes say. It preloads the FlagGems checkouts of the device's `entries`."""
        worker = self._new_worker(log, flaggems.preload_for(
            [e.key for e in entries], self.opts.run.flaggems_dirs, self.opts.run.flagtune, device))
        try:
            worker.begin()
        except OSError as exc:
            self.worker_notes[device] = (f"its device's warm worker could not start ({exc}): device {device}'s ops "
                                         "start fresh")
            return
        self.workers[device] = worker

    def _new_worker(self, log, preload: forkserver.Preload | None = None) -> forkserver.Worker:
        """A warm worker with this interpreter, the batch's environment and the backend's child environment
        (which can change what importing triton does: the interpreter); each op's --device picks its device."""
        backend = backends.get(self.opts.backend)
        return forkserver.Worker(sys.executable, log, backend.child_env, None, None, backend.name, preload)

    def stop(self) -> None:
        """Stop scheduling and kill every running op's process group."""
        self.stopping.set()
        with self.lock:
            children = list(self.children.values())
        for child in children:
            child.stop(KILL_GRACE_S)


class NotStarted(Exception):
    """An attempt the batch's stop came before: its child exited at the start gate having run nothing."""


def _dropped(line: str) -> None:
    """A forked op's stdout line: in its log only, as a fresh op's is."""


def _recorded_outcome(run_dir: Path) -> Outcome | None:
    """The outcome the run recorded in its run.json, or None (no run dir, none recorded)."""
    try:
        return Outcome.from_json(rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {}).get("outcome"))
    except (OSError, ValueError, AttributeError):
        return None


def _dtype_rejected(code: int, run_dir: Path | None) -> bool:
    """Whether the attempt failed because the op does not take the dtypes asked for: ours is said
    by DtypeRejected's exit code (before any run dir exists), FlagGems' own by the child in its
    run.json (`observed.dtype_rejected`)."""
    if code == DtypeRejected.exit_code:
        return True
    if run_dir is None:
        return False
    try:
        return rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {}).get("dtype_rejected") is True
    except (OSError, ValueError):
        return False


def _error_line(log_path: Path) -> str:
    """The `error: ...` line the last attempt printed into the op's log (what refused it), else a
    pointer to the log. Each attempt's output starts at its `$ command` line (launch.start)."""
    lines = bounded.read_tail(log_path).splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith("$ ")), default=-1)
    found = next((line for line in reversed(lines[last + 1:]) if line.startswith("error: ")), None)
    return found[len("error: "):].strip()[:300] if found else f"see {log_path.name}"


def _pytest_line(log_path: Path, code: int) -> str:
    """What a pytest log says in one line: its first error (an `E   ` line, else a FAILED or ERROR
    summary line) when it failed, its final summary line (`1 passed in 0.1s`) when it passed."""
    lines = [line.strip() for line in bounded.read_tail(log_path).splitlines() if line.strip()]
    if code != 0:
        for prefix in ("E ", "FAILED ", "ERROR "):
            found = next((line for line in lines if line.startswith(prefix)), None)
            if found:
                return found[1:].strip() if prefix == "E " else found
    return lines[-1].strip("= ") if lines else f"pytest exited {code}"


def _killed_during(run_dir: Path) -> str:
    """Where a timed-out attempt was when it was killed, from its run.json: `observed.running_case`,
    which the child sets as each case starts and clears once it finished normally (or the same in
    the outcome it wrote as it stopped)."""
    if not (run_dir / rundir.RUN_JSON).is_file():
        return "before its run dir was written (the op never started a case)"
    observed = rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {})
    case = observed.get("running_case") or (observed.get("outcome") or {}).get("running_case")
    if case:
        return f"during case {case}"
    rows = _run_facts(run_dir)["rows"]
    return f"with no case running ({rows} row{'s' * (rows != 1)} done)" if rows else "before its first case started"


def _killed_note(run_dir: Path, log_path: Path, what: str) -> None:
    """Say in the op's batch.log, and in the killed run's own run.log, why it stopped there."""
    run_log = run_dir / rundir.RUN_LOG
    for log in [log_path, *([run_log] if run_log.is_file() else [])]:
        with rundir.open_write(log) as f:
            f.write(f"\nkilled by the batch's --op-timeout: {what}\n")


def run_from_args(args, runner_cls: type[Batch] = Batch) -> int:
    """`python -m harness batch ...`; a corpus A/B (harness.sessions.corpus_ab) runs this with its own
    runner class."""
    import importlib.util

    if args.resume and args.batch_dir is None:
        raise UsageError("--resume needs --batch-dir (the batch dir to resume)")
    for executor, package in (("ray", "ray"), ("slurm", "submitit")):
        if args.executor == executor and importlib.util.find_spec(package) is None:
            raise UsageError(f"--executor {executor} needs the {package} package in this environment "
                             f"(pip install {package})")
    if args.executor == "slurm":
        slurm_executor.require_slurm()  # before a batch dir is made that nothing would run in
    if args.summarize:
        if not batchdir.is_batch_dir(args.summarize):
            raise UsageError(f"--summarize {args.summarize}: not a batch dir (it has no {batchdir.BATCH_JSON})")
        print(f"summary: {batchdir.write_summary(args.summarize.resolve())}")
        return 0
    given, given_batch = RunOptions.from_namespace(args), BatchOptions.from_namespace(args)
    with contextlib.ExitStack() as held:
        previous, stored, origin = {}, {}, ""
        run, how = given, given_batch
        if args.resume:
            batch_dir = args.batch_dir.resolve()
            if not batchdir.is_batch_dir(batch_dir):
                raise UsageError(f"--resume --batch-dir {batch_dir}: not a batch dir (it has no {batchdir.BATCH_JSON})")
            held.enter_context(batchdir.own(batch_dir))
            previous = batchdir.read_batch_json(batch_dir, STORED_CHECKS)
            stored = {RENAMED.get(k, k): v for k, v in previous.get("request", {}).items()}
            run, how, origin = _resumed(stored, given, given_batch, batch_dir / batchdir.BATCH_JSON)
            origin = f"resume: {_stored_selection(args, stored)}; {origin}"
        elif args.batch_dir is not None:
            batchdir.check_new(args.batch_dir.resolve())
        extra, run, ops = runner_cls.prepare(args, stored, run)
        backend, devices, checkouts = _where(run, how)
        # What each op's record is given: the backend found, paths absolute, each checkout NAME=PATH.
        run = dataclasses.replace(run, backend=backend.name, device=None,
                                  shapes=run.shapes.resolve() if run.shapes else None,
                                  flaggems_dirs=tuple(f"{r}={p}" for r, p in checkouts.items()))
        if how.replay_root is not None and run.measurement().given():
            flags = " ".join(run.measurement().flags())
            raise UsageError(f"--replay-root replays each op as it was recorded, measured the same way: drop {flags}")
        selected, excluded, left_out = selection.select(args, stored.get("selection"), list(run.ops_paths), checkouts,
                                                        ops)
        if args.resume:
            print(origin)
        op_timeout = batchdir.DEFAULT_OP_TIMEOUT if how.op_timeout is None else how.op_timeout
        op_dtypes = selection.op_dtypes(selected, list(run.ops_paths), op_timeout)
        opts = runner_cls.OPTIONS(run=run, devices=devices, op_timeout=op_timeout,
                                  replay_root=how.replay_root.resolve() if how.replay_root else None,
                                  triage=runner_cls.TRIAGE and how.triage is not False,
                                  op_start=how.op_start or Options.op_start, **extra)
        if args.resume:
            for line in stop_leftovers(batch_dir):
                print(line)
        else:
            batch_dir = batchdir.new(args.batch_dir, args.out, runner_cls.dir_prefix(extra))
            held.enter_context(batchdir.own(batch_dir))
        # A resume given its own selection runs that, and the batch keeps every op it had: a later
        # plain --resume still owes the ones not run yet.
        request = _request(opts, selected, runner_cls.TRIAGE)
        request["selection"] += [i for i in stored.get("selection") or [] if i not in request["selection"]]
        keys = [e.key for e in selected]
        batchdir.write_batch_json(batch_dir, {
            "backend": backend.name, "devices": devices, "flaggems_dirs": opts.checkouts,
            "selected": keys + [k for k in previous.get("selected") or [] if k not in keys],
            "excluded": {e.key: why for e, why in excluded},
            "left_out_repos": dict(left_out), "request": {**request, **extra}})
        runner = runner_cls(batch_dir, opts, op_dtypes)
        if args.resume:
            for line in slurm_executor.settle_leftovers(runner, runner.device_of):
                print(line)
        todo = [e for e in selected if not (args.resume and batchdir.completed(batch_dir, e.key, opts.op_timeout))]
        print(f"batch dir: {batch_dir}\n{len(selected)} selected, {len(selected) - len(todo)} already done, "
              f"{len(excluded)} excluded; devices {devices}; backend {backend.name}")
        for e, why in excluded:
            print(f"  excluded {e.key}: {why}")
        if len(todo) > runner_cls.LARGE_SELECTION:
            print(_rough_cost(len(todo), runner_cls.TYPICAL_OP_S, len(devices), opts.op_timeout, batch_dir))
        return _run(runner, todo, selected, args)


def _rough_cost(ops: int, typical_s: float, devices: int, op_timeout: float, batch_dir: Path) -> str:
    hours = ops * typical_s / devices / 3600
    return (f"rough cost: {ops} ops x ~{typical_s:g} s (a typical op on one H200) / {devices} device"
            f"{'s' * (devices != 1)} = ~{hours:.1f} h; no op runs past --op-timeout {op_timeout:g} s. Ctrl-C stops it "
            f"safely; `--resume --batch-dir {batch_dir}` carries on where it stopped")


# What batch.json's request holds beside the options (which check themselves: harness.core.options).
STORED_CHECKS = {"selection": (batchdir.is_strings, "a list of [repo:]op[@op_file]")}


def _resumed(stored: dict, given: RunOptions, given_batch: BatchOptions,
             where: Path) -> tuple[RunOptions, BatchOptions, str]:
    """The options a resume runs with: those stored in batch.json, with what the command line gives
    over them; and the line saying which came from where."""
    def refuse(name, value, what) -> UsageError:
        return batchdir.corrupt_field(where, name, value, what)

    kept, kept_batch = RunOptions.from_dict(stored, refuse), BatchOptions.from_dict(stored, refuse)
    names = {**given.given(), **given_batch.given()}
    from_file = kept.flags(but=names) + kept_batch.flags(but=names)
    from_cli = given.flags() + given_batch.flags()
    return (dataclasses.replace(kept, **given.given()), dataclasses.replace(kept_batch, **given_batch.given()),
            f"options from {batchdir.BATCH_JSON}: {' '.join(from_file) or 'none'}; "
            f"from the command line: {' '.join(from_cli) or 'none'}")


def _stored_selection(args, stored: dict) -> str:
    n = len(stored.get("selection") or [])
    if args.all or args.ops or args.ops_file or args.repos:
        return (f"the selection given on the command line ({batchdir.BATCH_JSON} keeps its {n} ops, and adds any "
                "new: a plain --resume runs those not done)")
    return f"the selection stored in {batchdir.BATCH_JSON} ({n} op{'s' * (n != 1)})"


def _slurm_params(items: list[str] | None, op_timeout: float) -> dict:
    """--slurm-param KEY=VAL ... as submitit's `slurm_KEY` parameters, after a task time limit that
    fits an op's every attempt (retries, the dtype rescue, triage) at --op-timeout each."""
    params: dict = {"timeout_min": math.ceil(op_timeout * (MAX_RETRIES + 3) / 60) + 5}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--slurm-param {item!r}: expected KEY=VAL (e.g. partition=gpu)")
        params[f"slurm_{key}"] = value
    return params


def _where(run: RunOptions, how: BatchOptions) -> tuple[backends.Backend, list[int], dict[str, Path]]:
    """(backend, devices, FlagGems checkouts)."""
    backend = resolve.resolve_backend(run.backend)
    resolve.check_measurement(backend, run.timer, run.l2)
    try:
        wanted = None if how.devices is None else [int(d) for d in how.devices.split(",") if d.strip()]
    except ValueError:
        raise UsageError(f"--devices {how.devices}: expected comma-separated device indices, "
                                 "e.g. 0,1") from None
    twice = sorted({d for d in wanted or () if wanted.count(d) > 1})
    if twice:  # two ops at once on one device, each timing under the other's load
        raise UsageError(f"--devices {how.devices}: device {', '.join(map(str, twice))} given twice")
    try:
        devices = backend.check_available(wanted)
    except backends.BackendUnavailable as exc:
        raise UsageError(str(exc)) from exc
    try:
        checkouts = flaggems.parse_dirs(run.flaggems_dirs)
    except flaggems.FlagGemsError as exc:
        raise UsageError(str(exc)) from exc
    return backend, devices, checkouts


# --- a dead batch's leftovers --------------------------------------------------------------------
def stop_leftovers(batch_dir: Path) -> list[str]:
    """Stop the ops of a dead batch that still run (their guard could not end them: stopped, or
    killed alone), before this batch uses their devices. One line for each one stopped."""
    lines = []
    for running in sorted(batch_dir.glob(f"ops/*/{opguard.RUNNING}")):
        facts = opguard.stop_leftover(running, KILL_GRACE_S)
        if facts is not None:
            lines.append(f"resume: stopped {running.parent.relative_to(batch_dir)}, still running from the dead "
                         f"batch pid {facts['batch_pid']} (process group {facts['pgid']}), before reusing its device")
    return lines


# --- what a batch stores for its resume -----------------------------------------------------------
def _request(opts: Options, selected: list[Entry], triages: bool = True) -> dict:
    """The options and selection this batch ran with, as a resume reads them back (`_resumed`);
    `triages`: whether the job takes --triage at all."""
    how = BatchOptions(devices=",".join(map(str, opts.devices)), op_timeout=opts.op_timeout,
                       replay_root=opts.replay_root,
                       triage=False if triages and not opts.triage else None,  # on, the default, is stored as null
                       op_start=None if opts.op_start == Options.op_start else opts.op_start)  # likewise
    return {**opts.run.to_dict(), **how.to_dict(), "selection": [e.id for e in selected]}


# --- running -------------------------------------------------------------------------------------
def _execute(runner: Batch, todo: list[Entry], on_done, args) -> None:
    """Every op of `todo` through the executor asked for."""
    if args.executor == "ray":
        ray_executor.run(runner, todo, on_done, args.ray_address, runner.device_of)
    elif args.executor == "slurm":
        slurm_executor.run(runner, todo, on_done, _slurm_params(args.slurm_param, runner.opts.op_timeout),
                           runner.device_of)
    else:
        runner.run(todo, on_done)


def _run(runner: Batch, todo: list[Entry], selected: list[Entry], args) -> int:
    counts = collections.Counter()
    from tqdm import tqdm

    killed = []  # the ops a stop killed, as their rows come in
    with tqdm(total=len(todo), unit="op", dynamic_ncols=True, disable=None) as bar:
        def on_done(row):
            counts.update(runner.tally(row))
            bar.set_postfix({k: v for k, v in sorted(counts.items())}, refresh=False)
            bar.update(1)
            bar.write(runner.done_line(row))
            if row.status == "INTERRUPTED":
                killed.append(f"{row.repo}:{row.op}")

        try:
            with launch.stops_on_signals():  # a SIGTERM (a job scheduler, `timeout`) stops it as Ctrl-C does
                _execute(runner, todo, on_done, args)
        except KeyboardInterrupt as exc:
            signum = launch.stopped_by(exc)
            # The rows the device threads recorded in ops_status.csv that the stop kept from the terminal (the
            # local executor's; the others show each row as they record it): an op that passed as the stop
            # came, and those it killed.
            while not runner.events.empty():
                row = runner.events.get_nowait()
                if isinstance(row, batchdir.StatusRow):
                    on_done(row)
            which = f" ({', '.join(killed)})" if killed else ""
            print(f"\ninterrupted ({signal.Signals(signum).name}): every running op was killed{which}; resume with "
                  "--resume --batch-dir", runner.dir)
            try:
                print(runner.summarize())
            except Exception as exc:  # said, and the stop's exit code kept: a caller resumes on it
                print(f"summary failed: {type(exc).__name__}: {exc}")
            return 128 + signum
    summary = runner.summarize()
    status = batchdir.read_status(runner.dir)
    # An op with no status row was never reported (an executor lost it): not passed either.
    unreported = [e.key for e in selected if e.id not in status]
    final = collections.Counter(status[e.id].status for e in selected if e.id in status)
    counted = [f"{k} {v}" for k, v in sorted(final.items())]
    if unreported:
        counted.append(f"no status row {len(unreported)}")
    print("done: " + ", ".join(counted) + f"; {summary}")
    failed = sorted([e.key for e in selected
                     if e.id in status and status[e.id].status not in (*batchdir.DONE, *batchdir.UPSTREAM_VERDICTS)]
                    + [f"{key} (no status row)" for key in unreported])
    theirs = sorted(e.key for e in selected if e.id in status and status[e.id].status in batchdir.UPSTREAM_VERDICTS)
    if failed:
        print("not passed: " + ", ".join(failed))
    if theirs:
        # Listed, but not our failure: the exit code is for failures of ours.
        print("failing or timing out upstream too (not counted as ours; see their notes): " + ", ".join(theirs))
    return 1 if failed else 0
