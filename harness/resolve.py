"""Resolve a run spec from command-line arguments, for record and replay.

Everything is validated up front (backend, device, operator, shapes, dtypes, replay source):
every bad input raises UsageError with one line saying what is wrong, before any work starts.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import backends
from harness import flaggems, registry, rundir, shapes, tuning
from harness import spec as spec_mod

REPO_ROOT = Path(__file__).resolve().parent.parent
SHAPES_DIR = REPO_ROOT / "shapes"


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


def harness_pythonpath(inherited: str | None) -> str:
    """PYTHONPATH for a harness subprocess: the checkout first (zl_bench runs from it, it is not
    installed), then whatever was inherited (the sessions' .nox/deps)."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), inherited) if p)


def resolve_backend(name: str | None) -> backends.Backend:
    try:
        return backends.get(name) if name else backends.auto_detect()
    except (backends.UnknownBackend, backends.BackendUnavailable) as exc:
        raise UsageError(str(exc)) from exc


def resolve_device(backend: backends.Backend, device: int | None) -> int:
    try:
        return backend.check_available([device] if device is not None else None)[0]
    except backends.BackendUnavailable as exc:
        raise UsageError(str(exc)) from exc


def resolve_timer(backend: backends.Backend, timer: str) -> str:
    if timer == "graph" and not backend.graph_capture:
        raise UsageError(f"backend '{backend.name}' cannot capture graphs; use --timer direct or auto")
    if timer in ("graph", "direct") and not backend.triton_driver:
        raise UsageError(f"backend '{backend.name}' has no device timer; use --timer host or auto")
    if timer == "host" and backend.triton_driver:
        raise UsageError("--timer host is for the interpreter; on a device it measures launch overhead only")
    return backend.default_timer if timer == "auto" else timer


def resolve_shapes(op, shape_file: Path, dtypes: list[str] | None):
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


def load_op(name: str, ops_paths: list[str]):
    try:
        return registry.load(name, ops_paths)
    except registry.OperatorNotFound as exc:
        raise UsageError(str(exc)) from exc


def abs_ops_paths(paths: list[str] | None) -> list[str]:
    # Files and dirs are stored absolute (the child runs from the repo root); module names as is.
    out = []
    for p in paths or []:
        out.append(str(Path(p).resolve()) if Path(p).exists() else p)
    return out


def _flaggems_shapes(shape_arg: Path | None) -> str | None:
    """The shape yaml of a FlagGems run, or None for the checkout's own shapes."""
    if shape_arg is None or str(shape_arg) == flaggems.UPSTREAM:
        return None
    try:
        shapes.load(shape_arg)  # keys resolve in the child, against the benchmark's class chain
    except shapes.ShapeFileError as exc:
        raise UsageError(str(exc)) from exc
    return str(shape_arg.resolve())


def resolve_flaggems_record(args, backend) -> tuple[spec_mod.RunSpec, list, Path]:
    try:
        target = flaggems.resolve_target(args.op, flaggems.parse_dirs(args.flaggems_dir))
    except flaggems.FlagGemsError as exc:
        raise UsageError(str(exc)) from exc
    if args.sweep_devices:
        raise UsageError("--sweep-devices needs an enumerable shape set; FlagGems benchmarks build theirs at run time")
    options = flaggems.Options(
        repo=target.repo, root=target.root, test_file=target.test_file, function=target.function,
        level=args.level or "core", shapes_file=_flaggems_shapes(args.shapes),
        flagtune=args.flagtune or os.environ.get("USE_FLAGTUNE", "0"),
        libtuner_cache=args.libtuner_cache or "private")
    run_spec = _record_spec(
        args, backend, op=target.op, dtypes=args.dtypes or [],
        shapes_source=options.shapes_source, provider=f"flaggems:{target.repo}", flaggems=dataclasses.asdict(options))
    return run_spec, [], args.out


def _flaggems_replay(args, source: spec_mod.RunSpec) -> flaggems.Options:
    """The record's FlagGems options, with the checkout possibly moved (--flaggems-dir NAME=PATH).
    Level and FlagTune switch are the record's: a side that differs is not replaying A."""
    options = flaggems.Options.from_json(source.flaggems)
    for flag, value, recorded in (("--level", args.level, options.level),
                                  ("--flagtune", args.flagtune, options.flagtune),
                                  ("USE_FLAGTUNE", os.environ.get("USE_FLAGTUNE"), options.flagtune)):
        if value is not None and value != recorded:
            raise UsageError(f"cannot replay {args.run_dir}: it was recorded with {flag}={recorded}, this side has "
                             f"{value}; both sides of a comparison must match")
    try:
        dirs = flaggems.parse_dirs(args.flaggems_dir)
    except flaggems.FlagGemsError as exc:
        raise UsageError(str(exc)) from exc
    if options.repo in dirs:
        options.root = str(dirs[options.repo])
    if not (Path(options.root) / options.test_file).is_file():
        raise UsageError(f"cannot replay {args.run_dir}: {Path(options.root) / options.test_file} does not exist; "
                         f"give --flaggems-dir {options.repo}=PATH")
    recorded_shapes = Path(args.run_dir).resolve() / rundir.SHAPES_YAML
    options.shapes_file = (_flaggems_shapes(args.shapes) if args.shapes is not None
                           else str(recorded_shapes) if options.shapes_file else None)
    if args.libtuner_cache:
        options.libtuner_cache = args.libtuner_cache
    return options


def _record_spec(args, backend, **fields) -> spec_mod.RunSpec:
    """A record spec: what the operator source resolved, plus where and how to measure."""
    return spec_mod.RunSpec(
        backend=backend.name, mode="record", timer=resolve_timer(backend, args.timer),
        device=resolve_device(backend, args.device), seed=args.seed,
        warmup_ms=backend.warmup_ms if args.warmup_ms is None else args.warmup_ms,
        rep_ms=backend.rep_ms if args.rep_ms is None else args.rep_ms,
        color=color_enabled(args.color), ir=args.ir, **fields)


def resolve_record(args) -> tuple[spec_mod.RunSpec, list, Path]:
    backend = resolve_backend(args.backend)
    if flaggems.is_target(args.op):
        return resolve_flaggems_record(args, backend)
    ops_paths = abs_ops_paths(args.ops_path)
    op, provider = load_op(args.op, ops_paths)
    shape_file = (args.shapes or SHAPES_DIR / backend.default_shapes).resolve()
    key, shape_list, dtypes = resolve_shapes(op, shape_file, args.dtypes)
    run_spec = _record_spec(args, backend, op=op.name, dtypes=dtypes, shapes_source=f"{shape_file}#{key}",
                            ops_paths=ops_paths, provider=provider, sweep_devices=args.sweep_devices)
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
    backend = resolve_backend(args.backend or source.backend)
    if backend.name != source.backend:
        raise UsageError(f"cannot replay {args.run_dir}: it was recorded on backend '{source.backend}', "
                         f"not '{backend.name}'; configs do not carry across backends")
    ops_paths = abs_ops_paths(args.ops_path) or source.ops_paths
    if source.flaggems is not None:
        options = _flaggems_replay(args, source)
        run_spec = _replay_spec(args, source, backend, dtypes=args.dtypes or source.dtypes,
                                shapes_source=options.shapes_source, flaggems=dataclasses.asdict(options))
        return run_spec, [], args.out or Path(args.run_dir).resolve().parent
    shape_file = (args.shapes or Path(args.run_dir) / rundir.SHAPES_YAML).resolve()
    if args.shapes or args.dtypes:
        # Overrides are checked against the operator itself.
        op, provider = load_op(source.op, ops_paths)
        key, shape_list, dtypes = resolve_shapes(op, shape_file, args.dtypes)
    else:
        # The recorded shapes and dtypes were checked when recorded: this parent need not import
        # the operator (and torch with it); the child loads it anyway.
        provider = source.provider
        try:
            key, shape_list, dtypes = shapes.resolve(shape_file, source.op, ())
        except shapes.ShapeFileError as exc:
            raise UsageError(f"cannot replay {args.run_dir}: {exc}") from exc
        dtypes = dtypes or source.dtypes
    run_spec = _replay_spec(args, source, backend, dtypes=dtypes, shapes_source=f"{shape_file}#{key}",
                            ops_paths=ops_paths, provider=provider)
    return run_spec, shape_list, args.out or Path(args.run_dir).resolve().parent


def _replay_spec(args, source: spec_mod.RunSpec, backend, **fields) -> spec_mod.RunSpec:
    """The record's spec (op, seed, timer, budgets...) as a replay of it, with what this run sets."""
    return dataclasses.replace(
        source, mode="replay", backend=backend.name, device=resolve_device(backend, args.device),
        replay_from=str(Path(args.run_dir).resolve()), color=color_enabled(args.color), ir=args.ir,
        sweep_devices=0, preset_records=None, **fields)


def color_enabled(choice: str) -> bool:
    if choice == "auto":
        return sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return choice == "always"


# --- running ---------------------------------------------------------------------------------
