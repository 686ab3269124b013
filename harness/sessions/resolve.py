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
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.core.errors import DtypeRejected, UsageError, clip
from harness.core.options import RunOptions
from harness.core.outcome import Outcome
from harness.core.paths import SHAPES_DIR, runs_root
from harness.core.request import RunRequest
from harness.core.results import ResultsError, read_results
from harness.measure import tuning
from harness.providers import catalog, flaggems, probe, registry, shapes


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
    if timer not in backend.timers:
        if not backend.triton_driver and timer in ("graph", "direct"):
            why = f"backend '{backend.name}' has no device timer"
        elif timer == "graph":
            why = f"backend '{backend.name}' cannot capture graphs"
        elif timer == "host":
            why = "--timer host is for the interpreter; on a device it measures launch overhead only"
        else:
            why = f"backend '{backend.name}' has no device profiler for --timer profiler"
        # Only timers this backend takes: a suggestion that is refused in turn helps no one.
        raise UsageError(f"{why}; use --timer {' or '.join(backend.timers)}")
    return backend.default_timer if timer == "auto" else timer


def resolve_l2(backend: backends.Backend, l2: str) -> str:
    if l2 == "cold" and backend.l2_cache_bytes is None:
        raise UsageError(f"--l2 cold: backend '{backend.name}' has no device cache zl_bench knows how to flush "
                         "(cold means a flushed device L2); use --l2 warm")
    return l2


def check_measurement(backend: backends.Backend, timer: str | None, l2: str | None) -> None:
    """A session that starts records (ab, batch) refuses a timer or L2 mode its backend lacks once,
    up front, rather than in every op's record after launch. None: not given."""
    if timer is not None:
        resolve_timer(backend, timer)
    if l2 is not None:
        resolve_l2(backend, l2)


def resolve_shapes(op, shape_file: Path, dtypes: list[str] | None):
    try:
        key, shape_list, file_dtypes = shapes.resolve(
            shape_file, op.name, op.shape_keys, len(op.dims) if op.dims else None)
    except shapes.ShapeFileError as exc:
        raise UsageError(str(exc)) from exc
    chosen = dtypes or file_dtypes or list(op.dtypes)
    unsupported = [d for d in chosen if d not in op.dtypes]
    if unsupported:
        raise DtypeRejected(f"operator '{op.name}' does not take dtype(s) {unsupported}; it takes {list(op.dtypes)} "
                            f"(pick with --dtypes {','.join(d for d in op.dtypes)})")
    return key, shape_list, chosen


def load_op(name: str, ops_paths: list[str], warnings: list[str]):
    """(the operator or its probe.OperatorFacts, provider); a user module skipped on the way adds a
    line to `warnings`, printed once the whole spec has resolved (a refusal stays the one line on
    stderr). --ops-path modules are user code: they are imported in a probe process under a timeout,
    never in this one. The child loads the operator again, and its own warning goes to run.log."""
    try:
        if not ops_paths:
            return registry.load(name, ops_paths, warn=warnings.append)
        found, skipped = probe.load([name], ops_paths)
        warnings += skipped
        if isinstance(found[name], registry.OperatorNotFound):
            raise found[name]
        return found[name]
    except registry.OperatorNotFound as exc:
        raise UsageError(str(exc)) from exc


def check_selection(text: str, name: str, provider: str) -> None:
    """A `[builtin:|path:]OP[@FILE]` selection's repo and file are where the operator was found."""
    repo = catalog.BUILTIN if provider == "builtin" else catalog.PATH_REPO
    found = catalog.Entry(repo, name, registry.op_file(name, provider), provider)
    if not catalog.Selection.parse(text).matches(found):
        raise UsageError(f"'{text}': operator '{name}' is {found.id} ({provider})")


def load_selected(text: str, ops_paths: list[str], warnings: list[str]):
    """load_op for a selection `[builtin:|path:]OP[@FILE]` (a FlagGems one goes to flaggems.resolve_target)."""
    found = load_op(catalog.Selection.parse(text).op, ops_paths, warnings)
    check_selection(text, found[0].name, found[1])
    return found


def warn(lines: list[str]) -> None:
    for line in lines:
        print(f"warning: {line}", file=sys.stderr, flush=True)


def _flaggems_shapes(shape_arg: Path | None) -> str | None:
    """The shape yaml of a FlagGems run, or None for the checkout's own shapes."""
    if shape_arg is None or str(shape_arg) == flaggems.UPSTREAM:
        return None
    try:
        shapes.load(shape_arg)  # keys resolve in the child, against the benchmark's class chain
    except shapes.ShapeFileError as exc:
        raise UsageError(str(exc)) from exc
    return str(shape_arg.resolve())


def resolve_flaggems_record(request: RunRequest, backend) -> tuple[spec_mod.RunSpec, list, Path]:
    given = request.options
    try:
        target = flaggems.resolve_target(request.target, flaggems.parse_dirs(given.flaggems_dirs))
    except flaggems.FlagGemsError as exc:
        raise UsageError(str(exc)) from exc
    if request.sweep_devices:
        raise UsageError("--sweep-devices needs an enumerable shape set; FlagGems benchmarks build theirs at run time")
    options = spec_mod.FlagGemsOptions(
        repo=target.repo, root=target.root, test_file=target.test_file, function=target.function,
        level=given.level or "core", shapes_file=_flaggems_shapes(given.shapes),
        flagtune=given.flagtune or os.environ.get("USE_FLAGTUNE", "0"),
        libtuner_cache=given.libtuner_cache or "private")
    run_spec = _record_spec(
        request, backend, op=target.op, dtypes=list(given.dtypes or []),
        shapes_source=flaggems.shapes_source(options), provider=f"flaggems:{target.repo}", flaggems=options)
    return run_spec, [], request.out


def _flaggems_replay(given: RunOptions, run_dir: Path, source: spec_mod.RunSpec) -> spec_mod.FlagGemsOptions:
    """The record's FlagGems options, with the checkout possibly moved (--flaggems-dir NAME=PATH).
    Level and FlagTune switch are the record's: a side that differs is not replaying A."""
    options = source.flaggems
    for flag, value, recorded in (("--level", given.level, options.level),
                                  ("--flagtune", given.flagtune, options.flagtune),
                                  ("USE_FLAGTUNE", os.environ.get("USE_FLAGTUNE"), options.flagtune)):
        if value is not None and value != recorded:
            raise UsageError(f"cannot replay {run_dir}: it was recorded with {flag}={recorded}, this side has "
                             f"{value}; both sides of a comparison must match")
    try:
        dirs = flaggems.parse_dirs(given.flaggems_dirs)
    except flaggems.FlagGemsError as exc:
        raise UsageError(str(exc)) from exc
    root = str(dirs[options.repo]) if options.repo in dirs else options.root
    if not (Path(root) / options.test_file).is_file():
        raise UsageError(f"cannot replay {run_dir}: {Path(root) / options.test_file} does not exist; "
                         f"give --flaggems-dir {options.repo}=PATH")
    recorded_shapes = run_dir.resolve() / rundir.SHAPES_YAML
    if given.shapes is None and options.shapes_file:
        try:
            shapes.load(recorded_shapes)  # the child reads it; a corrupt one refuses the replay here
        except shapes.ShapeFileError as exc:
            raise UsageError(f"cannot replay {run_dir}: {exc}") from exc
    shapes_file = (_flaggems_shapes(given.shapes) if given.shapes is not None
                   else str(recorded_shapes) if options.shapes_file else None)
    return dataclasses.replace(options, root=root, shapes_file=shapes_file,
                               libtuner_cache=given.libtuner_cache or options.libtuner_cache)


def _record_spec(request: RunRequest, backend, **fields) -> spec_mod.RunSpec:
    """A record spec: what the operator source resolved, plus where and how to measure."""
    given = request.options
    return spec_mod.RunSpec(
        backend=backend.name, mode="record", timer=resolve_timer(backend, given.timer),
        l2=resolve_l2(backend, given.l2), device=resolve_device(backend, given.device), seed=given.seed,
        warmup_ms=backend.warmup_ms if given.warmup_ms is None else given.warmup_ms,
        rep_ms=backend.rep_ms if given.rep_ms is None else given.rep_ms,
        windows=spec_mod.DEFAULT_WINDOWS if given.windows is None else given.windows,
        max_noise=backend.max_noise if given.max_noise is None else given.max_noise,
        color=color_enabled(request.color), ir=request.ir, only=request.only,
        precompile=request.precompile, device_gate=_gate(request),
        **fields)


def resolve_record(request: RunRequest) -> tuple[spec_mod.RunSpec, list, Path]:
    given = request.options
    backend = resolve_backend(given.backend)
    if flaggems.is_target(request.target):
        return resolve_flaggems_record(request, backend)
    ops_paths, warnings = list(given.ops_paths or ()), []
    op, provider = load_selected(request.target, ops_paths, warnings)
    shape_file = (given.shapes or SHAPES_DIR / backend.default_shapes).resolve()
    key, shape_list, dtypes = resolve_shapes(op, shape_file, list(given.dtypes) if given.dtypes else None)
    run_spec = _record_spec(request, backend, op=op.name, dtypes=dtypes, shapes_source=f"{shape_file}#{key}",
                            ops_paths=ops_paths, provider=provider, sweep_devices=request.sweep_devices)
    warn(warnings)
    return run_spec, shape_list, request.out


def newest_replayable_run(root: Path) -> tuple[Path, list[str]]:
    """The newest record run under `root` that a replay would take (replay_source refuses none of it),
    and why each newer record run was passed over (an interrupted record that wrote no configs, say)."""
    candidates = []
    for run_json in root.glob(f"*/{rundir.RUN_JSON}"):
        try:
            if spec_mod.read(run_json.parent).mode == "record":
                candidates.append(run_json.parent)
        except spec_mod.SpecError:
            continue
    if not candidates:
        raise UsageError(f"no record run under {root} to replay; give a run dir")
    passed_over = []
    for run_dir in sorted(candidates, key=lambda d: (d.stat().st_mtime, d.name), reverse=True):
        try:
            replay_source(run_dir)
        except UsageError as exc:
            passed_over.append(str(exc))
            continue
        return run_dir, passed_over
    raise UsageError(f"no record run under {root} can be replayed ({len(candidates)} refused, the newest: "
                     f"{passed_over[0]}); give a run dir")


def _outcome(run_dir: Path, observed: dict, rows_found: int) -> tuple[dict, Outcome]:
    """The record's outcome (written by harness.sessions.run or its child): as written, or, when its
    run.json has none (the recording process itself was killed), an INCOMPLETE one saying so. Its
    JSON too, which the replay's spec keeps as the record wrote it."""
    outcome = observed.get("outcome")
    if outcome is None:
        outcome = {"status": "INCOMPLETE", "rows_done": rows_found, "rows_planned": None, "running_case": None,
                   "reason": "outcome not recorded: the recording process was killed"}
    try:
        return outcome, Outcome.from_json(outcome)
    except ValueError as exc:
        raise UsageError(f"cannot replay {run_dir}: {run_dir / rundir.RUN_JSON} is corrupt: observed.outcome "
                         f"{exc}") from None


def _describe_incomplete(outcome: Outcome) -> str:
    """`13/20 rows; killed by signal 9 during case fp16-4x16`."""
    done, planned = outcome.rows_done, outcome.rows_planned
    rows = ("rows unknown" if done is None else f"{done}/{planned} rows" if planned is not None
            else f"{done} row{'s' if done != 1 else ''}")
    return f"{rows}; {outcome.reason or 'reason unknown'}{outcome.during()}"


def _check_records(run_dir: Path, op: str, incomplete: str | None) -> None:
    path = tuning.records_path(run_dir, op)
    try:
        data = tuning.load_records(path)
    except tuning.RecordsError as exc:
        why = f"it is an incomplete record ({incomplete}) and " if incomplete and not path.is_file() else ""
        raise UsageError(f"cannot replay {run_dir}: {why}{exc}") from exc
    # Entries are read in the child, mid-run: a bad one must stop the replay here, not a case there.
    corrupt = f"cannot replay {run_dir}: autotune records {path} are corrupt"
    for kernel, entries in data["kernels"].items():
        if not isinstance(entries, dict):
            raise UsageError(f"{corrupt}: kernel {kernel} does not map keys to entries")
        for key, entry in entries.items():
            problem = tuning.config_problem(entry.get("config") if isinstance(entry, dict) else entry)
            if problem is not None:
                raise UsageError(f"{corrupt}: kernel {kernel} key {key}: {problem}")


def _check_results(run_dir: Path) -> int:
    """Rows in the record's results.json (0 when it has none: a record that died before its first
    row); a file that does not read as results refuses the replay."""
    if not os.path.lexists(Path(run_dir) / rundir.RESULTS_JSON):  # a broken link is no missing file: read, refused
        return 0
    try:
        return len(read_results(run_dir))
    except ResultsError as exc:
        raise UsageError(f"cannot replay {run_dir}: {exc}") from exc


def _replay_backend(given: RunOptions, run_dir: Path, source: spec_mod.RunSpec) -> tuple[backends.Backend, int]:
    """The recorded backend and a device of it; configs do not carry across backends, so a host
    without that backend's device cannot replay the record at all, and says both in one line."""
    backend = resolve_backend(given.backend or source.backend)
    if backend.name != source.backend:
        raise UsageError(f"cannot replay {run_dir}: it was recorded on backend '{source.backend}', "
                         f"not '{backend.name}'; configs do not carry across backends")
    try:
        found = backend.enumerate_devices()
    except backends.BackendUnavailable as exc:
        raise UsageError(str(exc)) from exc
    if not found:
        raise UsageError(f"cannot replay {run_dir}: it was recorded on backend '{source.backend}' and this "
                         f"machine has no {source.backend} device; configs do not carry across backends, so no "
                         f"other backend (not --backend interpreter either) can replay it: replay it on a "
                         f"{source.backend} host")
    return backend, resolve_device(backend, given.device)


def replay_source(run_dir: Path) -> tuple[spec_mod.RunSpec, dict, str | None]:
    """(the record's spec, its outcome as recorded, what it lacks where it is incomplete), or
    UsageError saying in one line why `run_dir` cannot be replayed."""
    try:
        source, observed = spec_mod.read_run(run_dir)
    except spec_mod.SpecError as exc:
        raise UsageError(f"cannot replay {run_dir}: {exc}") from exc
    if source.mode != "record":
        raise UsageError(f"cannot replay {run_dir}: it is a {source.mode} (of {source.replay_from}); "
                         f"replay its record: nox -s replay -- {source.replay_from}")
    outcome, recorded = _outcome(run_dir, observed, _check_results(run_dir))
    incomplete = None if recorded.complete else _describe_incomplete(recorded)
    _check_records(run_dir, source.op, incomplete)
    return source, outcome, incomplete


def resolve_replay(request: RunRequest) -> tuple[spec_mod.RunSpec, list, Path]:
    given = request.options
    dtypes_given = list(given.dtypes) if given.dtypes else None
    cases = None if request.cases is None else list(request.cases)
    run_dir = None if request.target is None else Path(request.target)
    if run_dir is None:
        run_dir, passed_over = newest_replayable_run(runs_root(request.out))
        print(f"replaying the newest replayable record run: {run_dir}")
        for reason in passed_over:
            print(f"  passed over a newer one: {reason}")
    source, outcome, incomplete = replay_source(run_dir)
    backend, device = _replay_backend(given, run_dir, source)
    ops_paths = list(given.ops_paths or ()) or source.ops_paths
    common, warnings = dict(device=device, replay_source_outcome=outcome), []
    if source.flaggems is not None:
        options = _flaggems_replay(given, run_dir, source)
        run_spec = _replay_spec(request, run_dir, source, backend, dtypes=dtypes_given or source.dtypes,
                                shapes_source=flaggems.shapes_source(options), flaggems=options, **common)
        shape_list, out = [], request.out or run_dir.resolve().parent
    else:
        shape_file = (given.shapes or run_dir / rundir.SHAPES_YAML).resolve()
        if given.shapes or dtypes_given:
            # Overrides are checked against the operator itself.
            op, provider = load_op(source.op, ops_paths, warnings)
            key, shape_list, dtypes = resolve_shapes(op, shape_file, dtypes_given)
        else:
            # The recorded shapes and dtypes were checked when recorded: this parent need not import
            # the operator (and torch with it); the child loads it anyway.
            provider = source.provider
            try:
                key, shape_list, dtypes = shapes.resolve(shape_file, source.op, ())
            except shapes.ShapeFileError as exc:
                raise UsageError(f"cannot replay {run_dir}: {exc}") from exc
            dtypes = dtypes or source.dtypes
        _check_cases(cases, run_dir, [f"{d}-{shapes.label(s)}" for d in dtypes for s in shape_list])
        run_spec = _replay_spec(request, run_dir, source, backend, dtypes=dtypes, shapes_source=f"{shape_file}#{key}",
                                ops_paths=ops_paths, provider=provider, **common)
        out = request.out or run_dir.resolve().parent
    if incomplete:
        warnings.insert(0, f"{run_dir} is an incomplete record ({incomplete}): cases it never reached have no "
                           "recorded config and will sweep live")
    warn(warnings)  # last, once nothing can refuse the replay: a refusal stays the one line on stderr
    return run_spec, shape_list, out


def _check_cases(cases: list[str] | None, run_dir: Path, ids: list[str]) -> None:
    """--case names cases of the replay (its record's shapes and dtypes, or those given), each once. A
    FlagGems benchmark's cases are known only as they run: its child says which never came."""
    if cases is None:
        return
    refusal = spec_mod.cases_refusal(cases, "replay")
    unknown = [c for c in cases if c not in ids]
    if refusal is None and unknown:
        refusal = f"--case {clip(unknown[0])}: not a case of this replay of {run_dir} (its cases: {clip(ids)})"
    if refusal is not None:
        raise UsageError(refusal)


def _replay_spec(request: RunRequest, run_dir: Path, source: spec_mod.RunSpec, backend,
                 **fields) -> spec_mod.RunSpec:
    """The record's spec (op, seed, timer, l2, budgets...) as a replay of it, with what this run sets."""
    return dataclasses.replace(
        source, mode="replay", backend=backend.name, replay_from=str(run_dir.resolve()),
        color=color_enabled(request.color), ir=request.ir, only=request.only,
        precompile=request.precompile, cases=None if request.cases is None else list(request.cases),
        sweep_devices=0, device_gate=_gate(request),
        preset_records=None, **fields)


def _gate(request: RunRequest) -> str | None:
    return None if request.device_gate is None else str(request.device_gate)


def color_enabled(choice: str) -> bool:
    if choice == "auto":
        return sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return choice == "always"


# --- running ---------------------------------------------------------------------------------
