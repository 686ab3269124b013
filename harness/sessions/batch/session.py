"""`python -m harness batch ...`: the batch's options, backend, devices and selection resolved (or read
back from a resumed batch's batch.json), its dir made and owned, its ops run through the executor asked
for, and its outcome said in the last lines and the exit code."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import signal
from pathlib import Path

import backends
from harness.core import batchdir, launch
from harness.core.commands import BatchRequest
from harness.core.errors import UsageError
from harness.core.options import BatchOptions, CorpusOptions, RunOptions
from harness.providers import flaggems, selection
from harness.providers.catalog import Entry
from harness.sessions import ray_executor, resolve, slurm_executor
from harness.sessions.batch import resume
from harness.sessions.batch.executor import stop_leftovers
from harness.sessions.batch.job import MAX_RETRIES, Batch
from harness.sessions.batch.options import Options
from harness.sessions.batch.resume import RENAMED, STORED_CHECKS


def run_from_args(request: BatchRequest, runner_cls: type[Batch] = Batch) -> int:
    """`python -m harness batch ...`; a corpus A/B (harness.sessions.corpus_ab) runs this with its own
    runner class and request (a CorpusABRequest: the batch's, and the A/B each op runs)."""
    import importlib.util

    corpus = request.corpus
    if corpus.resume and corpus.batch_dir is None:
        raise UsageError("--resume needs --batch-dir (the batch dir to resume)")
    for executor, package in (("ray", "ray"), ("slurm", "submitit")):
        if corpus.executor == executor and importlib.util.find_spec(package) is None:
            raise UsageError(f"--executor {executor} needs the {package} package in this environment "
                             f"(pip install {package})")
    if corpus.executor == "slurm":
        slurm_executor.require_slurm()  # before a batch dir is made that nothing would run in
    if request.summarize:
        if not batchdir.is_batch_dir(request.summarize):
            raise UsageError(f"--summarize {request.summarize}: not a batch dir (it has no {batchdir.BATCH_JSON})")
        print(f"summary: {batchdir.write_summary(request.summarize.resolve())}")
        return 0
    given, given_batch = request.run, request.how
    with contextlib.ExitStack() as held:
        previous, stored, origin = {}, {}, ""
        run, how = given, given_batch
        if corpus.resume:
            batch_dir = corpus.batch_dir.resolve()
            if not batchdir.is_batch_dir(batch_dir):
                raise UsageError(f"--resume --batch-dir {batch_dir}: not a batch dir (it has no {batchdir.BATCH_JSON})")
            held.enter_context(batchdir.own(batch_dir))
            previous = batchdir.read_batch_json(batch_dir, STORED_CHECKS)
            stored = {RENAMED.get(k, k): v for k, v in previous.get("request", {}).items()}
            run, how, origin = resume.resumed(stored, given, given_batch, batch_dir / batchdir.BATCH_JSON)
            origin = f"resume: {resume.stored_selection(request.selection, stored)}; {origin}"
        elif corpus.batch_dir is not None:
            batchdir.check_new(corpus.batch_dir.resolve())
        extra, run, ops = runner_cls.prepare(request, stored, run)
        backend, devices, checkouts = _where(run, how)
        # What each op's record is given: the backend found, paths absolute, each checkout NAME=PATH.
        run = dataclasses.replace(run, backend=backend.name, device=None,
                                  shapes=run.shapes.resolve() if run.shapes else None,
                                  flaggems_dirs=tuple(f"{r}={p}" for r, p in checkouts.items()))
        if how.replay_root is not None and run.measurement().given():
            flags = " ".join(run.measurement().flags())
            raise UsageError(f"--replay-root replays each op as it was recorded, measured the same way: drop {flags}")
        selected, excluded, left_out = selection.select(request.selection, stored.get("selection"),
                                                        list(run.ops_paths), checkouts, ops)
        if corpus.resume:
            print(origin)
        op_timeout = batchdir.DEFAULT_OP_TIMEOUT if how.op_timeout is None else how.op_timeout
        op_dtypes = selection.op_dtypes(selected, list(run.ops_paths), op_timeout)
        opts = runner_cls.OPTIONS(run=run, devices=devices, op_timeout=op_timeout,
                                  replay_root=how.replay_root.resolve() if how.replay_root else None,
                                  triage=runner_cls.TRIAGE and how.triage is not False,
                                  op_start=how.op_start or Options.op_start, **extra)
        if corpus.resume:
            for line in stop_leftovers(batch_dir):
                print(line)
        else:
            batch_dir = batchdir.new(corpus.batch_dir, request.out, runner_cls.dir_prefix(extra))
            held.enter_context(batchdir.own(batch_dir))
        # A resume given its own selection runs that, and the batch keeps every op it had: a later
        # plain --resume still owes the ones not run yet.
        request = resume.stored_request(opts, selected, runner_cls.TRIAGE)
        request["selection"] += [i for i in stored.get("selection") or [] if i not in request["selection"]]
        keys = [e.key for e in selected]
        batchdir.write_batch_json(batch_dir, {
            "backend": backend.name, "devices": devices, "flaggems_dirs": opts.checkouts,
            "selected": keys + [k for k in previous.get("selected") or [] if k not in keys],
            "excluded": {e.key: why for e, why in excluded},
            "left_out_repos": dict(left_out), "request": {**request, **extra}})
        runner = runner_cls(batch_dir, opts, op_dtypes)
        if corpus.resume:
            for line in slurm_executor.settle_leftovers(runner, runner.device_of):
                print(line)
        # Done: marked complete and its row in ops_status.csv. The marker is written first, so a batch killed
        # between the two left an op whose row is lost: it runs again.
        rows = batchdir.read_status(batch_dir) if corpus.resume else {}
        todo = [e for e in selected
                if not (e.id in rows and batchdir.completed(batch_dir, e.key, opts.op_timeout))]
        print(f"batch dir: {batch_dir}\n{len(selected)} selected, {len(selected) - len(todo)} already done, "
              f"{len(excluded)} excluded; devices {devices}; backend {backend.name}")
        for e, why in excluded:
            print(f"  excluded {e.key}: {why}")
        if len(todo) > runner_cls.LARGE_SELECTION:
            print(_rough_cost(len(todo), runner_cls.TYPICAL_OP_S, len(devices), opts.op_timeout, batch_dir))
        return _run(runner, todo, selected, corpus)


def _rough_cost(ops: int, typical_s: float, devices: int, op_timeout: float, batch_dir: Path) -> str:
    hours = ops * typical_s / devices / 3600
    return (f"rough cost: {ops} ops x ~{typical_s:g} s (a typical op on one H200) / {devices} device"
            f"{'s' * (devices != 1)} = ~{hours:.1f} h; no op runs past --op-timeout {op_timeout:g} s. Ctrl-C stops it "
            f"safely; `--resume --batch-dir {batch_dir}` carries on where it stopped")


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


# --- running -------------------------------------------------------------------------------------
def _execute(runner: Batch, todo: list[Entry], on_done, corpus: CorpusOptions) -> None:
    """Every op of `todo` through the executor asked for (`corpus`: --executor and its options)."""
    if corpus.executor == "ray":
        ray_executor.run(runner, todo, on_done, corpus.ray_address, runner.device_of)
    elif corpus.executor == "slurm":
        slurm_executor.run(runner, todo, on_done, _slurm_params(corpus.slurm_param, runner.opts.op_timeout),
                           runner.device_of)
    else:
        runner.run(todo, on_done)


def _run(runner: Batch, todo: list[Entry], selected: list[Entry], corpus: CorpusOptions) -> int:
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
                _execute(runner, todo, on_done, corpus)
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
