"""Corpus A/B: the compiler A/B over many operators, spread over devices (or Ray, or Slurm).

Each operator's job is today's whole single-op A/B (`python -m harness ab PLAN --ops OP --device N`:
A records, then A and B replay A's record, interleaved, N repeats), run on ONE device into its op
dir `ops/<repo>__<op>/attemptK/ab_<name>_<ts>/`, so both sides of an op always share a device and
any op's A/B can be read or reported alone. Everything else is the batch's (harness.sessions.batch):
selection, stable-hash sharding, one process group per op under its guard, --op-timeout (over the
op's whole A/B), retries, --resume, Ctrl-C, the executors. Per op: PASS (its report was written),
FAIL, TIMEOUT or SKIP; the verdict counts of its rows (from its report.json) feed the progress bar
and the final line, and the corpus report (reports.corpus) is written into the batch dir at the end.

The plan is resolved once, here, and stored in batch.json; each op's A/B reads it back from the
op dir's plan.yaml, so a resume (which refuses a new plan) runs the same experiment.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import sys
import time
from pathlib import Path

import yaml

import backends
from harness.core import abstate, batchdir, rundir
from harness.core.commands import ABRequest, CorpusABRequest
from harness.core.errors import UsageError
from harness.core.options import RunOptions
from harness.measure import device_gate
from harness.providers import catalog
from harness.sessions import batch, resolve
from harness.sessions.ab.plan import Plan, PlanError, plan_from_data
from harness.sessions.ab.runner import op_dir_name
from harness.sessions.ab.session import resolve_plan, say_if_a_a
from harness.sessions.ab.sides import build_side_env
from harness.sessions.batch import facts as batch_facts
from harness.sessions.batch.executor import NotStarted
from harness.sessions.batch.facts import killed_during, killed_note

PLAN_FILE = "plan.yaml"  # in an op's dir: the plan its A/B runs
# A corpus A/B's chunk where neither its plan nor --chunk names one (local executor): each chunk is an A/B
# process of its own, whose start (its workers importing torch and the operator library) held its first
# record back 5-7 s on an H100, and whose hosts time a FlagGems repeat step in 0.9-1.25 s against
# 1.7-1.85 s a process a step (docs/performance.md, "Chunks of ops").
CORPUS_CHUNK = 8
# And its records and B's passes, where neither its plan nor --record-jobs names how many at once (chunks
# whose records run first): on an H100, a chunk of four FlagGems ops recorded in 67.6 s with 4 against 90.7 s
# one at a time, the chunk's wall 16% shorter at 3 repeats (docs/performance.md, "Records together").
CORPUS_RECORD_JOBS = 4
AB_JSON = "ab.json"  # in a single-op A/B dir: its steps (harness.sessions.ab)


def wanted(request: ABRequest) -> bool:
    """Whether `python -m harness ab` is a corpus A/B: a batch option was given. Without one (a
    plan, or --ops alone) it is today's A/B, in one process, op after op."""
    if request.compare is not None:
        return False
    return bool(request.corpus.given() or request.how.given())


@dataclasses.dataclass(frozen=True)
class ABOptions(batch.Options):
    plan: dict = dataclasses.field(default_factory=dict)  # the resolved plan, as its yaml (ab.Plan.to_dict)


def _plan_flags(request: ABRequest) -> list[str]:
    """The experiment's options given on the command line (the plan's, over its file): the `ab`
    parser's experiment group, and how A records."""
    given = ["PLAN"] if request.plan is not None else []
    given += request.experiment.flags()
    return given + request.run.measurement().flags()


def _plan_of(data: dict, where: str = "stored in batch.json") -> Plan:
    """The stored plan, checked as a plan file is (its paths are absolute already)."""
    try:
        return plan_from_data(data, where, Path("/"))
    except PlanError as exc:
        raise UsageError(f"{exc} (a corrupt batch.json: start a new --batch-dir)") from exc


def _steps(ab_dir: Path) -> list[dict]:
    """A single-op A/B's steps as its ab.json lists them, in order, the one it was running last
    included ([] before it wrote one)."""
    path = ab_dir / AB_JSON
    state = abstate.read(path, plan_needed=False) if path.is_file() else {}
    return [*state.get("steps", []), *abstate.running_steps(state)]


def _record_dir(ab_dir: Path) -> Path | None:
    """A's record's run dir, as the A/B named it (None: the record wrote none); the last one's where a record
    that failed beside others ran again alone."""
    record = next((s for s in reversed(_steps(ab_dir)) if s["args"][0] == "record"), None)
    return Path(record["run_dir"]) if record and record["run_dir"] else None


def _interrupted(op_dir: Path, run_dir: Path) -> Path | None:
    """The op's last A/B dir before `run_dir` (in any attempt), where it stopped short of its last step (a
    stopped or killed corpus A/B): the next one goes on from it (ab --continue), running no completed
    step again. One that ran to its end and failed is run afresh, as a retry."""
    dirs = sorted((p.parent for p in op_dir.glob(f"attempt*/*/{AB_JSON}") if p.parent != run_dir),
                  key=lambda d: (d / AB_JSON).stat().st_mtime)
    if not dirs:
        return None
    return None if abstate.read(dirs[-1] / AB_JSON, plan_needed=False).get("complete") else dirs[-1]


def verdicts(ab_dir: Path | None) -> collections.Counter:
    """Verdict per row of a single-op A/B's report.json (UNPAIRED: a row one side lacks)."""
    report = ab_dir / "report.json" if ab_dir else None
    if report is None or not report.is_file():
        return collections.Counter()
    rows = rundir.read_json(report)["rows"]
    return collections.Counter((r["comparison"] or {}).get("verdict", "UNPAIRED") for r in rows)


class CorpusAB(batch.Batch):
    """A batch whose per-op job is a whole single-op A/B on one device."""

    OPTIONS = ABOptions
    COLUMNS = (*batchdir.STATUS_COLUMNS, "verdicts")
    TRIAGE = False  # an op's A/B failing is not triaged against upstream
    # Its op is an A/B parent, which imports no torch and begins warm workers of its own: started fresh.
    FORKS = False
    # An estimate between two FlagGems op A/Bs at 3 repeats on one H200 (2026-12-04, after the worker's
    # preload): 31 s at 2 rows an op (exp, bmm), 167 s for bmm_out at its own 15 rows.
    TYPICAL_OP_S = 60

    @classmethod
    def prepare(cls, request: CorpusABRequest, stored: dict,
                run: RunOptions) -> tuple[dict, RunOptions, list[str] | None]:
        """The plan: resolved from the command line, or as a resume finds it stored. The batch runs what
        and where the plan says; how A records is the plan's alone (each op's A/B reads it from the plan)."""
        ops = None
        if request.corpus.resume and stored:
            again = _plan_flags(request.ab)
            if again:
                raise UsageError(f"--resume continues the A/B stored in the batch dir, whose plan it keeps: drop "
                                 f"{' '.join(again)}")
            if "plan" not in stored:
                raise UsageError(f"--resume --batch-dir {request.corpus.batch_dir}: a batch, not a corpus A/B: resume "
                                 "it with nox -s batch -- --resume --batch-dir DIR")
            plan = _plan_of(stored["plan"], f"stored in {request.corpus.batch_dir / batchdir.BATCH_JSON}")
        else:
            local = request.corpus.executor == "local"
            plan = resolve_plan(request.ab, CORPUS_CHUNK if local else 1, CORPUS_RECORD_JOBS if local else 1)
            say_if_a_a(plan)
            run, ops = plan.options, plan.ops
        run = run.without_measurement()  # (the batch drops the device: each op is given its own)
        if plan.chunk > 1 and request.corpus.executor in ("ray", "slurm"):
            print(f"note: chunk {plan.chunk}: the {request.corpus.executor} executor runs each op's A/B as a task "
                  "of its own (chunks are the local executor's device threads')")
        print(f"A/B {plan.name}: A = {plan.a.describe()}; B = {plan.b.describe()}; {plan.describe_repeats()}; "
              "each op's whole A/B on one device")
        backend = resolve.resolve_backend(run.backend).name
        if not backends.get(backend).measures_performance:
            from reports import table

            print(table.not_performance_note(backend))
        for side in (plan.a, plan.b):
            if side.requirements:  # built once here, not by concurrent ops into the same env dir
                build_side_env(side, sys.stdout)
        return {"plan": plan.to_dict()}, run, ops

    @classmethod
    def dir_prefix(cls, extra: dict) -> str:
        return f"ab-corpus_{extra['plan']['name']}"

    def _run_dir(self, entry, attempt_dir: Path) -> Path:
        """The attempt's single-op A/B dir, `ab_<name>_<ts>` as the A/B would name it."""
        return rundir.unclaimed_run_dir(attempt_dir, f"ab_{self.opts.plan['name']}")

    def _wrote(self, run_dir: Path) -> bool:
        return (run_dir / AB_JSON).is_file()

    def _command(self, entry, device: int, dtypes: list[str] | None, run_dir: Path) -> list[str]:
        plan_file = run_dir.parent.parent / PLAN_FILE
        rundir.atomic_write_text(plan_file, yaml.safe_dump(self.opts.plan, sort_keys=False))
        over = RunOptions(dtypes=tuple(dtypes) if dtypes else None)  # the batch's dtype fallback, over the plan's
        earlier = _interrupted(run_dir.parent.parent, run_dir)
        return ["ab", str(plan_file), "--ops", _target(entry), "--device", str(device), "--color", "never",
                "--run-dir", str(run_dir), *over.to_argv(), *(["--continue", str(earlier)] if earlier else [])]

    # --- chunks of ops ---------------------------------------------------------------------------
    def run_shard(self, entries: list, device: int):
        """The device's ops a chunk (the plan's `chunk`) at a time: each chunk one multi-op A/B, whose repeats
        each side times in one measuring host (harness.sessions.ab.runner), writing each op's own A/B dir
        (--op-dir) as its status row names it. An op that did not pass there runs its own job, as without
        chunks, going on from what its chunk completed of it (--continue)."""
        size = self.opts.plan.get("chunk", 1)
        for start in range(0, len(entries), size):
            chunk = entries[start:start + size]
            if self.stopping.is_set():
                return
            ended = self._run_chunk(chunk, device) if len(chunk) > 1 else {}
            for entry in chunk:
                if entry.id in ended:
                    yield ended[entry.id]
                elif self.stopping.is_set():
                    return
                else:
                    yield self.run_op(entry, device)

    def _run_chunk(self, chunk: list, device: int) -> dict[str, batchdir.StatusRow]:
        """The chunk's A/B in `chunks/chunk_<ts>/` under one guard and a timeout of --op-timeout per op (one more
        for the chunk's own start); the recorded rows of its ops that passed, and, where the batch's stop ended
        it, INTERRUPTED rows of the others (a resume goes on from their own dirs)."""
        chunk_dir = rundir.unclaimed_run_dir(rundir.make_dir(self.dir / batchdir.CHUNKS, under=self.dir), "chunk")
        rundir.make_dir(chunk_dir)
        plan_file = chunk_dir / PLAN_FILE
        rundir.atomic_write_text(plan_file, yaml.safe_dump(self.opts.plan, sort_keys=False))
        op_dirs, earlier = {}, []
        for entry in chunk:
            op_dir = rundir.make_dir(batchdir.op_dir(self.dir, entry.key), under=self.dir)
            (op_dir / batchdir.COMPLETE).unlink(missing_ok=True)
            attempt = next(op_dir / f"attempt{n}" for n in itertools.count(1) if not (op_dir / f"attempt{n}").exists())
            op_dirs[entry.id] = self._run_dir(entry, rundir.make_dir(attempt))
            found = _interrupted(op_dir, op_dirs[entry.id])
            earlier += ["--continue", str(found)] if found else []
        over = RunOptions(dtypes=self.opts.run.dtypes)
        argv = ["ab", str(plan_file), "--ops", *map(_target, chunk), "--device", str(device), "--color", "never",
                "--run-dir", str(chunk_dir / "ab"), *over.to_argv(), *earlier,
                *(arg for entry in chunk for arg in ("--op-dir", f"{_target(entry)}={op_dirs[entry.id]}"))]
        names = {op_dir_name(_target(entry)): entry for entry in chunk}
        hung: list = []  # the op found past --op-timeout, whose chunk is ended for it

        def overdue() -> bool:
            hung.extend(self._overdue(chunk_dir / "ab" / AB_JSON, names)[:1])
            return bool(hung)

        try:
            # The chunk's own bound, behind each op's (overdue): one --op-timeout more than its ops', for what no
            # op's steps hold (its A/B's start and workers' imports: tens of seconds on a loaded host, where a
            # bound of its ops' alone ended chunks with no op past its own).
            code, _ = self._run_attempt(argv, chunk_dir / "batch.log", device,
                                        timeout=self.opts.op_timeout * (len(chunk) + 1), overdue=overdue)
        except NotStarted:  # the stop came first: nothing of the chunk ran
            return {}
        where = chunk_dir.relative_to(self.dir)
        rows = {}
        if code is None and hung and not self.stopping.is_set():
            # Its own job would spend --op-timeout again on it; the others' own jobs go on from their views.
            entry = hung[0]
            view = op_dirs[entry.id]
            stopped_in = self._stopped_in(view)
            what = f"timeout after {self.opts.op_timeout:.0f} s {killed_during(stopped_in)} in {where}"
            killed_note(stopped_in, chunk_dir / "batch.log", what)
            rows[entry.id] = self.status_row(entry, device, "TIMEOUT", None, 1, self.opts.op_timeout,
                                             view if self._wrote(view) else None, [f"{what} (killed, not retried)"])
            self.record(entry, rows[entry.id])
        for entry in chunk:
            view = op_dirs[entry.id]
            if entry.id in rows:
                continue
            if code is None or not self._passed(code, view):
                if self.stopping.is_set():
                    rows[entry.id] = self.status_row(entry, device, "INTERRUPTED", code, 1, 0.0,
                                                     view if self._wrote(view) else None,
                                                     [f"interrupted in {where}"])
                    self.record(entry, rows[entry.id])
                continue  # its own job runs it, going on from its view
            # Its share of the chunk's wall: its own steps' seconds.
            spent = sum(s["seconds"] for s in _steps(view) if "seconds" in s and not s.get("taken_over"))
            rows[entry.id] = self.status_row(entry, device, "PASS", code, 1, spent, view,
                                             [f"timed with {len(chunk) - 1} other ops in {where}"])
            self.record(entry, rows[entry.id])
        return rows

    def _overdue(self, ab_json: Path, names: dict) -> list:
        """The chunk's ops (of `names`: op dir -> entry) whose steps in it have taken longer than --op-timeout,
        the one running counted to now (ab.json `running.started`)."""
        try:
            state = abstate.read(ab_json, plan_needed=False)
        except (OSError, ValueError):  # not written yet
            return []
        spent = collections.Counter()
        for step in state.get("steps", []):
            if not step.get("taken_over") and isinstance(step.get("seconds"), (int, float)):
                spent[str(step.get("step", "")).split("/")[0]] += step["seconds"]
        # While record or passes steps run beside the repeats (or beside each other, --record-jobs), one may be
        # waiting for the device another holds (harness.measure.device_gate): the time is charged to the holder's
        # op (a record hung in a case, or a repeat hung timing a row, would otherwise time out the others' ops),
        # and to each step beside where none holds it. Each look charges the whole of a running step's time to
        # the op whose step holds the device then: a hang holds it for good, so the look that ends the chunk
        # charges the hung op.
        for step in _charged(state):
            if isinstance(step.get("started"), (int, float)) and step.get("run_dir"):
                spent[Path(step["run_dir"]).parent.parent.name] += time.time() - step["started"]
        return [names[name] for name, seconds in spent.items() if name in names and seconds > self.opts.op_timeout]

    def _passed(self, code: int, run_dir: Path) -> bool:
        """Its report was written, over rows to compare (or over an op that skipped every case)."""
        if not (run_dir / "report.json").is_file():
            return False
        if not abstate.read(run_dir / AB_JSON, plan_needed=False).get("complete"):
            return False
        return bool(verdicts(run_dir)) or set(self._facts(run_dir)["statuses"]) == {"SKIPPED"}

    def _rejected(self, code: int, run_dir: Path) -> bool:
        """A's record rejected the dtypes: the A/B's first step says so as a record run would."""
        record = next((s for s in reversed(_steps(run_dir)) if s["args"][0] == "record" and "exit" in s), None)
        return record is not None and record["exit"] != 0 and batch_facts.dtype_rejected(
            record["exit"], Path(record["run_dir"]) if record["run_dir"] else None)

    def _stopped_in(self, run_dir: Path) -> Path:
        """The run of the step that was running, else of the last step that wrote one (the A/B dir
        itself before any)."""
        named = [s["run_dir"] for s in _steps(run_dir) if s["run_dir"]]
        return Path(named[-1]) if named else run_dir

    def _facts(self, run_dir: Path | None) -> dict:
        """The report's rows, flags and timers, with A's record's case statuses (SKIP)."""
        facts = batch_facts.run_facts(_record_dir(run_dir) if run_dir else None)
        report = run_dir / "report.json" if run_dir else None
        if report is None or not report.is_file():
            return {**facts, "rows": 0, "verdicts": collections.Counter()}
        rows = rundir.read_json(report)["rows"]
        flagged = collections.Counter(f for r in rows for f in r["flags"])
        return {**facts, "rows": len(rows), "timer": "+".join(sorted({t for r in rows for t in r["timers"]})),
                "timer_fallback_rows": flagged["timer_fallback"], "replay_fallback_rows": flagged["replay_fallback"],
                "verdicts": verdicts(run_dir)}

    def _columns(self, facts: dict) -> dict:
        return {"verdicts": _said(facts["verdicts"])}

    def tally(self, row: batchdir.StatusRow) -> collections.Counter:
        return super().tally(row) + verdicts(self.dir / row.run_dir if row.run_dir else None)

    def done_line(self, row: batchdir.StatusRow) -> str:
        said = f" [{row.extra['verdicts']}]" if row.extra.get("verdicts") else ""
        return (f"{row.status:<8} {row.repo}:{row.op} device={row.device} {row.elapsed_s} s "
                f"rows={row.rows}{said}{'  ' + row.notes if row.notes else ''}")

    def summarize(self) -> str:
        """The corpus report over every op with an A/B dir (an op that failed is listed in it with
        its reason), and the verdict counts it gives the rows of the ops that passed (they can
        differ from the ops' own reports: the corpus learns its prior from, and controls the FDR over, all its rows)."""
        status = batchdir.read_status(self.dir)
        rows = [r for r in status.values() if r.run_dir and r.status != "SKIP"]
        names = collections.Counter(f"{r.repo}:{r.op}" for r in status.values())
        keyed = sorted(((f"{r.repo}:{r.op}" + (f"@{r.op_file}" if names[f"{r.repo}:{r.op}"] > 1 else ""), r)
                        for r in rows), key=lambda kr: kr[0])
        items = [(key, self.dir / r.run_dir) for key, r in keyed]
        passed = {key for key, r in keyed if r.status == "PASS"}
        plan = _plan_of(self.opts.plan)
        context = {"name": plan.name, "a": plan.a.describe(), "b": plan.b.describe(), "repeats": plan.repeats,
                   "backend": self.opts.backend, "batch_dir": str(self.dir),
                   "op_status": {r.id: r.status for r in status.values()}}
        from reports import corpus  # here: each op's A/B imports this module, and starts its workers first

        data = corpus.from_ab_dirs(items, context, plan.fdr)
        files = corpus.write(self.dir, data)
        total = collections.Counter(r["verdict"] for r in data["rows"] if r["op_key"] in passed)
        return f"verdicts: {_said(total) or 'none'}; report: {', '.join(map(str, files))}"


def _charged(state: dict) -> list[dict]:
    """The running steps whose time counts to their ops now (_overdue): the holder of the device gate's, else
    every step beside the main thread's (none holds the device), else the main thread's."""
    running = abstate.running_steps(state)
    if not running:
        return []
    held = device_gate.holder(state.get("device_gate"))
    if held is not None and held[0] == device_gate.TIMED:
        return running[:1]
    beside = [state[key] for key in abstate.running_keys(state) if key != abstate.RUNNING and state.get(key)]
    if held is not None and held[1] is not None:
        holders = [step for step in beside if _same_path(step.get("run_dir"), held[1])]
        if holders:
            return holders
    return beside or running[-1:]


def _same_path(a, b) -> bool:
    try:
        return isinstance(a, str) and Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _target(entry) -> str:
    """The op as its A/B names it: a FlagGems op with its checkout's name and file, a built-in by name."""
    return entry.id if catalog.needs_checkout(entry.repo) else entry.op


def _said(counts: collections.Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def run_from_args(request: CorpusABRequest) -> int:
    """`python -m harness ab` with batch options: the corpus A/B."""
    return batch.run_from_args(request, CorpusAB)
