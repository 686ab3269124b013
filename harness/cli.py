"""`python -m harness record|replay ...`: what the nox sessions run.

The parent resolves and validates everything up front (backend, device, operator, shapes,
dtypes, replay source), claims the run dir, writes the spec into it, then runs the pytest child
on one device and tees its output into run.log. Every bad input fails here, before any work, with
one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import backends
from harness import ab as ab_mod
from harness import registry, rundir, shapes, tuning
from harness import spec as spec_mod
from ops import DTYPE_NAMES

REPO_ROOT = Path(__file__).resolve().parent.parent
SHAPES_DIR = REPO_ROOT / "shapes"
DEFAULT_OP = "softmax"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


def _dtype_list(text: str) -> list[str]:
    items = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in items if d not in DTYPE_NAMES]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad or text!r}; known: {','.join(DTYPE_NAMES)}")
    return items


def _nonneg_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("where to run")
    where.add_argument("--backend", metavar="NAME", default=None,
                       help=f"{'|'.join(backends.NAMES)} or an alias (default: the accelerator found; "
                            "replay: the recorded one)")
    where.add_argument("--device", metavar="N", type=int, default=None,
                       help="device index (default: the first visible device)")
    what = parser.add_argument_group("what to run")
    what.add_argument("--shapes", metavar="FILE", type=Path, default=None,
                      help="shape yaml (default: shapes/<backend default>; replay: the recorded shapes)")
    what.add_argument("--dtypes", metavar="LIST", type=_dtype_list, default=None,
                      help="comma-separated subset of fp16,bf16,fp32 (default: the shape file's, else the op's)")
    what.add_argument("--ops-path", metavar="PATH", action="append", default=None,
                      help="extra operator definitions: a directory of modules, a .py file or a module "
                           "name (repeatable)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", metavar="DIR", type=Path, default=None,
                     help="parent of the run dir (default: runs/)")
    out.add_argument("--no-ir", dest="ir", action="store_false",
                     help="do not collect per-shape TTGIR (collected by default where the compiler allows)")
    out.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                     help="terminal colour (run.log is always plain) (default: auto)")


def _add_measurement(parser: argparse.ArgumentParser) -> None:
    how = parser.add_argument_group("how to measure")
    how.add_argument("--seed", metavar="N", type=int, default=0, help="seed for random/numpy/torch (default: 0)")
    how.add_argument("--timer", choices=spec_mod.TIMERS, default="auto",
                     help="auto: graph where the backend can capture, else direct (default: auto)")
    how.add_argument("--warmup-ms", metavar="MS", type=_nonneg_float, default=None,
                     help="warmup budget per measurement (default: the backend's, 25 on GPUs)")
    how.add_argument("--rep-ms", metavar="MS", type=_nonneg_float, default=None,
                     help="timing budget per measurement (default: the backend's, 100 on GPUs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run one operator, sweep autotune, archive everything")
    rec.add_argument("op", nargs="?", default=DEFAULT_OP, help=f"operator name (default: {DEFAULT_OP})")
    _add_common(rec)
    _add_measurement(rec)
    rep = sub.add_parser("replay", help="rerun a record run with its configs, shapes and seeds pinned")
    rep.add_argument("run_dir", type=Path, nargs="?", default=None,
                     help="the record run dir to replay (default: the newest record run under --out)")
    _add_common(rep)
    ab = sub.add_parser("ab", help="A records, A and B replay A's configs, interleaved; compare with statistics")
    ab.add_argument("plan", type=Path, nargs="?", default=None,
                    help="plan yaml (default: ops/ab_default.yaml unless --ops or --compare is given)")
    side = ab.add_argument_group("the experiment (override the plan)")
    side.add_argument("--ops", nargs="+", metavar="OP", default=None, help="operators to compare")
    side.add_argument("--repeats", type=int, metavar="N", default=None, help="replays per side (>= 2; default 3)")
    for s_ in ("a", "b"):
        side.add_argument(f"--{s_}-env", action="append", metavar="KEY=VAL", default=None,
                          help=f"environment variable for side {s_.upper()} (repeatable)")
        side.add_argument(f"--{s_}-python", metavar="PATH", default=None,
                          help=f"Python interpreter of side {s_.upper()} (a second compiler build)")
    side.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"), default=None,
                      help="compare two existing run dirs without running anything")
    _add_common(ab)
    bat = sub.add_parser("batch", help="screen many operators across devices, isolated, with retries and resume")
    sel = bat.add_argument_group("selection")
    sel.add_argument("--all", action="store_true", help="the whole inventory, minus skip marks and ops/dismiss.txt")
    sel.add_argument("--ops", nargs="+", metavar="[REPO:]OP[@FILE]", default=None)
    sel.add_argument("--ops-file", type=Path, metavar="FILE", default=None, help="one selection entry per line")
    sel.add_argument("--repos", nargs="+", metavar="REPO", default=None, help="only these inventories")
    run_ = bat.add_argument_group("running")
    run_.add_argument("--devices", metavar="LIST", default=None,
                      help="comma-separated device indices (default: the backend's visible devices)")
    run_.add_argument("--op-timeout", type=float, metavar="S", default=1800.0,
                      help="per-op timeout in seconds; the op's process group is killed (default: 1800)")
    run_.add_argument("--resume", action="store_true", help="rerun only ops not PASS/SKIP in --batch-dir")
    run_.add_argument("--batch-dir", type=Path, metavar="DIR", default=None, help="the batch dir to resume")
    run_.add_argument("--replay-root", type=Path, metavar="DIR", default=None,
                      help="replay each op from this earlier batch dir")
    run_.add_argument("--executor", choices=("local", "ray"), default="local",
                      help="local subprocesses, or Ray tasks of one device each (default: local)")
    run_.add_argument("--ray-address", metavar="ADDR", default=None,
                      help="Ray cluster to join (default with --executor ray: a local Ray instance)")
    run_.add_argument("--summarize", type=Path, metavar="DIR", default=None,
                      help="only regenerate DIR/summary.csv from its per-op dirs")
    _add_common(bat)
    inv = sub.add_parser("inventory-regen", help="rebuild ops/inventory_builtin.csv from the operator sources")
    inv.add_argument("--check", action="store_true", help="fail if the committed inventory is out of date")
    cmp_ = sub.add_parser("compare-ir", help="compare the IR of two run dirs, per launched variant")
    cmp_.add_argument("run_a", type=Path)
    cmp_.add_argument("run_b", type=Path)
    return parser


# --- resolution ------------------------------------------------------------------------------
def _resolve_backend(name: str | None) -> backends.Backend:
    try:
        return backends.get(name) if name else backends.auto_detect()
    except (backends.UnknownBackend, backends.BackendUnavailable) as exc:
        raise UsageError(str(exc)) from exc


def _resolve_device(backend: backends.Backend, device: int | None) -> int:
    try:
        return backend.check_available([device] if device is not None else None)[0]
    except backends.BackendUnavailable as exc:
        raise UsageError(str(exc)) from exc


def _resolve_timer(backend: backends.Backend, timer: str) -> str:
    if timer == "graph" and not backend.graph_capture:
        raise UsageError(f"backend '{backend.name}' cannot capture graphs; use --timer direct or auto")
    if timer in ("graph", "direct") and not backend.triton_driver:
        raise UsageError(f"backend '{backend.name}' has no device timer; use --timer host or auto")
    if timer == "host" and backend.triton_driver:
        raise UsageError("--timer host is for the interpreter; on a device it measures launch overhead only")
    return backend.default_timer if timer == "auto" else timer


def _resolve_shapes(op, shape_file: Path, dtypes: list[str] | None):
    try:
        key, shape_list, file_dtypes = shapes.resolve(
            shape_file, op.name, op.shape_keys, len(op.dims) if op.dims else None)
    except shapes.ShapeFileError as exc:
        raise UsageError(str(exc)) from exc
    chosen = dtypes or file_dtypes or list(op.dtypes)
    unsupported = [d for d in chosen if d not in op.dtypes]
    if unsupported:
        raise UsageError(f"operator '{op.name}' does not take dtype(s) {unsupported}; it takes {list(op.dtypes)}")
    return key, shape_list, chosen


def _load_op(name: str, ops_paths: list[str]):
    try:
        return registry.load(name, ops_paths)
    except registry.OperatorNotFound as exc:
        raise UsageError(str(exc)) from exc


def _abs_ops_paths(paths: list[str] | None) -> list[str]:
    # Files and dirs are stored absolute (the child runs from the repo root); module names as is.
    out = []
    for p in paths or []:
        out.append(str(Path(p).resolve()) if Path(p).exists() else p)
    return out


def resolve_record(args) -> tuple[spec_mod.RunSpec, list, Path]:
    backend = _resolve_backend(args.backend)
    ops_paths = _abs_ops_paths(args.ops_path)
    op, provider = _load_op(args.op, ops_paths)
    shape_file = (args.shapes or SHAPES_DIR / backend.default_shapes).resolve()
    key, shape_list, dtypes = _resolve_shapes(op, shape_file, args.dtypes)
    timer = _resolve_timer(backend, args.timer)
    device = _resolve_device(backend, args.device)
    run_spec = spec_mod.RunSpec(
        op=op.name, backend=backend.name, mode="record", device=device, dtypes=dtypes,
        shapes_source=f"{shape_file}#{key}", seed=args.seed, timer=timer,
        warmup_ms=backend.warmup_ms if args.warmup_ms is None else args.warmup_ms,
        rep_ms=backend.rep_ms if args.rep_ms is None else args.rep_ms,
        ops_paths=ops_paths, provider=provider, color=_color(args.color), ir=args.ir)
    return run_spec, shape_list, args.out


def newest_record_run(root: Path) -> Path:
    candidates = []
    for run_json in root.glob(f"*/{rundir.RUN_JSON}"):
        try:
            if spec_mod.read(run_json.parent).mode == "record":
                candidates.append(run_json.parent)
        except spec_mod.SpecError:
            continue
    if not candidates:
        raise UsageError(f"no record run under {root} to replay; give a run dir")
    return max(candidates, key=lambda d: (d.stat().st_mtime, d.name))


def resolve_replay(args) -> tuple[spec_mod.RunSpec, list, Path]:
    if args.run_dir is None:
        args.run_dir = newest_record_run((args.out or REPO_ROOT / "runs").resolve())
        print(f"replaying the newest record run: {args.run_dir}")
    try:
        source = spec_mod.read(args.run_dir)
        tuning.load_records(tuning.records_path(args.run_dir, source.op))
    except (spec_mod.SpecError, tuning.RecordsError) as exc:
        raise UsageError(f"cannot replay {args.run_dir}: {exc}") from exc
    if source.mode != "record":
        raise UsageError(f"cannot replay {args.run_dir}: it is a {source.mode} run; replay a record run")
    backend = _resolve_backend(args.backend or source.backend)
    if backend.name != source.backend:
        raise UsageError(f"cannot replay {args.run_dir}: it was recorded on backend '{source.backend}', "
                         f"not '{backend.name}'; configs do not carry across backends")
    ops_paths = _abs_ops_paths(args.ops_path) or source.ops_paths
    op, provider = _load_op(source.op, ops_paths)
    shape_file = (args.shapes or Path(args.run_dir) / rundir.SHAPES_YAML).resolve()
    key, shape_list, dtypes = _resolve_shapes(op, shape_file, args.dtypes)
    device = _resolve_device(backend, args.device)
    run_spec = spec_mod.RunSpec(
        op=op.name, backend=backend.name, mode="replay", device=device, dtypes=dtypes,
        shapes_source=f"{shape_file}#{key}", seed=source.seed, timer=source.timer,
        warmup_ms=source.warmup_ms, rep_ms=source.rep_ms, ops_paths=ops_paths, provider=provider,
        replay_from=str(Path(args.run_dir).resolve()), color=_color(args.color), ir=args.ir)
    return run_spec, shape_list, args.out or Path(args.run_dir).resolve().parent


def _color(choice: str) -> bool:
    if choice == "auto":
        return sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return choice == "always"


# --- running ---------------------------------------------------------------------------------
class _Tee:
    """Terminal and run.log at once; run.log gets plain text."""

    def __init__(self, log_path: Path):
        self.log = open(log_path, "a", encoding="utf-8")

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        self.log.write(ANSI.sub("", text))
        self.log.flush()

    def close(self) -> None:
        self.log.close()


def run_child(run_dir: Path, run_spec: spec_mod.RunSpec, tee: _Tee, cache_dir: str) -> int:
    backend = backends.get(run_spec.backend)
    env = backend.visibility_env(run_spec.device, os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # A private compiler cache per run: the IR collected is exactly this run's, and nothing
    # compiled by another compiler build is picked up from a shared cache.
    env["TRITON_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "harness.child", str(run_dir)], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    try:
        for line in proc.stdout:
            tee.write(line)
        return proc.wait()
    except KeyboardInterrupt:
        # The child got the same SIGINT from the terminal; give it time to write its summary.
        tee.write("\ninterrupted: waiting for the child to finish writing its results\n")
        try:
            for line in proc.stdout:
                tee.write(line)
            return proc.wait(timeout=30)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return 130


def execute(run_spec: spec_mod.RunSpec, shape_list: list, out: Path | None) -> int:
    root = (out or REPO_ROOT / "runs").resolve()
    run_dir = rundir.claim_run_dir(root, run_spec.op)
    spec_mod.write(run_dir, run_spec)
    shapes.write_used(run_dir / rundir.SHAPES_YAML, run_spec.op, shape_list, run_spec.dtypes,
                      run_spec.shapes_source)
    tee = _Tee(run_dir / rundir.RUN_LOG)
    try:
        what = f"replay of {run_spec.replay_from}" if run_spec.mode == "replay" else "record"
        tee.write(f"zl_bench {what}: op={run_spec.op} backend={run_spec.backend} device={run_spec.device} "
                  f"dtypes={','.join(run_spec.dtypes)} shapes={len(shape_list)} timer={run_spec.timer}\n"
                  f"run dir: {run_dir}\n")
        with tempfile.TemporaryDirectory(prefix="zl_triton_cache_") as cache_dir:
            rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"triton_cache": "private, removed after"}})
            code = run_child(run_dir, run_spec, tee, cache_dir)
        verdict = "ok" if code == 0 else f"FAILED (exit {code})"
        tee.write(f"\n{run_spec.mode} {verdict}; run dir: {run_dir}\n")
    finally:
        tee.close()
    return code


def compare_ir(run_a: Path, run_b: Path) -> int:
    from tabulate import tabulate

    from harness import ir

    for run in (run_a, run_b):
        if not (run / ir.IR_DIR / "index.tsv").is_file():
            raise UsageError(f"{run} has no {ir.IR_DIR}/index.tsv (IR collection was off or it is not a run dir)")
    rows = ir.compare(run_a, run_b)
    print(tabulate([[r["status"], r["shape"], r["kernel"].rsplit(".", 1)[-1], r["file_a"], r["file_b"], r["stages"]]
                    for r in rows], headers=["status", "shape", "kernel", "A", "B", "stages differing"]))
    counts = collections.Counter(r["status"] for r in rows)
    print("  ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if rows and counts["identical"] == len(rows):
        print("every launched variant compiled to identical IR at every stage in A and B")
    return 0


def _env_pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0]:
            raise UsageError(f"{flag} {item!r}: expected KEY=VAL")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def resolve_plan(args) -> ab_mod.Plan:
    try:
        if args.plan is not None or not args.ops:
            plan = ab_mod.load_plan(args.plan or ab_mod.DEFAULT_PLAN)
        else:
            plan = ab_mod.Plan(name="adhoc", ops=args.ops, a=ab_mod.Side("A", "as is"), b=ab_mod.Side("B", ""))
    except ab_mod.PlanError as exc:
        raise UsageError(str(exc)) from exc
    if args.ops:
        plan.ops = args.ops
    if args.repeats is not None:
        if args.repeats < 2:
            raise UsageError("--repeats must be >= 2: A's own spread is the noise floor")
        plan.repeats = args.repeats
    for side in (plan.a, plan.b):
        key = side.name.lower()
        side.env.update(_env_pairs(getattr(args, f"{key}_env"), f"--{key}-env"))
        python = getattr(args, f"{key}_python")
        if python:
            if not Path(python).is_file():
                raise UsageError(f"--{key}-python {python} does not exist")
            side.python = python
    if args.backend:
        plan.backend = args.backend
    if args.shapes:
        plan.shapes = str(args.shapes.resolve())
    if args.dtypes:
        plan.dtypes = args.dtypes
    if args.device is not None:
        plan.device = args.device
    plan.ops_paths += _abs_ops_paths(args.ops_path)
    if plan.a.env == plan.b.env and plan.a.python == plan.b.python:
        print("note: sides A and B are identical: this is an A/A run (measures noise)")
    if plan.backend:
        _resolve_backend(plan.backend)  # unknown names fail before anything runs
    return plan


def run_ab(args) -> int:
    if args.compare:
        dir_a, dir_b = args.compare
        for d in (dir_a, dir_b):
            try:
                spec_mod.read(d)
            except spec_mod.SpecError as exc:
                raise UsageError(f"--compare: {exc}") from exc
        out = rundir.claim_run_dir((args.out or REPO_ROOT / "runs").resolve(), "compare")
        warnings, _ = ab_mod.validity({"runs": {"A": [dir_a], "B": [dir_b]}})
        context = {"name": f"{dir_a.name} vs {dir_b.name}", "a": str(dir_a), "b": str(dir_b),
                   "note": "single runs: each run's raw samples stand in for repeats"}
        return ab_mod.report(out, [([dir_a], [dir_b])], context, warnings)
    plan = resolve_plan(args)
    ab_dir = rundir.claim_run_dir((args.out or REPO_ROOT / "runs").resolve(), f"ab_{plan.name}")
    print(f"A/B {plan.name}: A = {plan.a.describe()}; B = {plan.b.describe()}; ops {' '.join(plan.ops)}; "
          f"{plan.repeats} repeats interleaved\nab dir: {ab_dir}")
    runner = ab_mod.Runner(plan, ab_dir)
    interrupted = False
    try:
        results = runner.run()
    except ab_mod.PlanError as exc:
        raise UsageError(str(exc)) from exc
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the running side and reporting what completed")
        runner.interrupt()
        results = {}
        for step in runner.state["steps"]:
            op = step["args"][1] if step["args"][0] == "record" else Path(step["args"][1]).name.split("_")[0]
            if step["run_dir"] and step["exit"] == 0:
                results.setdefault(op, {"record": [], "A": [], "B": []})
                kind = "record" if step["args"][0] == "record" else step["side"]
                results[op][kind].append(Path(step["run_dir"]))
    warnings, ir_per_op = ab_mod.validity(results)
    if interrupted or not runner.state["complete"]:
        done = sum(1 for s in runner.state["steps"] if s["exit"] == 0)
        warnings.insert(0, f"INCOMPLETE: interrupted after {done} successful steps; rows below cover only those")
    failed = [s["what"] for s in runner.state["steps"] if s["exit"] != 0]
    if failed:
        warnings.append(f"{len(failed)} step(s) failed (see ab.log): " + "; ".join(failed))
    context = {"name": plan.name, "a": plan.a.describe(), "b": plan.b.describe(), "repeats": plan.repeats,
               "ir": ir_per_op}
    code = ab_mod.report(ab_dir, [(r["A"], r["B"]) for r in results.values()], context, warnings)
    return 130 if interrupted else code


def run_batch(args) -> int:
    import importlib.util

    from harness import batch, inventory

    if args.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs the ray package in this environment (pip install ray)")
    if args.summarize:
        print(f"summary: {batch.write_summary(args.summarize.resolve())}")
        return 0
    backend = _resolve_backend(args.backend)
    try:
        visible = backend.check_available()
    except backends.BackendUnavailable as exc:
        raise UsageError(str(exc)) from exc
    devices = visible if args.devices is None else [int(d) for d in args.devices.split(",") if d.strip()]
    if backend.visibility_key is not None and not set(devices) <= set(visible):
        raise UsageError(f"--devices {devices}: not all among the visible devices {visible}")
    ops_paths = _abs_ops_paths(args.ops_path)
    try:
        entries = inventory.load()
        for p in ops_paths:
            if Path(p).is_dir():
                entries += inventory.scan_dir(Path(p), "path", Path(p).parent)
        specs = list(args.ops or []) + (inventory.read_ops_file(args.ops_file) if args.ops_file else [])
        selected, excluded = inventory.select(entries, specs, args.all, args.repos, inventory.load_dismissed())
    except inventory.SelectionError as exc:
        raise UsageError(str(exc)) from exc
    if args.resume:
        if args.batch_dir is None:
            raise UsageError("--resume needs --batch-dir")
        batch_dir = args.batch_dir.resolve()
    else:
        batch_dir = rundir.claim_run_dir((args.out or REPO_ROOT / "runs").resolve(), "batch")
    op_dtypes = {}
    for e in selected:
        try:
            op_dtypes[e.key] = registry.load(e.op, ops_paths)[0].dtypes
        except registry.OperatorNotFound as exc:
            raise UsageError(str(exc)) from exc
    opts = batch.Options(backend=backend.name, devices=devices, dtypes=args.dtypes,
                         shapes=str(args.shapes.resolve()) if args.shapes else None, ops_paths=ops_paths,
                         op_timeout=args.op_timeout,
                         replay_root=args.replay_root.resolve() if args.replay_root else None)
    runner = batch.Batch(batch_dir, opts, selected, op_dtypes)
    todo = [e for e in selected if not (args.resume and batch.completed(batch_dir, e))]
    print(f"batch dir: {batch_dir}\n{len(selected)} selected, {len(selected) - len(todo)} already done, "
          f"{len(excluded)} excluded; devices {devices}; backend {backend.name}")
    for e, why in excluded:
        print(f"  excluded {e.key}: {why}")
    rundir.merge_json(batch_dir / "batch.json", {"backend": backend.name, "devices": devices,
                                                  "selected": [e.key for e in selected],
                                                  "excluded": {e.key: why for e, why in excluded}})
    counts = collections.Counter()
    from tqdm import tqdm

    with tqdm(total=len(todo), unit="op", dynamic_ncols=True, disable=None) as bar:
        def on_done(row):
            counts[row["status"]] += 1
            bar.set_postfix({k: v for k, v in sorted(counts.items())}, refresh=False)
            bar.update(1)
            bar.write(f"{row['status']:<8} {row['repo']}:{row['op']} device={row['device']} "
                      f"{row['elapsed_s']} s rows={row['rows']}{'  ' + row['notes'] if row['notes'] else ''}")

        try:
            if args.executor == "ray":
                from harness import ray_executor

                ray_executor.run(runner, todo, on_done, args.ray_address)
            else:
                runner.run(todo, on_done)
        except KeyboardInterrupt:
            print("\ninterrupted: every running op was killed; resume with --resume --batch-dir", batch_dir)
            batch.write_summary(batch_dir)
            return 130
    summary = batch.write_summary(batch_dir)
    status = batch.read_status(batch_dir)
    final = collections.Counter(r["status"] for k, r in status.items() if k in {e.key for e in selected})
    print("done: " + ", ".join(f"{k} {v}" for k, v in sorted(final.items())) + f"; summary: {summary}")
    failed = sorted(k for k, r in status.items() if r["status"] not in batch.DONE and k in {e.key for e in selected})
    if failed:
        print("not passed: " + ", ".join(failed))
    return 1 if failed else 0


def inventory_regen(args) -> int:
    from harness import inventory

    path = inventory.OPS_DIR / f"inventory_{inventory.BUILTIN}.csv"
    fresh = inventory.to_csv(inventory.scan_dir(inventory.OPS_DIR, inventory.BUILTIN, inventory.OPS_DIR.parent))
    if args.check:
        if not path.is_file() or path.read_text() != fresh:
            raise UsageError(f"{path} is out of date: run nox -s inventory-regen")
        print(f"{path} is up to date")
        return 0
    inventory.regenerate_builtin()
    print(f"wrote {path} ({fresh.count(chr(10)) - 1} operators)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "batch":
            return run_batch(args)
        if args.command == "inventory-regen":
            return inventory_regen(args)
        if args.command == "compare-ir":
            return compare_ir(args.run_a, args.run_b)
        if args.command == "ab":
            return run_ab(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        resolved = resolve_record(args) if args.command == "record" else resolve_replay(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return execute(*resolved)
