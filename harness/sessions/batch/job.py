"""An op's job in a batch: its `python -m harness record|replay` attempts, retries, the dtype fallback
and rescue, triage, and its status row (harness.sessions.corpus_ab.CorpusAB overrides the hooks to run a
whole single-op A/B instead).

A FlagGems operator runs as `record NAME:OP@OP_FILE --flaggems-dir NAME=PATH` (replay: the run dir
plus `--flaggems-dir`). Its dtypes are known only once it runs, so when it rejects the requested
ones the fallback goes straight to the rescue run without a dtype filter (harness.sessions.batch.facts).

Triage (on unless `--no-triage`): a FlagGems op that still fails after its retries is rerun once as
the bare upstream pytest node, with upstream's own timing, in the op's `upstream/` dir. When that
fails too the op is FAIL_UPSTREAM (listed, but not our failure: it leaves the exit code alone);
when it passes the op stays FAIL, ours. A timed-out one is rerun the same way under the same
timeout: TIMEOUT_UPSTREAM when upstream does not finish either (likewise not ours), else TIMEOUT,
its notes saying whether upstream finishes. A resume keeps both upstream verdicts.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import sys
from pathlib import Path

import backends
from harness.core import batchdir, paths, rundir
from harness.core.commands import BatchRequest
from harness.core.errors import UsageError
from harness.core.options import RunOptions, declared
from harness.core.request import RunRequest
from harness.providers import catalog, flaggems
from harness.providers.catalog import Entry
from harness.sessions.batch.executor import LocalExecutor, NotStarted
from harness.sessions.batch.facts import (
    dtype_rejected,
    error_line,
    killed_during,
    killed_note,
    pytest_line,
    recorded_outcome,
    run_facts,
)
from harness.sessions.batch.options import Options

MAX_RETRIES = 2


class Batch(LocalExecutor):
    """Runs the per-op job of every selected op: a `record` (or `replay`) run here. The job's hooks
    (`_run_dir`, `_wrote`, `_command`, `_passed`, `_rejected`, `_stopped_in`, `_facts`, `_columns`, `tally`,
    `done_line`, `summarize`) are what harness.sessions.corpus_ab.CorpusAB overrides to run a whole
    single-op A/B instead; retries and triage stay here, sharding, process groups and timeouts in
    LocalExecutor, selection and resume in harness.sessions.batch.session."""

    OPTIONS = Options
    COLUMNS = batchdir.STATUS_COLUMNS
    TRIAGE = True  # whether --triage applies to this job
    # A typical op's wall, for the rough cost a large selection is told up front: a FlagGems op's record
    # at its own (core) shapes, the median of a batch screen on one H200 (issue 45: 21 s).
    TYPICAL_OP_S = 21
    LARGE_SELECTION = 50  # ops above which that cost is said

    def __init__(self, batch_dir: Path, opts: Options, op_dtypes: dict[str, tuple[str, ...]]):
        super().__init__(batch_dir, opts)
        self.op_dtypes = op_dtypes  # entry id -> the dtypes it accepts (built-in and --ops-path ops)
        self.status = batchdir.read_status(batch_dir)
        self.replay_sources = batchdir.read_status(opts.replay_root) if opts.replay_root else {}

    # --- what a job and a batch are made of (overridden by a corpus A/B) -------------------------
    @classmethod
    def prepare(cls, request: BatchRequest, stored: dict,
                run: RunOptions) -> tuple[dict, RunOptions, list[str] | None]:
        """(extra fields of this job's Options, from the command line or what a resumed batch stored
        (stored with the request, so a resume gets them back); the run options its ops get; the ops
        to select when the command line names none, None for the stored selection)."""
        if "plan" in stored:
            raise UsageError(f"--batch-dir {request.corpus.batch_dir} is a corpus A/B: resume it with nox -s ab -- "
                             "--resume --batch-dir DIR")
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
        outcome = recorded_outcome(run_dir)
        return code == 0 and outcome is not None and outcome.complete

    def _failure(self, run_dir: Path) -> str:
        """How a failed attempt ended, as its run recorded it ("" when it says nothing more than
        its exit code)."""
        outcome = recorded_outcome(run_dir)
        if outcome is None or outcome.complete:
            return ""
        return f"INCOMPLETE {outcome.rows()} rows: {outcome.reason}{outcome.during()}"

    def _rejected(self, code: int, run_dir: Path) -> bool:
        return dtype_rejected(code, run_dir)

    def _stopped_in(self, run_dir: Path) -> Path:
        """The run the attempt was in when it was killed."""
        return run_dir

    def _facts(self, run_dir: Path | None) -> dict:
        return run_facts(run_dir)

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
                what = f"timeout after {self.opts.op_timeout:.0f} s {killed_during(stopped_in)}"
                notes.append(f"{what} (killed, not retried)")
                killed_note(stopped_in, log_path, what)
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
                notes.append(f"bad input, not retried: {error_line(log_path)}")
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
        return self.status_row(entry, device, status, code, attempts, elapsed, run_dir, notes)

    def status_row(self, entry: Entry, device: int, status: str, code: int | None, attempts: int, elapsed: float,
                   run_dir: Path | None, notes: list[str]) -> batchdir.StatusRow:
        """The op's row from what its job found (an op whose cases all skipped is SKIP), its op dir marked
        complete where a resume keeps the status."""
        facts = self._facts(run_dir)
        if status == "PASS" and facts["statuses"] and set(facts["statuses"]) == {"SKIPPED"}:
            status = "SKIP"
            notes = [*notes, f"skipped: {facts['skip_reason']}"]  # upstream's reason, or the operator's
        row = batchdir.StatusRow(
            entry.op, entry.repo, entry.op_file, status, exit_code=code, attempts=attempts,
            elapsed_s=round(elapsed, 1), backend=self.opts.backend, device=device, timer=facts["timer"],
            rows=facts["rows"], timer_fallback_rows=facts["timer_fallback_rows"],
            replay_fallback_rows=facts["replay_fallback_rows"],
            run_dir=str(run_dir.relative_to(self.dir)) if run_dir else "", notes="; ".join(notes),
            extra=self._columns(facts))
        batchdir.mark_complete(batchdir.op_dir(self.dir, entry.key), status, self.opts.op_timeout)
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
        line = pytest_line(self.dir / where, code)
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
