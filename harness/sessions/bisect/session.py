"""`python -m harness bisect`: the first build, in an ordered list, at which a set of rows moved.

The session resolves what it bisects once (the builds, the rows, the A/B's options) and writes it into
bisect.json in its dir; then the good build (the list's first) records each op once, and each probe,
an A/B of two builds replaying that record (harness.sessions.bisect.probe), lands in bisect.json as it
completes, written atomically. The search (harness.sessions.bisect.search) is recomputed from those
probes, so `--resume DIR` after an interrupt, even a kill -9, runs none of them again, and a build
built or found unusable once is not looked at again. A Ctrl-C (or SIGTERM) stops the running probe and
reports what was found so far.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import subprocess
from pathlib import Path

import backends
from harness.core import abstate, bounded, launch, paths, rundir
from harness.core.commands import BisectRequest
from harness.core.errors import UsageError, clip
from harness.core.options import AUTO, FDR, MAX_REPEATS, BisectOptions, RunOptions
from harness.core.results import read_results
from harness.sessions import resolve
from harness.sessions.ab.plan import Plan, PlanError, Side, plan_from_data
from harness.sessions.ab.runner import LOG_FILE as AB_LOG_FILE
from harness.sessions.ab.session import check_plan
from harness.sessions.ab.sides import build_side_env
from harness.sessions.bisect import builds as builds_mod
from harness.sessions.bisect import probe, search, stored

BISECT_JSON = "bisect.json"
LOG_FILE = "bisect.log"  # the builds' output
FORMAT = 1
DEFAULT_REPEATS = 3


# --- what is bisected, resolved once --------------------------------------------------------------
def _builds(opts: BisectOptions) -> tuple[list[builds_mod.Build], dict | None]:
    """The ordered builds, and for a git range where and how each is built."""
    if opts.builds is not None and opts.git_range is not None:
        raise UsageError("--builds and --git-range name the builds two ways: give one")
    if opts.builds is not None:
        if opts.checkout is not None or opts.build_cmd is not None:
            raise UsageError("--checkout and --build-cmd go with --git-range, not --builds")
        return builds_mod.from_file(opts.builds.resolve()), None
    if opts.git_range is None:
        raise UsageError("name the builds: --builds FILE, or --git-range GOOD..BAD --checkout DIR --build-cmd CMD")
    if opts.checkout is None or opts.build_cmd is None:
        raise UsageError("--git-range needs --checkout DIR (the compiler's git checkout) and --build-cmd CMD")
    checkout = opts.checkout.resolve()
    git = {"checkout": str(checkout), "build_cmd": opts.build_cmd,
           "cache": str((opts.build_cache or builds_mod.BUILD_CACHE).resolve())}
    return builds_mod.from_git(checkout, opts.git_range), git


def _report_rows(path: Path) -> list[dict]:
    """An A/B's report.json rows, each checked for what --from-ab reads of it (op, dtype, shape, comparison)."""
    data = rundir.read_json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    kinds = {"op": (str,), "dtype": (str, type(None)), "shape": (list, type(None)), "comparison": (dict, type(None))}
    for i, row in enumerate(rows if isinstance(rows, list) else [None]):
        if not (isinstance(row, dict) and all(isinstance(row.get(k), t) for k, t in kinds.items())):
            where = f"rows[{i}] = {clip(row)}" if isinstance(rows, list) else f"rows = {clip(rows)}"
            raise UsageError(f"--from-ab: {path} is corrupt: {where} is not a report row ({', '.join(kinds)})")
    return rows


def _from_ab(ab_dir: Path, named: tuple[str, ...]) -> tuple[Plan, list[dict], dict[str, str]]:
    """An A/B's plan, the rows to bisect (its FASTER/SLOWER rows, or those `named`) with the direction
    each moved, and its side A's record of each of their ops, which every probe replays."""
    for name in ("report.json", "ab.json"):
        if not (ab_dir / name).is_file():
            raise UsageError(f"--from-ab {ab_dir}: no {name} (not an A/B dir, or one that did not finish)")
    state = abstate.read(ab_dir / abstate.AB_JSON)
    stored = {k: v for k, v in state["plan"].items() if k != "device"}
    try:
        plan = plan_from_data(stored, f"{ab_dir / 'ab.json'}", Path("/"))
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    report = _report_rows(ab_dir / "report.json")
    by_id = {probe.row_id(r["op"], r["dtype"], r["shape"]): r for r in report}
    unknown = [n for n in named if n not in by_id]
    if unknown:
        raise UsageError(f"--rows {', '.join(unknown)}: not rows of {ab_dir}/report.json (rows are named "
                         f"'OP DTYPE SHAPE', e.g. {next(iter(by_id), 'softmax fp16 4x16')!r})")
    wanted = named or [i for i, r in by_id.items() if (r["comparison"] or {}).get("verdict") in search.MOVES]
    rows = []
    for row_id in wanted:
        comparison = by_id[row_id]["comparison"] or {}
        direction = comparison.get("verdict") if comparison.get("verdict") in search.MOVES else None
        rows.append({"id": row_id, "op": by_id[row_id]["op"], "direction": direction,
                     "ratio": comparison.get("ratio")})
    if not rows:
        raise UsageError(f"--from-ab {ab_dir}: no FASTER or SLOWER row to bisect (name rows with --rows)")
    records = {s["args"][1]: s["run_dir"] for s in state.get("steps", [])
               if s["args"][0] == "record" and s.get("usable") and len(s["args"]) > 1 and s["run_dir"]}
    missing = sorted({r["op"] for r in rows} - set(records))
    if missing:
        raise UsageError(f"--from-ab {ab_dir}: no usable record of {', '.join(missing)} to replay")
    return plan, rows, {op: records[op] for op in sorted({r["op"] for r in rows})}


def _options(base: RunOptions, given: RunOptions) -> RunOptions:
    """The run options given over `base`, checked as the A/B checks them; a bisect needs verdicts."""
    over = given.given()
    if given.shapes is not None:
        over["shapes"] = given.shapes.resolve()
    over.update(ops_paths=base.ops_paths + given.ops_paths, flaggems_dirs=base.flaggems_dirs + given.flaggems_dirs)
    options = dataclasses.replace(base, **over)
    backend = resolve.resolve_backend(options.backend)
    resolve.check_measurement(backend, options.timer, options.l2)
    if not backend.measures_performance:
        raise UsageError(f"a bisect reads the verdicts of its probes, and backend '{backend.name}' calls none (its "
                         "timings are not performance numbers): run it on an accelerator")
    return dataclasses.replace(options, backend=backend.name)


def resolve_spec(request: BisectRequest) -> dict:
    """Everything a bisect is, from its command line: what bisect.json keeps, and a resume reads."""
    opts, experiment = request.bisect, request.experiment
    build_list, git = _builds(opts)
    if opts.from_ab is not None:
        if request.ops:
            raise UsageError("--from-ab takes its rows' ops from the A/B: drop --ops")
        measurement = request.run.measurement().flags()
        if measurement:
            raise UsageError(f"--from-ab replays the A/B's own record, made as it was: drop {' '.join(measurement)}")
        template, rows, records = _from_ab(opts.from_ab.resolve(), opts.rows or ())
        ops = sorted(records)
        if git is None:
            _say_if_not_the_abs_sides(template, build_list)
    elif request.ops:
        if opts.rows:
            raise UsageError("--rows names rows of an A/B: give --from-ab DIR")
        template = Plan(name="bisect", ops=list(request.ops), a=Side("A", ""), b=Side("B", ""))
        rows, records, ops = None, {}, list(request.ops)
    else:
        raise UsageError("name the rows: --from-ab AB_DIR [--rows ...], or --ops OP ...")
    template.options = _options(template.options, request.run)
    template.ops = ops
    check_plan(template)  # every op resolves, before any build is built
    if experiment.repeats == AUTO:
        raise UsageError("--repeats auto: a bisect's probes take a count; a NOISY probe is run again at twice the "
                         "repeats, up to --max-repeats")
    repeats = experiment.repeats or DEFAULT_REPEATS
    max_repeats = experiment.max_repeats or min(4 * repeats, MAX_REPEATS)
    if max_repeats < repeats:
        raise UsageError(f"--max-repeats {max_repeats} is below --repeats {repeats}")
    template.fdr = FDR if experiment.fdr is None else experiment.fdr
    template.step_start = experiment.step_start or template.step_start
    return {"builds": [b.to_dict() for b in build_list], "git": git, "ops": ops, "rows": rows,
            "records": records, "from_ab": str(opts.from_ab.resolve()) if opts.from_ab else None,
            "plan": template.to_dict(), "device": template.options.device, "repeats": repeats,
            "max_repeats": max_repeats}


def _say_if_not_the_abs_sides(ab_plan: Plan, build_list: list) -> None:
    """A note where the list's first build is not the A/B's side A, or its last not side B: the rows
    and their direction are the A/B's, and the search takes the last build as bad on its word (the
    confirm checks it)."""
    def compiler(side: Side) -> tuple:
        return dict(side.env), side.python, list(side.requirements)

    for end, build, side in (("first", build_list[0], ab_plan.a), ("last", build_list[-1], ab_plan.b)):
        if compiler(build.side(side.name)) != compiler(side):
            print(f"note: the list's {end} build ({build.label}) is not the A/B's side {side.name} "
                  f"({side.describe()}): the rows moved between the A/B's sides, and are searched over these "
                  f"builds as if they were its ends", flush=True)


# --- the run -----------------------------------------------------------------------------------------
class Bisect:
    def __init__(self, bisect_dir: Path, state: dict):
        self.dir = bisect_dir
        self.state = state
        spec = state["spec"]
        self.builds = [builds_mod.Build.from_dict(b) for b in spec["builds"]]
        self.template = plan_from_data(spec["plan"], str(bisect_dir / BISECT_JSON), Path("/"))
        self.template.options = dataclasses.replace(self.template.options, device=spec["device"])
        self.log = rundir.open_write(bisect_dir / LOG_FILE)  # never through a link planted there

    def save(self) -> None:
        rundir.atomic_write_json(self.dir / BISECT_JSON, self.state)

    def build(self, k: int) -> builds_mod.Build | None:
        """Build k ready to run (built and importable), else None; found out once, then kept."""
        known = self.state["builds"].get(str(k))
        if known is None:
            known = self.state["builds"][str(k)] = self._prepare(k)
            self.save()
            said = "ok" if known["ok"] else f"SKIPPED: {known['reason']}"
            print(f"build {k} ({self.builds[k].label}): {said}", flush=True)
        return dataclasses.replace(self.builds[k], python=known["python"]) if known["ok"] else None

    def _prepare(self, k: int) -> dict:
        build, git = self.builds[k], self.state["spec"]["git"]
        try:
            if git is not None:
                build = builds_mod.build_commit(build, Path(git["checkout"]), git["build_cmd"], Path(git["cache"]),
                                                self.log)
            elif build.requirements:
                build = dataclasses.replace(build, python=build_side_env(build.side(f"build {k}"), self.log))
            builds_mod.check_imports(build, dict(backends.get(self.template.options.backend).child_env))
        except (builds_mod.BuildFailed, OSError) as exc:
            return {"ok": False, "reason": str(exc), "python": build.python}
        except subprocess.CalledProcessError as exc:
            return {"ok": False, "reason": f"its env did not build ({exc})", "python": build.python}
        return {"ok": True, "reason": None, "python": build.python}

    def record(self) -> None:
        """The good build's record of each op that has none (an A/B's, or made here once)."""
        good = self.build(0)
        if good is None:
            raise UsageError(f"the good build (build 0, {self.builds[0].label}) cannot run: "
                             f"{self.state['builds']['0']['reason']}")
        records = self.state["records"]
        for op in (op for op in self.state["spec"]["ops"] if op not in records):
            record_root = self.dir / "record" / probe.op_dir_name(op)
            rundir.make_dir(record_root, under=self.dir)
            plan = probe.plan_for(self.template.name, good.side("A"), good.side("B"), [op], self.template, 2)
            runner = probe.ProbeRunner(plan, record_root)
            try:
                made = runner.record(op)
            finally:
                runner.close()
            if made is None:
                raise UsageError(f"the good build's record of {op} failed: see {record_root / AB_LOG_FILE}")
            records[op] = str(made)
            self.save()
        if self.state["rows"] is None:  # --ops: every row the record measured; the probes say which moved
            self.state["rows"] = [{"id": probe.row_id(r.op, r.dtype, r.shape), "op": r.op, "direction": None}
                                  for op in self.state["spec"]["ops"] for r in read_results(Path(records[op]))
                                  if r.status != "SKIPPED"]
            self.save()

    def search(self) -> search.Search:
        skipped = {int(k): b["reason"] for k, b in self.state["builds"].items() if not b["ok"]}
        spec = self.state["spec"]
        return search.replay(len(self.builds), self.state["rows"], spec["repeats"], spec["max_repeats"], skipped,
                             self.state["probes"])

    def run(self) -> None:
        self.record()
        while True:
            found = self.search()
            step = search.next_probe(found)
            if step is None:
                break
            if self.build(step.a) is None or self.build(step.b) is None:
                continue  # skipped now: the search asks again without it
            self._probe(step)
        self.state["complete"] = True
        self.save()

    def _probe(self, step: search.Probe) -> None:
        n = len(self.state["probes"]) + 1
        rows = {r["id"]: r["op"] for r in self.state["rows"]}
        ops = sorted({rows[r] for r in step.rows})
        name = f"probe-{n:02d}-{step.kind}-{step.a}-vs-{step.b}"
        probe_dir, again = self.dir / name, 2
        while os.path.lexists(probe_dir):  # one an interrupt (a kill -9) left unfinished: kept as it is
            probe_dir, again = self.dir / f"{name}-try{again}", again + 1
        a, b = self.build(step.a), self.build(step.b)
        plan = probe.plan_for(f"{name}", a.side("A"), b.side("B"), ops, self.template, step.repeats)
        tag = f"probe {n} ({step.kind}: build {step.a} vs build {step.b}, {step.repeats} repeats)"
        print(f"{tag}: {len(step.rows)} row(s) of {', '.join(ops)}", flush=True)
        records = {op: Path(self.state["records"][op]) for op in ops}
        said = probe.run(plan, probe_dir, records, step.rows, passes=step.kind == search.CONFIRM, tag=tag)
        verdicts = {r: said[r] for r in step.rows if r in said}
        counts = collections.Counter(v["verdict"] for v in verdicts.values())
        print(f"{tag}: {', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'no rows compared'}", flush=True)
        self.state["probes"].append({"probe": step.to_dict(), "dir": str(probe_dir), "verdicts": verdicts})
        self.save()

    def close(self) -> None:
        self.log.close()


def _resume(bisect_dir: Path, request: BisectRequest) -> dict:
    path = bisect_dir / BISECT_JSON
    found = bounded.path_problem(bisect_dir, "dir")
    if found is not None:
        raise UsageError(f"--resume {bisect_dir} {found}: give a bisect dir")
    found = bounded.path_problem(path, "file")
    if found == "does not exist":
        raise UsageError(f"--resume {bisect_dir}: no {BISECT_JSON} there (not a bisect dir)")
    if found is not None:
        raise UsageError(f"--resume: {path} {found}")
    again = (request.bisect.flags(but=("resume",)) + request.experiment.flags() + request.run.flags()
             + (["--ops"] if request.ops else []))
    if again:
        raise UsageError(f"--resume continues the bisect stored in {path}: drop {' '.join(again)}")
    try:
        state = rundir.read_json(path)
    except ValueError as exc:  # InputRefused (a device, a FIFO, past its cap) says the path itself
        said = str(exc) if isinstance(exc, UsageError) else f"--resume: {path} is corrupt: not JSON ({exc})"
        raise UsageError(said) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(f"{path}: format {clip(state.get('format') if isinstance(state, dict) else state)}, "
                         f"not {FORMAT}")
    found = stored.problem(state)
    if found is None:
        try:
            plan_from_data(state["spec"]["plan"], str(path), Path("/"))
        except PlanError as exc:
            found = f"spec.plan: {exc}"
    if found is not None:
        raise UsageError(f"--resume: {path} is corrupt: {found}; the probes' dirs are intact: start a new bisect")
    return state


def run_from_args(request: BisectRequest) -> int:
    """`python -m harness bisect ...`"""
    opts = request.bisect
    if opts.resume is not None:
        if request.out is not None or request.run_dir is not None:
            raise UsageError("--resume continues the bisect in its own dir: drop --out and --run-dir")
        bisect_dir = opts.resume.resolve()
        state = _resume(bisect_dir, request)
        if request.run.device is not None:  # the same bisect, on whichever device is free now
            state["spec"]["device"] = request.run.device
        print(f"resuming {bisect_dir}: {len(state['probes'])} probe(s) done, none run again", flush=True)
    else:
        spec = resolve_spec(request)
        state = {"format": FORMAT, "spec": spec, "builds": {}, "records": dict(spec["records"]),
                 "rows": spec["rows"], "probes": [], "complete": False}
        if request.run_dir is not None:  # claimed by its bisect.json, whole from the start
            bisect_dir = rundir.claim_named_dir(request.run_dir, BISECT_JSON, rundir.json_text(state))
        else:
            bisect_dir = rundir.claim_run_dir(paths.runs_root(request.out), "bisect")
            rundir.atomic_write_json(bisect_dir / BISECT_JSON, state)
        print(f"bisect over {len(spec['builds'])} builds, ops {' '.join(spec['ops'])}\nbisect dir: {bisect_dir}",
              flush=True)
    session = Bisect(bisect_dir, state)
    interrupted = None
    try:
        with launch.stops_on_signals():
            session.run()
    except KeyboardInterrupt as exc:
        interrupted = launch.stopped_by(exc)
        print(f"\ninterrupted ({signal.Signals(interrupted).name}): reporting what was found so far; "
              f"resume with --resume {bisect_dir}", flush=True)
    finally:
        session.close()
    code = report(bisect_dir, session)
    return 128 + interrupted if interrupted else code


def report(bisect_dir: Path, session: Bisect) -> int:
    """The bisect's report files from bisect.json and the search it implies; 0 when every row's
    boundary was found and confirmed (or it did not move), else 1."""
    from reports import bisect_report

    state = session.state
    if state["rows"] is None:  # stopped before the record said which rows there are
        data = bisect_report.build(state, [], {})
    else:
        found = session.search()
        rows = [{**dataclasses.asdict(r), "between": search.between(r, found.skipped), "open": bool(
            r.candidates(found.skipped, found.n))} for r in found.rows.values()]
        data = bisect_report.build(state, rows, found.skipped)
    files = bisect_report.write(bisect_dir, data)
    print(bisect_report.render_text(data))
    print("report: " + ", ".join(map(str, files)))
    return 0 if data["complete"] and all(g["status"] in bisect_report.SETTLED for g in data["groups"]) else 1
