"""Parallel compilation of an autotune key's configs before its sweep.

A sweep compiles each config the first time it launches it, one after another (mm: 48 configs,
most of a record's time). Before a sweep we ask Triton's JIT, config by config, what it would
compile (its `jit_cache_hook` hands over the exact signature, constexprs, attributes and options,
and skipping the compile there launches nothing), compile those requests over a bounded process
pool into the run's own Triton cache, and let the sweep run as before: its compiles are then
cache hits of what this same compiler, in this same environment, produced moments earlier. The
sweep still loads every kernel it benchmarks, so the IR collected is unchanged.

An A/B's record also writes every compile its JIT asked for (RequestLog, REQUESTS_FILE in its run dir), and
the other side's passes step, which replays that record under its own compiler, compiles them over its pool
ahead of its rows (Ahead): one at a time, they were most of a FlagGems passes step (aminmax: 48 compiles in
23.5 s on an H100). A side whose env sets another default option (TRITON_DEFAULT_FP_FUSION=0,
TRITON_F32_DEFAULT) asks its JIT for that option wherever the record's compile took its own default: the
record writes its defaults beside its requests, and the other side puts its own in their place
(`translate`). Untranslated, no compile of an fp-fusion A/B matched on an H100.

A config that cannot be precompiled (a kernel not importable in a worker, a worker's failure) is
compiled by the sweep as it always was, and the row says so (AUTOTUNE_PRECOMPILE_FALLBACK). One that
does not compile at all for the key (a compile error as Triton's autotuner classes them: a static
assert, too many resources) is only counted: its sweep drops it just the same.
"""

from __future__ import annotations

import ast
import collections
import concurrent.futures
import dataclasses
import fcntl
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from harness.measure.tuning import compile_error_types

# No more workers than this, whatever the host: each imports torch (hundreds of MB).
MAX_WORKERS = 32
LOCK_DIR = "zl_precompile_locks"
REQUESTS_FILE = "compile_requests.json"
REQUESTS_FORMAT = 1


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
    kernel lives (module, qualified name, source file) and the compile's own inputs. `links`: for a
    module loaded from its file and kept out of sys.modules, the globals its loader set after loading
    it that the kernel names, each (name, module, dotted path to the object there)."""

    module: str
    qualname: str
    path: str | None
    signature: dict
    constants: dict
    attrs: dict
    options: dict
    target: object
    links: tuple = ()

    def to_json(self) -> dict:
        """JSON that `from_json` turns back into an equal Request (NotPersistable where a value has no JSON
        form here: a function or an object passed as a constexpr)."""
        data = {"module": self.module, "qualname": self.qualname, "path": self.path,
                **{name: _pairs(getattr(self, name)) for name in ("signature", "constants", "attrs", "options")},
                "target": _target_to_json(self.target), "links": [list(link) for link in self.links]}
        if Request.from_json(json.loads(json.dumps(data))).digest() != self.digest():
            raise NotPersistable("its JSON form reads back as another compile")
        return data

    @classmethod
    def from_json(cls, data: dict) -> Request:
        from triton.backends.compiler import GPUTarget

        maps = {name: {_decode(k): _decode(v) for k, v in data[name]}
                for name in ("signature", "constants", "attrs", "options")}
        return cls(data["module"], data["qualname"], data["path"], **maps, target=GPUTarget(**data["target"]),
                   links=tuple(tuple(link) for link in data.get("links", ())))

    def digest(self) -> str:
        # Each dict in one order, whatever order it was built in (a dict's keys are all of one type).
        text = repr((self.module, self.qualname,
                     *(sorted(d.items(), key=repr) for d in (self.signature, self.constants, self.attrs, self.options)),
                     self.target))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


class NotPrecompilable(RuntimeError):
    """This config's compile cannot be shipped to a worker; the sweep compiles it."""


class NotPersistable(NotPrecompilable):
    """This compile has no JSON form (REQUESTS_FILE): the side replaying it compiles it itself."""


def _encode(value):
    import triton.language as tl

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if type(value) is tl.dtype:
        return {"dtype": value.name}
    raise NotPersistable(f"a {type(value).__name__} has no JSON form here")


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, dict) and "dtype" in value:
        import triton.language as tl

        return tl.dtype(value["dtype"])
    return value


def _pairs(mapping: dict) -> list:
    # Keys are tuples (an argument's path) as often as names: a list of pairs keeps their type.
    return [[_encode(k), _encode(v)] for k, v in mapping.items()]


def _target_to_json(target) -> dict:
    if not dataclasses.is_dataclass(target):
        raise NotPersistable(f"a target of type {type(target).__name__}")
    return {field.name: _encode(getattr(target, field.name)) for field in dataclasses.fields(target)}


def option_defaults(target) -> dict:
    """The options this process's compiler gives a compile that names none (its env's: fp fusion, the f32 dot
    precision), in the form the JIT's hook hands them over (`_options_from`)."""
    from triton.compiler import make_backend

    options = make_backend(target).parse_options({}).__dict__
    return _options_from(json.dumps({"options": options}))


def translate(requests: list[Request], recorded_defaults: dict, own_defaults: dict
              ) -> tuple[list[Request], collections.Counter]:
    """The requests as this process's JIT will ask for them: an option the recording process left at its
    default (`recorded_defaults`) takes this one's default where the two differ. An option the kernel set
    to that same value itself is translated too: its request then matches nothing, and costs CPU only.
    Also how many requests each option changed in."""
    changed = {k: v for k, v in own_defaults.items() if k in recorded_defaults and recorded_defaults[k] != v}
    counts: collections.Counter[str] = collections.Counter()
    out = []
    for request in requests:
        moved = {k: v for k, v in changed.items() if request.options.get(k, v) == recorded_defaults[k]}
        counts.update(moved.keys())
        out.append(dataclasses.replace(request, options={**request.options, **moved}) if moved else request)
    return out, counts


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
    path, links = getattr(module, "__file__", None), ()
    code = getattr(base, "__code__", None)
    if module is None and code is not None and os.path.isfile(code.co_filename):
        # Loaded from its file and kept out of sys.modules (FlagGems' generated code): that file, and what
        # its loader put in its globals afterwards (FlagGems: the scalar function the kernel calls).
        path = code.co_filename
        links = _links(base, path)
    return Request(base.__module__, base.__qualname__, path, dict(comp["signature"]), dict(comp["constants"]),
                   dict(comp["configs"][0]), _options_from(comp["specialization_data"]), target, links)


@functools.lru_cache(maxsize=256)
def _bound_by_file(path: str) -> frozenset[str]:
    """The names a module's file binds at its top level (defs, classes, imports, assignments, in its
    if/try blocks too)."""
    names = set()
    stack = list(ast.parse(Path(path).read_text(), path).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        else:
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return frozenset(names)


def _links(base, path: str) -> tuple:
    """The globals the kernel `base` names that its file does not bind, each as (name, module, dotted path)
    where the object is reachable so in this process: by its module and qualified name, or one attribute
    below (a wrapper's: FlagGems' PointwiseDynamicFunction holds the JIT function as `_scalar_fn`). One not
    reachable so is left out: a worker's compile that needs it fails and the JIT compiles it (`failures`)."""
    named, codes = set(), [base.__code__]
    while codes:  # the kernel's code and the code nested in it
        code = codes.pop()
        named.update(code.co_names)
        codes.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    links = []
    for name in sorted(named - _bound_by_file(path)):
        value = base.__globals__.get(name, _MISSING)
        if value is _MISSING or name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            links.append((name, value.__name__, ""))
            continue
        source = sys.modules.get(getattr(value, "__module__", None) or "")
        qualname = getattr(value, "__qualname__", None)
        if source is None or not qualname or "<locals>" in qualname:
            continue
        try:
            found = _attribute(source, qualname)
        except AttributeError:
            continue
        if found is value:
            links.append((name, source.__name__, qualname))
        else:
            below = [attr for attr, v in getattr(found, "__dict__", {}).items() if v is value]
            if below:
                links.append((name, source.__name__, f"{qualname}.{below[0]}"))
    return tuple(links)


_MISSING = object()


def _attribute(obj, dotted: str):
    """`obj`'s attribute at the dotted path (`obj` itself for "")."""
    return functools.reduce(getattr, dotted.split("."), obj) if dotted else obj


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
        for name, source, dotted in request.links:  # as its loader set them after loading it
            vars(module)[name] = _attribute(importlib.import_module(source), dotted)
    obj = _attribute(module, request.qualname)
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


class _ChainedHook:
    """A jit_cache_hook of ours in front of whatever hook was there, which still decides."""

    def __init__(self):
        self._previous = None
        self._target = None
        self.errors: collections.Counter[str] = collections.Counter()  # what our part raised, by type

    def install(self) -> None:
        from triton import knobs

        self._previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self._hook

    def uninstall(self) -> None:
        from triton import knobs

        if knobs.runtime.jit_cache_hook == self._hook:  # a bound method: equal, never the same object
            knobs.runtime.jit_cache_hook = self._previous

    def _request(self, kw: dict) -> Request:
        if self._target is None:
            from triton.runtime.driver import driver

            self._target = driver.active.get_current_target()
        return _request([kw], self._target)

    def _hook(self, **kw):
        try:
            self._seen(kw)
        except Exception as exc:  # never the JIT's failure: the compile goes on as it would without us
            self.errors[type(exc).__name__] += 1
        return self._previous(**kw) if self._previous is not None else None

    def _seen(self, kw: dict) -> None:
        raise NotImplementedError


class RequestLog(_ChainedHook):
    """Every compile this run's JIT asks for, as Requests another process can compile (`write`: REQUESTS_FILE).
    A compile with no JSON form (NotPersistable, NotPrecompilable) is counted by kind in `errors`, and left to
    the process replaying it."""

    def __init__(self):
        super().__init__()
        self.requests: dict[str, dict] = {}  # digest -> JSON, in the order first asked

    def _seen(self, kw: dict) -> None:
        request = self._request(kw)
        self.requests.setdefault(request.digest(), request.to_json())

    def write(self, path: Path) -> None:
        from harness.core import rundir

        data = {"format": REQUESTS_FORMAT, "requests": list(self.requests.values()), "skipped": self.errors}
        if self._target is not None:  # the compiles' target, once one was seen: their defaults, for `translate`
            try:
                data["defaults"] = _pairs(option_defaults(self._target))
            except Exception as exc:  # the other side then matches only compiles of its own defaults
                self.errors[f"defaults: {type(exc).__name__}"] += 1  # `skipped` is this Counter
        rundir.atomic_write_json(path, data)


def read_requests(path: Path) -> tuple[list[Request], dict]:
    """The Requests of a REQUESTS_FILE and the recording process's option defaults ({} where it wrote none);
    no requests where it is missing or of another format (an older record: its replay compiles as it always
    did)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return [], {}
    if not isinstance(data, dict) or data.get("format") != REQUESTS_FORMAT:
        return [], {}
    out = []
    for item in data.get("requests", []):
        try:
            out.append(Request.from_json(item))
        except Exception:  # one unreadable request: the JIT compiles that one itself
            continue
    try:
        defaults = {_decode(k): _decode(v) for k, v in data.get("defaults", [])}
    except Exception:  # unreadable: nothing translated
        defaults = {}
    return out, defaults


FAILURES_KEPT = 5  # Ahead's facts name its most common compile failures, not every one


class Ahead(_ChainedHook):
    """A passes step's compiles, started over the pool before its rows (the record's requests, `start`).
    When the JIT asks for one of them, it waits for the worker compiling it and then reads it from the
    cache, or, where it is still queued, takes it over (cancels it and compiles it as always); never does
    the JIT wait behind compiles it does not need yet. A request this compiler specializes otherwise, or
    cannot compile, costs CPU only: the JIT compiles what it asks for."""

    def __init__(self, precompiler: Precompiler, requests: list[Request], recorded_defaults: dict | None = None):
        super().__init__()
        self.precompiler = precompiler
        self.requests = requests
        self.recorded_defaults = recorded_defaults or {}
        self.translated: collections.Counter[str] = collections.Counter()  # option -> requests it changed in
        self.futures: dict[str, object] = {}
        self.counts = {"requests": len(requests), "ready": 0, "waited": 0, "taken_over": 0, "failed": 0,
                       "waited_s": 0.0, "unmatched": 0}
        # Per field of Request, how many of the JIT's compiles that matched no request differed from the
        # record's compile of the same kernel there ("kernel": none of that kernel): why nothing matched.
        self.differs: collections.Counter[str] = collections.Counter()
        # Why the pool's compiles of requests the JIT asked for failed (each compiled again by the JIT), by
        # the first line of what they raised: on an H100, 6 of acosh_'s 7 under TRITON_DEFAULT_FP_FUSION=0.
        self.failures: collections.Counter[str] = collections.Counter()

    def facts(self) -> dict:
        return {**self.counts, **({"translated": dict(self.translated)} if self.translated else {}),
                **({"differs": dict(self.differs)} if self.differs else {}),
                **({"failures": dict(self.failures.most_common(FAILURES_KEPT))} if self.failures else {}),
                **({"errors": dict(self.errors)} if self.errors else {})}

    def start(self) -> None:
        if not self.requests:
            return
        if self.recorded_defaults:
            try:
                own = option_defaults(self.requests[0].target)
            except Exception as exc:  # the requests stay as recorded: those of other defaults match nothing
                self.errors[f"defaults: {type(exc).__name__}"] += 1
            else:
                self.requests, self.translated = translate(self.requests, self.recorded_defaults, own)
        executor = self.precompiler._executor(len(self.requests))
        for request in self.requests:
            self.futures.setdefault(request.digest(), executor.submit(self.precompiler.compile_fn, request))

    def _seen(self, kw: dict) -> None:
        request = self._request(kw)
        future = self.futures.get(request.digest())
        if future is None:
            self.counts["unmatched"] += 1
            same = [r for r in self.requests if (r.module, r.qualname) == (request.module, request.qualname)]
            fields = [f.name for f in dataclasses.fields(Request)
                      if getattr(same[0], f.name) != getattr(request, f.name)] if same else ["kernel"]
            self.differs.update(fields)
            return
        if future.cancel():
            self.counts["taken_over"] += 1
            return
        if future.done():
            self.counts["ready"] += 1
        else:
            started = time.monotonic()
            concurrent.futures.wait([future])
            self.counts["waited"] += 1
            self.counts["waited_s"] = round(self.counts["waited_s"] + time.monotonic() - started, 3)
        failure = future.exception()
        if failure is not None:
            self.counts["failed"] += 1
            self.failures[_first_line(failure)] += 1
