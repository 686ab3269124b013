"""Autotune record and replay for Triton's `Autotuner`.

We watch the autotuner's own `cache` dict instead of recomputing its key: the key Triton looks
up is the key we see, whatever Triton version built it. Record reads back the config chosen for
this call's key after the autotuner ran (never "which keys are new": a warm persistent cache
adds no new key). Replay injects the recorded config at the first lookup of each key, even if a
warm cache already holds one, and reports every deviation per measurement.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from harness.core import bounded, rundir

RECORD_FORMAT = 1
ANY_KEY = "*"  # single-config kernels: their only config, whatever the key


def records_path(run_dir, op: str) -> Path:
    return Path(run_dir) / rundir.RECORDS_DIR / f"{op}.json"


def key_str(key) -> str:
    return ANY_KEY if key is None else json.dumps(list(key), default=repr)


def kernel_id(tuner) -> str:
    fn = getattr(tuner, "base_fn", None) or tuner.fn
    while not hasattr(fn, "__qualname__") or not hasattr(fn, "__module__"):
        fn = fn.fn
    return f"{fn.__module__}.{fn.__qualname__}"


def config_to_json(config, hook_reattached: bool = False) -> dict | None:
    """A Config as JSON, or None when it carries a pre_hook (a function cannot be stored) that
    the tuner would not re-attach itself (FlagGems' LibTuner does, from its own space)."""
    if getattr(config, "pre_hook", None) is not None and not hook_reattached:
        return None
    out = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
           "num_stages": config.num_stages, "num_ctas": getattr(config, "num_ctas", 1)}
    for optional in ("maxnreg", "ir_override"):
        if getattr(config, optional, None) is not None:
            out[optional] = getattr(config, optional)
    return out


def as_stored(data):
    """`data` as it reads back from a records file (rundir's json writer: str() for what json lacks)."""
    return json.loads(json.dumps(data, default=str))


def config_from_json(data: dict, space, hook_reattached: bool = False) -> tuple[object, bool]:
    """(config, in_space): the matching Config object of the autotuner's own space when there is
    one (with its pre_hook), else a new Config built from the record."""
    import triton

    for config in space:
        # Compared as stored: a kwarg json cannot hold as is (a tl.float32 constexpr, a tuple) was
        # written as its str or list, and the space's own Config carries the real value.
        if as_stored(config_to_json(config, hook_reattached)) == data:
            return config, True
    kwargs = {k: v for k, v in data.items() if k != "kwargs"}
    return triton.Config(dict(data["kwargs"]), **kwargs), False


def describe(config) -> str:
    parts = [f"{k}={v}" for k, v in config.kwargs.items()]
    parts += [f"num_warps={config.num_warps}", f"num_stages={config.num_stages}"]
    return " ".join(parts)


def compile_error_types() -> tuple[type, ...]:
    import importlib

    found = []
    for module, name in (("triton.compiler.errors", "CompilationError"),
                         ("triton.compiler.errors", "CompileTimeAssertionFailure"),
                         ("triton.runtime.errors", "OutOfResources"),
                         ("triton.runtime.errors", "PTXASError"),
                         # The interpreter's equivalent of a config that does not compile.
                         ("triton.runtime.errors", "InterpreterError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


class RecordStore:
    """`autotune_records/<op>.json`, rewritten atomically on every new choice so that a crash
    mid-run keeps everything chosen before it."""

    def __init__(self, path: Path, op: str):
        self.path = path
        self.data = {"format": RECORD_FORMAT, "op": op, "kernels": {}}
        self.flush()

    def add(self, kernel: str, key, config_json: dict, case: str) -> None:
        entries = self.data["kernels"].setdefault(kernel, {})
        k = key_str(key)
        if k in entries and entries[k]["config"] == config_json:
            return
        entries[k] = {"key": None if key is None else list(key), "config": config_json, "case": case}
        self.flush()

    def flush(self) -> None:
        rundir.atomic_write_json(self.path, self.data)


class RecordsError(ValueError):
    pass


class RecordsCorrupt(RecordsError):
    """A recorded config that cannot be one of its kernel's: a parameter its tuning space does not
    set (renamed since), or a value of another type than the space gives it. Bad input, found when
    the kernel first runs (only then is its space known), before the config is injected."""


# A config's launch options: whole numbers, of at least these values.
LAUNCH_OPTIONS = {"num_warps": 1, "num_stages": 0, "num_ctas": 1, "maxnreg": 1}


def config_problem(data) -> str | None:
    """What makes a stored config unreadable as one, whatever its kernel; None when it reads."""
    if not isinstance(data, dict) or not isinstance(data.get("kwargs"), dict):
        return f"{data!r:.80} is not a config with kwargs"
    if not all(isinstance(name, str) and name for name in data["kwargs"]):
        return f"kwargs {list(data['kwargs'])!r:.80}: names must be strings"
    for name, value in data["kwargs"].items():
        if isinstance(value, dict):
            return f"kwarg {name}={value!r:.60} is no constexpr value"
    for name, value in data.items():
        if name == "kwargs" or name == "ir_override":
            continue
        least = LAUNCH_OPTIONS.get(name)
        if least is None:
            return f"unknown field {name!r}"
        if type(value) is not int or value < least:
            return f"{name}={value!r:.40} is not a whole number >= {least}"
    return None


def space_problem(data: dict, space) -> str | None:
    """How a stored config disagrees with its kernel's tuning space (parameters, value types);
    None when it could be one of its configs (a value outside the space is allowed: marked)."""
    stored = [as_stored(dict(config.kwargs)) for config in space]
    if not stored:
        return None
    kwargs = data["kwargs"]
    if all(set(kwargs) != set(c) for c in stored):
        return (f"parameters {sorted(kwargs)} are not those its tuning space sets ({sorted(stored[0])}): "
                "a renamed parameter?")
    for name, value in kwargs.items():
        types = {type(c[name]) for c in stored if name in c}
        if type(value) not in types and not (type(value) is int and float in types):
            return (f"{name}={value!r:.40} is a {type(value).__name__}; its tuning space gives it "
                    f"{' or '.join(sorted(t.__name__ for t in types))}")
    return None


def load_records(path: Path) -> dict:
    if not os.path.lexists(path):
        raise RecordsError(f"replay source has no autotune records: {path} is missing")
    try:
        data = rundir.read_json(path, "autotune records")
    except bounded.InputRefused as exc:
        raise RecordsError(f"autotune records: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise RecordsError(f"autotune records {path} are corrupt: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT or not isinstance(data.get("kernels"), dict):
        raise RecordsError(f"autotune records {path}: unknown format (expected format {RECORD_FORMAT})")
    return data


def host_bench(kernel_call, quantiles=None, **_ignored):
    """Autotune benchmarker for a backend without a Triton driver (the interpreter). A config the
    interpreter refuses (a static_assert, say) times as inf, as Triton's own benchmarking treats a
    config that does not compile on a GPU: the sweep goes on to the others."""
    start = time.perf_counter()
    try:
        kernel_call()
    except compile_error_types():
        return [math.inf] * 3 if quantiles else math.inf
    ms = (time.perf_counter() - start) * 1e3
    return [ms, ms, ms] if quantiles else ms


class _ObservedCache(dict):
    """Triton's Autotuner cache (a dict), with each lookup reported to the patch. A copy: `original`, the
    tuner's own, is left as it was, and given back as the patch goes."""

    hook_reattached = False

    def __init__(self, patch: AutotunePatch, tuner, initial: dict):
        super().__init__(initial)
        self._patch = patch
        self._tuner = tuner
        self.original = initial

    def __contains__(self, key):
        self._patch.on_lookup(self._tuner, key, self)
        return dict.__contains__(self, key)

    def __getitem__(self, key):
        config = dict.__getitem__(self, key)
        self._patch.on_chosen(self._tuner, key, config, self.hook_reattached)
        return config

    def has_own(self, key) -> bool:
        return dict.__contains__(self, key)

    def inject(self, key, config) -> None:
        dict.__setitem__(self, key, config)

    def drop(self, key) -> None:
        dict.pop(self, key, None)


_SWEEP = object()  # overlay entry: the key is treated as absent, so the tuner sweeps live


class _OverlayCache:
    """A LibTuner's persistent config cache (FlagGems: sqlite, keyed without compiler identity)
    seen through an in-process overlay: injected configs win over whatever the persistent cache
    holds, and are never written into it; dropping a key masks it, so a live sweep happens even
    though a persistent entry cannot be evicted."""

    hook_reattached = True  # LibTuner re-attaches pre_hooks from its own space

    def __init__(self, patch: AutotunePatch, tuner, inner):
        self._patch = patch
        self._tuner = tuner
        self.inner = inner
        self.overlay: dict = {}

    @property
    def original(self):
        return self.inner

    def __contains__(self, key):
        self._patch.on_lookup(self._tuner, key, self)
        return self.has_own(key)

    def __getitem__(self, key):
        config = self.overlay.get(key)
        if config is None or config is _SWEEP:
            config = self.inner[key]
        self._patch.on_chosen(self._tuner, key, config, True)
        return config

    def __setitem__(self, key, config):
        if key in self.overlay:  # a masked key's live sweep stays in this process
            self.overlay[key] = config
        else:
            self.inner[key] = config

    def has_own(self, key) -> bool:
        value = self.overlay.get(key)
        if value is _SWEEP:
            return False
        return value is not None or key in self.inner

    def inject(self, key, config) -> None:
        self.overlay[key] = config

    def drop(self, key) -> None:
        self.overlay[key] = _SWEEP


class AutotunePatch:
    """Wraps `Autotuner.run` for one process. `mark` reports a marker for the current row,
    `chosen` the config each kernel ran with, `case` names the current row."""

    def __init__(self, mode: str, *, store: RecordStore | None = None, records: dict | None = None,
                 records_source: str = "the autotune records",
                 mark: Callable[[str], None], chosen: Callable[[str, str], None],
                 case: Callable[[], str], host_autotune: bool = False,
                 progress: Callable[[str], None] = lambda line: None,
                 precompile: Callable | None = None):
        self.mode = mode
        self.store = store
        # Replay injects; so does a record run measuring a parallel sweep's merged picks.
        self.inject = mode == "replay" or records is not None
        self.records = (records or {}).get("kernels", {})
        self.records_source = records_source
        self.mark = mark
        self.chosen = chosen
        self.case = case
        self.host_autotune = host_autotune
        self.progress = progress
        # (tuner, args, kwargs) -> precompile.Outcome: compiles a key's configs before its sweep.
        self.precompile = precompile
        self._call: tuple[tuple, dict] = ((), {})  # the tuner call under way, for the precompile
        self.state: dict[tuple[str, str], str] = {}  # (kernel, key) -> injected|key_missing|compile_failed
        self.counts = {"recorded": 0, "injected": 0, "key_missing": 0, "compile_failed": 0,
                       "not_recorded_pre_hook": 0, "outside_space": 0}
        self._injected_now = None
        self._originals: dict[type, Callable] = {}
        # id(tuner) -> the tuner, whose cache this patch wraps: unwrapped as it goes. A tuner outlives the
        # run in a process that runs several (a measuring host), and the next run's patch must see its lookups.
        self._tuners: dict[int, object] = {}
        self._compile_errors = compile_error_types()
        # Wall time of the sweeps (benchmarking every config of a key, after its precompile): where a
        # record's time goes, beside the precompile's.
        self.sweeps = {"keys": 0, "seconds": 0.0}
        self._sweep: tuple[str, float] | None = None  # (kernel key label, start) of the sweep under way

    # --- hooks from the observed cache ---------------------------------------------------------
    def on_lookup(self, tuner, key, cache) -> None:
        if not self.inject:
            if not cache.has_own(key) and len(tuner.configs) > 1:
                # A long sweep (mm: 48 configs, minutes) must not look like a hang.
                label = f"{kernel_id(tuner).rsplit('.', 1)[-1]} key={key_str(key)}"
                self.progress(f"autotune: sweeping {label} over {len(tuner.configs)} configs")
                self._precompile(tuner, key)
                self._sweep = (label, time.perf_counter())
            return
        kernel, k = kernel_id(tuner), key_str(key)
        state = self.state.get((kernel, k))
        if state is None:
            entry = self.records.get(kernel, {}).get(k)
            if entry is None:
                state = "key_missing"
                self.counts["key_missing"] += 1
            else:
                problem = config_problem(entry.get("config") if isinstance(entry, dict) else entry)
                problem = problem or space_problem(entry["config"], tuner.configs)
                if problem is not None:
                    raise RecordsCorrupt(f"{self.records_source} are corrupt: kernel {kernel} key {k}: {problem}")
                config, in_space = config_from_json(entry["config"], tuner.configs, cache.hook_reattached)
                cache.inject(key, config)  # unconditionally: a warm cache must not win
                state = "injected"
                self.counts["injected"] += 1
                self._injected_now = (kernel, k, key)
                if not in_space:
                    self.counts["outside_space"] += 1
                    self.mark(f"AUTOTUNE_REPLAY_OUTSIDE_SPACE kernel={kernel} key={k}")
            self.state[(kernel, k)] = state
        if state != "injected":
            self.mark(f"AUTOTUNE_REPLAY_FALLBACK kernel={kernel} key={k} reason={state}")
            if not cache.has_own(key):
                label = f"{kernel.rsplit('.', 1)[-1]} key={k}"
                self.progress(f"autotune: sweeping {label} live ({state})")
                if len(tuner.configs) > 1:
                    self._precompile(tuner, key)
                    self._sweep = (label, time.perf_counter())

    def _precompile(self, tuner, key) -> None:
        """Compile the key's configs in parallel before its sweep; a config that could not be
        is compiled by the sweep, and the row says so."""
        if self.precompile is None:
            return
        kernel, k = kernel_id(tuner), key_str(key)
        args, kwargs = self._call
        try:
            outcome = self.precompile(tuner, args, kwargs)
        except Exception as exc:  # the pool itself broke: every config compiles in the sweep
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
            self.mark(f"AUTOTUNE_PRECOMPILE_FALLBACK kernel={kernel} key={k} configs=all reason={reason!r}")
            self.progress(f"autotune: precompile of {kernel.rsplit('.', 1)[-1]} failed ({reason}); "
                          "the sweep compiles every config")
            return
        self.progress(f"autotune: precompiled {outcome.compiled}/{outcome.configs} configs of "
                      f"{kernel.rsplit('.', 1)[-1]} key={k} over {outcome.workers} processes in {outcome.seconds} s"
                      + (f" ({outcome.cached} already compiled)" if outcome.cached else "")
                      + (f"; {outcome.rejected} do not compile for this key (its sweep drops them too)"
                         if outcome.rejected else "")
                      + (f"; {len(outcome.failed)} left to the sweep" if outcome.failed else ""))
        for config, reason in outcome.failed:
            config_text = describe(config).replace(" ", ",")
            self.mark(f"AUTOTUNE_PRECOMPILE_FALLBACK kernel={kernel} key={k} config={config_text} reason={reason!r}")

    def on_chosen(self, tuner, key, config, hook_reattached: bool = False) -> None:
        kernel = kernel_id(tuner)
        self.chosen(kernel, describe(config))
        if self.mode != "record":
            return
        as_json = config_to_json(config, hook_reattached)
        if as_json is None:
            # Plain Triton configs with a pre_hook cannot be serialized: not recorded, and they
            # show up as key_missing on replay.
            if (kernel, key_str(key)) not in self.state:
                self.state[(kernel, key_str(key))] = "not_recorded"
                self.counts["not_recorded_pre_hook"] += 1
            self.mark(f"AUTOTUNE_NOT_RECORDED kernel={kernel} key={key_str(key)} reason=pre_hook")
            return
        before = len(self.store.data["kernels"].get(kernel, {}))
        self.store.add(kernel, key, as_json, self.case())
        self.counts["recorded"] += len(self.store.data["kernels"][kernel]) - before

    # --- the wrapper ---------------------------------------------------------------------------
    def _run(self, original, tuner, *args, **kwargs):
        if self.host_autotune and "do_bench" not in vars(tuner):
            vars(tuner)["do_bench"] = host_bench
        # Re-checked on every call: a LibTuner swaps its cache object when its tuning space changes.
        cache = tuner.cache
        if not isinstance(cache, (_ObservedCache, _OverlayCache)) or cache._patch is not self:
            if isinstance(cache, (_ObservedCache, _OverlayCache)):  # an earlier run's, not given back (it crashed)
                cache = cache.original
            tuner.cache = (_ObservedCache(self, tuner, cache) if isinstance(cache, dict)
                           else _OverlayCache(self, tuner, cache))
            self._tuners[id(tuner)] = tuner
        self._injected_now = None
        self._sweep = None
        self._call = (args, kwargs)
        try:
            result = original(tuner, *args, **kwargs)
        except self._compile_errors as exc:
            injected, self._injected_now = self._injected_now, None
            if injected is None:
                raise
            # The recorded config does not compile under this compiler: sweep live, loudly.
            kernel, k, key = injected
            tuner.cache.drop(key)
            self.state[(kernel, k)] = "compile_failed"
            self.counts["compile_failed"] += 1
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.mark(f"AUTOTUNE_REPLAY_FALLBACK kernel={kernel} key={k} reason=compile_failed "
                      f"detail={first_line[:200]!r}")
            result = original(tuner, *args, **kwargs)
        if self._sweep is not None:
            label, start = self._sweep
            self._sweep = None
            seconds = time.perf_counter() - start
            self.sweeps["keys"] += 1
            self.sweeps["seconds"] = round(self.sweeps["seconds"] + seconds, 3)
            self.progress(f"autotune: swept {label} in {seconds:.2f} s")
        if len(tuner.configs) == 1:
            self.on_chosen(tuner, None, tuner.configs[0], isinstance(tuner.cache, _OverlayCache))
        return result

    def install(self, tuner_class=None) -> None:
        """Wrap `run` of Triton's Autotuner, or of a subclass with its own run (FlagGems'
        LibTuner, patched once its package is imported)."""
        if tuner_class is None:
            from triton.runtime.autotuner import Autotuner as tuner_class
        if tuner_class in self._originals:
            return
        original = tuner_class.run
        self._originals[tuner_class] = original
        patch = self

        def run(tuner, *args, **kwargs):
            return patch._run(original, tuner, *args, **kwargs)

        tuner_class.run = run

    def uninstall(self) -> None:
        """The tuners' run methods and caches as they were before this run: what it injected or swept is
        not the next run's (a fresh process starts without them)."""
        for tuner_class, original in self._originals.items():
            tuner_class.run = original
        self._originals.clear()
        for tuner in self._tuners.values():
            if isinstance(tuner.cache, (_ObservedCache, _OverlayCache)) and tuner.cache._patch is self:
                tuner.cache = tuner.cache.original
            if vars(tuner).get("do_bench") is host_bench:
                del vars(tuner)["do_bench"]
        self._tuners.clear()
