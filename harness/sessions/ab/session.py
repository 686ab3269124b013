"""`python -m harness ab`: the plan from the command line over its file (resolve_plan), checked before
the first step, run (runner) and reported (reporting); or two run dirs compared (--compare)."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

import backends
from harness.core import abstate, bounded, launch, paths, rundir
from harness.core import spec as spec_mod
from harness.core.commands import ABRequest
from harness.core.errors import UsageError, clip
from harness.core.options import AUTO, FDR, UPSTREAM
from harness.core.results import ResultsError
from harness.providers import catalog, flaggems, probe, registry
from harness.sessions import resolve
from harness.sessions.ab.plan import DEFAULT_PLAN, Plan, PlanError, Side, plan_from_data
from harness.sessions.ab.reporting import op_reports, report, validity
from harness.sessions.ab.runner import LOG_FILE, Runner
from harness.sessions.ab.steps import StepInterrupted


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


def resolve_plan(request: ABRequest, default_chunk: int = 1, default_record_jobs: int = 1) -> Plan:
    """The plan from its file (or --ops), with the experiment and run options the request gives over it.
    `default_chunk`: the chunk where neither the plan nor --chunk names one and passes run once (a corpus
    A/B's on the local executor); `default_record_jobs`, likewise its record jobs, where its chunks record
    first with warm workers."""
    try:
        if request.plan is not None or not request.ops:
            path = Path(request.plan or DEFAULT_PLAN)
            data = rundir.read_yaml_mapping(path, PlanError, "plan")
            plan, chunk_named, jobs_named = plan_from_data(data, path), "chunk" in data, "record_jobs" in data
        else:
            plan = Plan(name="adhoc", ops=list(request.ops), a=Side("A", "as is"), b=Side("B", ""))
            chunk_named = jobs_named = False
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    if request.ops:
        plan.ops = list(request.ops)
    experiment = request.experiment
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
    plan.chunk_records = experiment.chunk_records or plan.chunk_records
    if experiment.record_jobs is not None:
        plan.record_jobs = experiment.record_jobs
    if experiment.chunk is not None:
        plan.chunk = experiment.chunk
    elif not chunk_named and plan.step_passes == "once":
        plan.chunk = default_chunk
    if plan.chunk > 1 and plan.step_passes != "once":
        # A step that collects IR or profiles leaves Triton hooks and the profiler's slowdown in its process.
        raise UsageError(f"chunk {plan.chunk}: a chunk's hosts run timing-only repeats, and with --step-passes "
                         f"{plan.step_passes} every repeat collects IR and profiles: use --step-passes once")
    if experiment.record_jobs is None and not jobs_named and plan.records_in_jobs and plan.chunk_records == "first":
        plan.record_jobs = default_record_jobs
    if experiment.record_jobs not in (None, 1) and not plan.records_in_jobs:
        # Its jobs are a chunk's, each forked by a warm worker of its own: asked for where none runs, said so.
        why = f"chunk {plan.chunk}" if plan.chunk == 1 else "--step-start fresh"
        raise UsageError(f"--record-jobs {experiment.record_jobs}: a chunk's ops record together, forked by warm "
                         f"workers; with {why} each op records alone: give --chunk K (K > 1) and a warm step start")
    for side, env, python, key in ((plan.a, experiment.a_env, experiment.a_python, "a"),
                                   (plan.b, experiment.b_env, experiment.b_python, "b")):
        side.env.update(_env_pairs(list(env), f"--{key}-env"))
        if python:
            problem = bounded.path_problem(python, "executable")
            if problem is not None:
                raise UsageError(f"--{key}-python {python} {problem}")
            side.python = os.path.abspath(python)
    given = request.run
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


def check_plan(plan: Plan) -> None:
    """Every op of the plan resolves, and its shape file exists, before the first step: a typo would
    otherwise surface only after the A/Bs before it ran. Built-in and FlagGems names resolve without importing
    torch (a corpus A/B starts one A/B per op); a user op is loaded, as its record would."""
    twice = [op for op, n in collections.Counter(plan.ops).items() if n > 1]
    if twice:  # each would be a whole A/B again: a list of one op 10^5 times ran 10^5 of them
        raise UsageError(f"ops {clip(twice)} given more than once: name each op once")
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


def _op_dirs(given: tuple[tuple[str, Path], ...], plan: Plan) -> dict[str, Path]:
    """--op-dir OP=DIR: each for an op of the plan (the Runner claims it, a new or empty dir)."""
    unknown = [op for op, _ in given if op not in plan.ops]
    if unknown:
        raise UsageError(f"--op-dir {clip(unknown)}: not an op of this A/B ({clip(plan.ops)})")
    return dict(given)


def _continued(earlier_dir: Path, plan: Plan) -> list[dict]:
    """The steps of the interrupted A/B in `earlier_dir` (--continue) to take over, where it ran this plan
    (its device aside: a step on another device is not taken over, its arguments differ; its ops aside: a
    step is taken over by its op's step of the same arguments, as a corpus A/B's chunk takes over each op's
    own); none, said, where it ran another (a corpus A/B's op resumed under a dtype fallback, say)."""
    path = Path(earlier_dir) / "ab.json"
    try:
        state = abstate.read(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--continue {earlier_dir}: no readable ab.json ({exc})") from exc
    stored = {k: v for k, v in state.get("plan", {}).items() if k not in ("device", "ops")}
    if stored != {k: v for k, v in json.loads(json.dumps(plan.to_dict())).items() if k != "ops"}:
        print(f"--continue {earlier_dir}: that A/B ran another plan: none of its steps is taken over")
        return []
    return state.get("steps", [])


def run_from_args(request: ABRequest) -> int:
    """`python -m harness ab ...`"""
    if request.compare:
        from reports import compare

        dir_a, dir_b = request.compare
        backend_names = set()
        for d in (dir_a, dir_b):
            try:
                backend_names.add(spec_mod.read(d).backend)
                compare.load_rows(d)
            except (spec_mod.SpecError, ResultsError) as exc:
                raise UsageError(f"--compare: {exc}") from exc
        fdr = FDR if request.experiment.fdr is None else request.experiment.fdr
        out = rundir.claim_run_dir(paths.runs_root(request.out), "compare")
        warnings, _ = validity({"runs": {"A": [dir_a], "B": [dir_b]}})
        context = {"name": f"{dir_a.name} vs {dir_b.name}", "a": str(dir_a), "b": str(dir_b),
                   "note": "single runs: each run's raw samples stand in for repeats"}
        return report(out, [{"A": [dir_a], "B": [dir_b]}], context, warnings, backend_names, fdr=fdr)
    plan = resolve_plan(request)
    check_plan(plan)  # a corpus A/B's ops are a batch selection, checked by the batch
    say_if_a_a(plan)  # once the plan is known to run: not before an error in it
    # Read before the dir is claimed: a corrupt one leaves no A/B dir behind.
    earlier = [step for earlier_dir in request.continue_from for step in _continued(earlier_dir, plan)]
    if request.run_dir is not None:  # a corpus A/B names each op's A/B dir, to read it back from there
        ab_dir = rundir.claim_named_dir(request.run_dir, LOG_FILE)
    else:
        ab_dir = rundir.claim_run_dir(paths.runs_root(request.out), f"ab_{plan.name}")
    print(f"A/B {plan.name}: A = {plan.a.describe()}; B = {plan.b.describe()}; ops {' '.join(plan.ops)}; "
          f"{plan.describe_repeats()}\nab dir: {ab_dir}")
    if not backends.get(plan.options.backend).measures_performance:
        from reports import table

        print(table.not_performance_note(plan.options.backend))
    op_dirs = _op_dirs(request.op_dirs, plan)
    runner = Runner(plan, ab_dir, earlier, op_dirs)
    interrupted = write_failed = None
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
    except rundir.RunWriteFault as exc:
        write_failed = exc
        print(f"\n{exc}: stopping, reporting what completed", flush=True)
        results = runner.results
    finally:
        with launch.stops_deferred():  # a second Ctrl-C leaves no worker or host running, no side cache
            runner.close()
    warnings, ir_per_op = validity(results)
    if interrupted or not runner.state["complete"]:
        done = sum(1 for s in runner.state["steps"] if s["usable"])
        warnings.insert(0, f"INCOMPLETE: interrupted after {done} completed steps; rows below cover only those")
    failed = [s["what"] for s in runner.state["steps"] if not s["usable"] and not s.get("run_again")]
    if failed:
        warnings.append(f"{len(failed)} step(s) failed (see ab.log): " + "; ".join(failed))
    again = sorted({s["what"] for s in runner.state["steps"] if s.get("run_again")})
    if again:
        warnings.append(f"{len(again)} step(s) ran again alone after failing beside other ops' (see ab.log): "
                        + "; ".join(again))
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
    # Each op's own report, as a single-op A/B of it writes it.
    failed_reports = op_reports([(op_dir, results[op], {**context, "ir": {op: ir_per_op.get(op)}, "chunk": str(ab_dir)},
                                  [w for w in warnings if op in w or "INCOMPLETE" in w])
                                 for op, op_dir in runner.op_dirs.items() if op in results],
                                {plan.options.backend}, plan.first_repeats, plan.fdr, schedule)
    for op_dir in failed_reports:
        print(f"error: the report of {op_dir} could not be written (its error above)", file=sys.stderr, flush=True)
    if write_failed:
        return rundir.EXIT_DISK_FULL
    return 128 + interrupted if interrupted else 1 if failed or unmeasured or failed_reports else code
