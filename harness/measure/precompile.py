"""Parallel compilation of an autotune key's configs before its sweep.

A sweep compiles each config the first time it launches it, one after another (mm: 48 configs,
most of a record's time). Before a sweep we ask Triton's JIT, config by config, what it would
compile (its `jit_cache_hook` hands over the exact signature, constexprs, attributes and options,
and skipping the compile there launches nothing), compile those requests over a bounded process
pool into the run's own Triton cache, and let the sweep run as before: its compiles are then
cache hits of what this same compiler, in this same environment, produced moments earlier. The
sweep still loads every kernel it benchmarks, so the IR collected is unchanged.

A config that cannot be precompiled (a kernel not importable in a worker, a worker's failure) is
compiled by the sweep as it always was, and the row says so (AUTOTUNE_PRECOMPILE_FALLBACK). One that
does not compile at all for the key (a compile error as Triton's autotuner classes them: a static
assert, too many resources) is only counted: its sweep drops it just the same.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.measure.tuning import compile_error_types

# No more workers than this, whatever the host: each imports torch (hundreds of MB).
MAX_WORKERS = 32
LOCK_DIR = "zl_precompile_locks"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which cgroups and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pool_size(requests: int, cpus: int, cap: int = MAX_WORKERS) -> int:
    """Workers for `requests` compiles: no more than there are requests, CPUs, or `cap`; at least one."""
    return max(1, min(requests, cpus, cap))


def sweep_configs(tuner, kwargs: dict) -> list:
    """The configs the sweep will benchmark: the tuner's own pruning (early_config_prune, perf
    model) applied exactly as its run applies it; its whole space when it has no pruning step."""
    prune = getattr(tuner, "prune_configs", None)
    return list(prune(kwargs)) if prune is not None else list(tuner.configs)


@dataclasses.dataclass(frozen=True)
class Request:
    """One compile, as the JIT would do it, in a form a worker process can rebuild: where the
    kernel lives (module, qualified name, source file) and the compile's own inputs."""

    module: str
    qualname: str
    path: str | None
    signature: dict
    constants: dict
    attrs: dict
    options: dict
    target: object

    def digest(self) -> str:
        # Each dict in one order, whatever order it was built in (a dict's keys are all of one type).
        text = repr((self.module, self.qualname,
                     *(sorted(d.items(), key=repr) for d in (self.signature, self.constants, self.attrs, self.options)),
                     self.target))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


class NotPrecompilable(RuntimeError):
    """This config's compile cannot be shipped to a worker; the sweep compiles it."""


def _options_from(specialization_data: str) -> dict:
    # Triton's own serialization for compiling in another process (JITFunction.preload decodes
    # options the same way: JSON turned tuples into lists).
    options = json.loads(specialization_data)["options"]
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def capture(tuner, args: tuple, kwargs: dict, configs: list) -> list[Request | None | Exception]:
    """Per config: the Request the JIT would compile for it, None when this process has it compiled
    already, or the exception that says why it cannot be captured. Nothing is compiled or launched:
    the hook answers "handled" to the JIT, which then returns without a kernel."""
    from triton import knobs
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    seen: list[dict] = []

    def hook(**kw):
        seen.append(kw)
        return True

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    out: list[Request | None | Exception] = []
    try:
        for config in configs:
            seen.clear()
            try:
                tuner.fn.run(*args, **dict(kwargs, **config.all_kwargs(), warmup=True))
                out.append(_request(seen, target) if seen else None)
            except Exception as exc:  # one config's capture failing must not stop the others'
                out.append(exc)
    finally:
        knobs.runtime.jit_cache_hook = previous
    return out


def _request(seen: list[dict], target) -> Request:
    info, comp = seen[-1]["fn"], seen[-1]["compile"]
    base = info.jit_function.fn  # the Python function under the JITFunction the JIT was compiling
    if "<locals>" in base.__qualname__:
        raise NotPrecompilable(f"{base.__qualname__} is defined inside a function: a worker cannot import it")
    module = sys.modules.get(base.__module__)
    path = getattr(module, "__file__", None)
    return Request(base.__module__, base.__qualname__, path, dict(comp["signature"]), dict(comp["constants"]),
                   dict(comp["configs"][0]), _options_from(comp["specialization_data"]), target)


def _jit_function(request: Request):
    """The JITFunction in this worker: imported by module name, else loaded from its file under the
    same name (operators loaded by path, FlagGems' generated code)."""
    from triton.runtime.jit import JITFunction

    try:
        module = importlib.import_module(request.module)  # also one loaded from its file before: sys.modules
    except ImportError:
        if request.path is None:
            raise
        spec = importlib.util.spec_from_file_location(request.module, request.path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[request.module] = module
        spec.loader.exec_module(module)
    obj = module
    for part in request.qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction):  # an autotuner, heuristics or LibEntry around it
        obj = obj.fn
    return obj


def compile_request(request: Request) -> str:
    """Worker side: compile into TRITON_CACHE_DIR (inherited), as JITFunction.preload would; the
    compiled kernel's cache hash. A lock per request keeps two processes sharing one cache (the
    parallel sweep's shards) from compiling the same kernel twice: the second finds it cached."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource, make_backend

    fn = _jit_function(request)
    options = make_backend(request.target).parse_options(dict(request.options))
    # The cache this compile writes into: TRITON_CACHE_DIR, else Triton's default under TRITON_HOME.
    lock_dir = Path(knobs.cache.dir) / LOCK_DIR
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / request.digest(), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kernel = triton.compile(ASTSource(fn, request.signature, request.constants, request.attrs),
                                target=request.target, options=options.__dict__)
    return kernel.hash


def _worker_init() -> None:
    # A terminal's Ctrl-C reaches the whole group: the child handles it; its workers just end. A
    # SIGTERM (a batch's timeout, to the group) ends a worker, whose fork copied the child's handler
    # (which would write the run's outcome) too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


@dataclasses.dataclass
class Outcome:
    """One key's precompile: configs asked, compiled here, already compiled in this process, and
    the configs that fell back to the sweep with why."""

    configs: int
    compiled: int
    cached: int
    failed: list[tuple[object, str]]
    workers: int
    seconds: float
    # Configs that do not compile for this key (a compile error, as Triton's autotuner classes them):
    # its sweep rejects them too, so they are no fallback.
    rejected: int


class Precompiler:
    """Owns the worker pool (forked by `start` before the device is touched, else spawned at the
    first sweep that needs it; shut down at the end). `capture` and `compile_fn` are the boundary
    to Triton; tests hand in fakes."""

    def __init__(self, *, cpus: int | None = None, capture_fn: Callable = capture,
                 compile_fn: Callable[[Request], str] = compile_request, executor_factory: Callable | None = None):
        self.cpus = cpus or usable_cpus()
        self.capture_fn = capture_fn
        self.compile_fn = compile_fn
        self.executor_factory = executor_factory or _pool
        self.executor = None
        self.workers = 0
        self.method: str | None = None  # how its workers were started: fork, spawn (None: never needed)
        self.totals = {"keys": 0, "configs": 0, "compiled": 0, "cached": 0, "failed": 0, "rejected": 0,
                       "seconds": 0.0}

    def run(self, tuner, args: tuple, kwargs: dict) -> Outcome:
        start = time.monotonic()
        configs = sweep_configs(tuner, kwargs)
        captured = self.capture_fn(tuner, args, kwargs, configs)
        failed, todo, cached, compile_failed, rejected = [], [], 0, 0, 0
        for config, item in zip(configs, captured, strict=True):
            if item is None:
                cached += 1
            elif isinstance(item, Exception):
                failed.append((config, f"not captured: {_first_line(item)}"))
            else:
                todo.append((config, item))
        if todo:
            executor = self._executor(len(todo))
            futures = [(config, executor.submit(self.compile_fn, request)) for config, request in todo]
            does_not_compile = compile_error_types()
            for config, future in futures:
                try:
                    future.result()
                except does_not_compile:  # the sweep cannot compile it either, and drops it
                    rejected += 1
                    compile_failed += 1
                except Exception as exc:  # the sweep compiles it again, and the row says why
                    failed.append((config, _first_line(exc)))
                    compile_failed += 1
        outcome = Outcome(len(configs), len(todo) - compile_failed, cached, failed, self.workers,
                          round(time.monotonic() - start, 2), rejected)
        for name, value in (("keys", 1), ("configs", outcome.configs), ("compiled", outcome.compiled),
                            ("cached", outcome.cached), ("failed", len(outcome.failed)),
                            ("rejected", outcome.rejected), ("seconds", outcome.seconds)):
            self.totals[name] = round(self.totals[name] + value, 2)
        return outcome

    def start(self) -> None:
        """Fork the pool now, one worker per usable CPU (up to the cap), from this process before it
        touches the device (a fork must not copy its context and threads). A forked worker has
        torch and triton imported already; a spawned one imports them first: a record's first
        sweep waited 3.7 s for that on an H200 host, for 20 compiles of 0.3 s. The fork context
        launches every worker at the first submit, which this makes."""
        if self.executor is None:
            self.workers, self.method = pool_size(self.cpus, self.cpus), "fork"
            self.executor = self.executor_factory(self.workers, self.method)
            self.executor.submit(int).result()

    def _executor(self, requests: int):
        if self.executor is None:
            # Sized once, for the first key's configs (every key of a kernel has the same space).
            # Spawned, not forked: by now the device may hold a context and threads a fork would copy.
            self.workers, self.method = pool_size(requests, self.cpus), "spawn"
            self.executor = self.executor_factory(self.workers, self.method)
        return self.executor

    def close(self) -> None:
        if self.executor is not None:
            # Waited for: the child ends without the interpreter's teardown, which would join them.
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


def _pool(workers: int, method: str):
    import concurrent.futures
    import multiprocessing

    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                                  initializer=_worker_init)
