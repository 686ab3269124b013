"""Parallel precompile of autotune configs (harness.measure.precompile): pool sizing, the configs a
sweep will benchmark, that every config of a key reaches the compile step before the sweep, and
that a config that could not be precompiled falls back to the sweep loudly. Triton's interpreter
compiles nothing, so the boundary to the compiler (capture and compile) is faked; the autotuner,
its cache lookups and its sweep are Triton's own."""

import concurrent.futures
import dataclasses
import gc
import json
import multiprocessing
import signal
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from conftest import PersistentCache, alive
from triton.compiler.errors import CompileTimeAssertionFailure

import backends
from harness.child.plugins import autotune
from harness.measure import precompile, tuning

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


def make_kernel(configs=CONFIGS, prune=None):
    @triton.autotune(configs=configs, key=["n"], prune_configs_by={"early_config_prune": prune} if prune else None)
    @triton.jit
    def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    vars(double)["do_bench"] = tuning.host_bench
    return double


def call(kernel, n):
    x = torch.arange(n, dtype=torch.float32)
    out = torch.empty_like(x)
    kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    assert torch.equal(out, x * 2)


class Inline(concurrent.futures.Executor):
    """Runs each compile at submit: the fake compile function need not be picklable."""

    def __init__(self, workers, method):
        self.workers = workers
        self.method = method

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future


class Boundary:
    """The fake compiler boundary: capture turns each config into a request naming it; compile
    records what it was asked and fails for the configs in `fail`."""

    def __init__(self, fail=(), not_captured=(), invalid=(), cached=()):
        self.compiled: list[tuple] = []
        self.fail = set(fail)
        self.invalid = set(invalid)
        self.not_captured = set(not_captured)
        self.cached = set(cached)  # compiled in this process already: nothing to request

    def capture(self, tuner, args, kwargs, configs):
        out = []
        for c in configs:
            ident = (c.kwargs["BLOCK"], c.num_warps)
            out.append(RuntimeError("no hook here") if ident in self.not_captured
                       else None if ident in self.cached else ident)
        return out

    def compile(self, request):
        self.compiled.append(request)
        if request in self.fail:
            raise RuntimeError(f"PTXASError: ptxas died for {request}\nsecond line")
        if request in self.invalid:  # a config the kernel's static_assert refuses for this key
            raise CompileTimeAssertionFailure(None, None, f"BLOCK too large for {request}")
        return f"hash{request}"


@pytest.fixture
def patched(tmp_path):
    made = []

    def make(boundary, mode="record", records=None, cpus=4):
        marks, lines = [], []
        pre = precompile.Precompiler(cpus=cpus, capture_fn=boundary.capture, compile_fn=boundary.compile,
                                     executor_factory=Inline)
        store = tuning.RecordStore(tmp_path / "rec.json", "op") if mode == "record" else None
        patch = tuning.AutotunePatch(mode, store=store, records=records, mark=marks.append,
                                     chosen=lambda k, c: None, case=lambda: "case", host_autotune=True,
                                     progress=lines.append, precompile=pre.run)
        patch.install()
        made.append(patch)
        return types.SimpleNamespace(patch=patch, marks=marks, lines=lines, pre=pre)

    yield make
    for p in made:
        p.uninstall()


@pytest.mark.parametrize("requests,cpus,cap,expected", [
    (48, 16, 32, 16),  # CPUs bound it
    (3, 16, 32, 3),  # no idle workers for a small space
    (200, 64, 32, 32),  # the cap bounds a large host
    (0, 16, 32, 1),  # at least one
    (5, 1, 32, 1),
])
def test_pool_size(requests, cpus, cap, expected):
    assert precompile.pool_size(requests, cpus, cap) == expected


def test_usable_cpus_follows_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(precompile.os, "sched_getaffinity", lambda pid: {2, 5, 7} if pid == 0 else set())
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 64)
    assert precompile.usable_cpus() == 3

    def no_affinity(pid):
        raise OSError("not here")

    monkeypatch.setattr(precompile.os, "sched_getaffinity", no_affinity)
    assert precompile.usable_cpus() == 64
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: None)
    assert precompile.usable_cpus() == 1
    monkeypatch.delattr(precompile.os, "sched_getaffinity")  # not on every platform
    assert precompile.usable_cpus() == 1


def test_a_worker_ignores_the_terminals_ctrl_c(monkeypatch):
    monkeypatch.setattr(precompile.signal, "signal", lambda signum, handler: seen.append((signum, handler)))
    seen = []
    precompile._worker_init()
    # A forked worker drops the child's SIGTERM handler too (it would write the run's outcome).
    assert seen == [(signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_DFL)]


def test_sweep_configs_are_the_tuners_pruned_space():
    kernel = make_kernel(prune=lambda configs, nargs, **kw: [c for c in configs if c.kwargs["BLOCK"] != 32])
    kernel.nargs = {"n": 8}
    assert precompile.sweep_configs(kernel, {}) == [c for c in CONFIGS if c.kwargs["BLOCK"] != 32]
    assert precompile.sweep_configs(types.SimpleNamespace(configs=CONFIGS[:2]), {}) == CONFIGS[:2]


def test_every_config_of_a_key_is_precompiled_before_its_sweep_once(patched):
    boundary = Boundary()
    p = patched(boundary)
    kernel = make_kernel()
    call(kernel, 100)
    assert sorted(boundary.compiled) == sorted((c.kwargs["BLOCK"], c.num_warps) for c in CONFIGS)
    call(kernel, 100)  # the key is cached: no sweep, nothing to precompile
    assert len(boundary.compiled) == len(CONFIGS)
    call(kernel, 1000)  # a new key sweeps again
    assert len(boundary.compiled) == 2 * len(CONFIGS)
    assert p.pre.totals["keys"] == 2 and p.pre.workers == 4
    assert any(f"precompiled {len(CONFIGS)}/{len(CONFIGS)} configs of double" in line for line in p.lines)
    assert not p.marks


def test_only_the_pruned_configs_are_precompiled(patched):
    boundary = Boundary()
    patched(boundary)
    call(make_kernel(prune=lambda configs, nargs, **kw: configs[:2]), 100)
    assert boundary.compiled == [(16, 1), (16, 2)]


def test_a_replay_that_injects_precompiles_nothing_but_a_missing_key_sweeps_precompiled(patched):
    kernel = make_kernel()
    recorder = patched(Boundary())
    call(kernel, 100)
    recorder.patch.uninstall()
    records = recorder.patch.store.data
    boundary = Boundary()
    patched(boundary, mode="replay", records=records)
    fresh = make_kernel()
    call(fresh, 100)
    assert boundary.compiled == []
    call(fresh, 1000)  # not recorded: sweeps live, precompiled first
    assert len(boundary.compiled) == len(CONFIGS)


def test_a_config_that_fails_to_precompile_is_marked_and_still_swept(patched):
    boundary = Boundary(fail={(32, 2)}, not_captured={(64, 1)})
    p = patched(boundary)
    benched = []
    kernel = make_kernel()
    original = kernel._bench

    def bench(*args, config, **kwargs):
        benched.append((config.kwargs["BLOCK"], config.num_warps))
        return original(*args, config=config, **kwargs)

    kernel._bench = bench
    call(kernel, 100)
    assert sorted(benched) == sorted((c.kwargs["BLOCK"], c.num_warps) for c in CONFIGS)  # the sweep is whole
    assert (64, 1) not in boundary.compiled
    failed = sorted(m for m in p.marks if m.startswith("AUTOTUNE_PRECOMPILE_FALLBACK"))
    assert len(failed) == 2
    assert "config=BLOCK=32,num_warps=2" in failed[0] and "ptxas died" in failed[0]
    assert "second line" not in failed[0]
    assert "config=BLOCK=64,num_warps=1" in failed[1] and "not captured" in failed[1]
    assert any("4/6 configs" in line and "2 left to the sweep" in line for line in p.lines)


def test_a_config_that_does_not_compile_for_the_key_is_counted_not_marked(patched):
    # Triton's autotuner drops such a config in the sweep too (its compile raises again): no fallback.
    p = patched(Boundary(invalid={(32, 2), (64, 1)}))
    call(make_kernel(), 100)
    assert p.marks == []
    assert any("4/6 configs" in line and "2 do not compile for this key (its sweep drops them too)" in line
               and "left to the sweep" not in line for line in p.lines), p.lines
    assert (p.pre.totals["compiled"], p.pre.totals["rejected"], p.pre.totals["failed"]) == (4, 2, 0)


def test_a_keys_outcome_counts_each_config_once_and_the_totals_add_up(monkeypatch):
    # Two of each kind, each kind's configs interleaved with the others' in the key's order.
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64, 128, 256) for w in (1, 2)]
    boundary = Boundary(cached={(16, 1), (256, 2)}, not_captured={(16, 2), (256, 1)}, invalid={(32, 1), (64, 1)},
                        fail={(32, 2), (64, 2)})
    now = [0.0]

    def monotonic():  # each key's precompile takes 0.1234 s
        now[0] += 0.1234
        return now[0]

    monkeypatch.setattr(precompile, "time", types.SimpleNamespace(monotonic=monotonic))
    pre = precompile.Precompiler(cpus=8, capture_fn=boundary.capture, compile_fn=boundary.compile,
                                 executor_factory=Inline)
    assert (pre.workers, pre.executor) == (0, None)
    tuner = types.SimpleNamespace(configs=configs)
    first = pre.run(tuner, (), {})
    by_ident = {(c.kwargs["BLOCK"], c.num_warps): c for c in configs}
    # 6 requests: a pool of 6 on 8 CPUs, not one per config of the key.
    assert first == precompile.Outcome(
        configs=10, compiled=2, cached=2, workers=6, seconds=0.12, rejected=2,
        failed=[(by_ident[16, 2], "not captured: RuntimeError: no hook here"),
                (by_ident[256, 1], "not captured: RuntimeError: no hook here"),
                (by_ident[32, 2], "RuntimeError: PTXASError: ptxas died for (32, 2)"),
                (by_ident[64, 2], "RuntimeError: PTXASError: ptxas died for (64, 2)")])
    assert sorted(boundary.compiled) == [(32, 1), (32, 2), (64, 1), (64, 2), (128, 1), (128, 2)]
    pool = pre.executor
    assert pool.workers == 6
    second = pre.run(tuner, (), {})
    assert second == first and pre.executor is pool  # sized once, at the first key that compiles
    assert pre.totals == {"keys": 2, "configs": 20, "compiled": 4, "cached": 4, "failed": 8, "rejected": 4,
                          "seconds": 0.24}
    # A capture that answers for fewer configs than it was asked about is an error, not fewer compiles.
    pre.capture_fn = lambda *args: boundary.capture(*args)[:-1]
    with pytest.raises(ValueError):
        pre.run(tuner, (), {})


def test_closing_the_pool_drops_the_compiles_still_queued_and_ends_its_workers():
    # After an interrupt, compiles of the key may still be queued: closing the pool runs none of them, and
    # it returns once its workers are gone.
    pre = precompile.Precompiler(cpus=1)
    executor = pre._executor(4)
    assert executor._max_workers == 1
    # The later ones long enough that the last is still queued when the pool closes, however late this thread
    # gets there (the pool hands a worker its next ones ahead: the last leaves the queue after 4 s at least).
    futures = [executor.submit(time.sleep, 0.2), *(executor.submit(time.sleep, 2) for _ in range(5))]
    futures[0].result()
    workers = list(executor._processes)
    pre.close()
    assert pre.executor is None
    assert futures[-1].cancelled()
    assert workers and not any(alive(pid) for pid in workers)


def test_a_broken_precompile_step_leaves_every_config_to_the_sweep_loudly(patched):
    class Broken(Boundary):
        def capture(self, *args):
            raise OSError("no workers")

    p = patched(Broken())
    call(make_kernel(), 100)
    (mark,) = p.marks
    assert mark.startswith("AUTOTUNE_PRECOMPILE_FALLBACK kernel=") and "configs=all" in mark
    assert "OSError: no workers" in mark
    assert any("the sweep compiles every config" in line for line in p.lines)


def test_the_interpreter_compiles_nothing_so_its_run_says_precompile_is_off(tmp_path):
    assert backends.get("cuda").compiles_kernels and not backends.get("interpreter").compiles_kernels
    said = []
    spec = types.SimpleNamespace(mode="replay", precompile=True, replay_from=str(tmp_path), op="op",
                                 preset_records=None)
    records = tmp_path / "autotune_records"
    records.mkdir()
    (records / "op.json").write_text('{"format": 1, "op": "op", "kernels": {}}')
    ctx = types.SimpleNamespace(spec=spec, run_dir=tmp_path, backend=backends.get("interpreter"), say=said.append,
                                mark=lambda m: None, case_id="", configs={})
    plugin = autotune.AutotunePlugin(ctx)
    plugin.pytest_configure(None)
    try:
        assert plugin.precompiler is None and plugin.patch.precompile is None
        assert said == ["precompile off: backend 'interpreter' compiles no kernels"]
    finally:
        plugin.patch.uninstall()


def test_a_kernel_defined_in_a_function_is_not_shipped_to_a_worker():
    kernel = make_kernel()
    seen = [{"fn": types.SimpleNamespace(jit_function=kernel.fn), "compile": {}}]
    with pytest.raises(precompile.NotPrecompilable,
                       match=r"^make_kernel\.<locals>\.double is defined inside a function: a worker cannot import"):
        precompile._request(seen, target=None)


def test_a_kernel_of_a_module_without_a_file_is_requested_by_its_module_name(monkeypatch):
    module = types.ModuleType("zl_no_file")  # built in memory: nothing to load it from
    monkeypatch.setitem(sys.modules, "zl_no_file", module)
    base = types.SimpleNamespace(__module__="zl_no_file", __qualname__="kern")
    comp = {"signature": {"x": "*fp32"}, "constants": {}, "configs": [{(0,): [["tt.divisibility", 16]]}],
            "specialization_data": '{"options": {"num_warps": 8, "extern_libs": [["a", "b"]]}}'}
    request = precompile._request([{"fn": types.SimpleNamespace(jit_function=types.SimpleNamespace(fn=base)),
                                    "compile": comp}], target="sm_90")
    assert request == precompile.Request("zl_no_file", "kern", None, {"x": "*fp32"}, {},
                                         {(0,): [["tt.divisibility", 16]]},
                                         {"num_warps": 8, "extern_libs": (["a", "b"],)}, "sm_90")


def test_a_worker_finds_a_kernel_of_a_module_loaded_from_its_file(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a worker runs where kernels compile
    source = tmp_path / "zl_loaded_by_path.py"
    source.write_text("import triton\nimport triton.language as tl\n\n\n"
                      "@triton.autotune(configs=[triton.Config({'B': 1})], key=['n'])\n@triton.jit\n"
                      "def kern(x, n, B: tl.constexpr):\n    pass\n\n\n"
                      "class Ops:\n    @triton.heuristics({'B': lambda a: 1})\n    @triton.jit\n"
                      "    def kern(x, n, B: tl.constexpr):\n        pass\n")
    monkeypatch.setitem(sys.modules, "zl_loaded_by_path", None)  # gone again at the end
    del sys.modules["zl_loaded_by_path"]
    request = precompile.Request("zl_loaded_by_path", "kern", str(source), {}, {}, {}, {}, None)
    fn = precompile._jit_function(request)
    assert isinstance(fn, triton.runtime.jit.JITFunction) and fn.fn.__qualname__ == "kern"
    module = sys.modules["zl_loaded_by_path"]  # registered under its name, as an import would
    assert fn.fn.__globals__ is vars(module) and module.__file__ == str(source)
    # Another kernel of that file comes from the same module, not from a second load of it.
    nested = precompile._jit_function(dataclasses.replace(request, qualname="Ops.kern"))
    assert isinstance(nested, triton.runtime.jit.JITFunction) and nested.fn.__qualname__ == "Ops.kern"
    assert nested.fn.__globals__ is vars(module) and precompile._jit_function(request) is fn
    # A module that is neither importable nor has a file to load: the import's own error.
    with pytest.raises(ModuleNotFoundError, match="zl_nowhere"):
        precompile._jit_function(precompile.Request("zl_nowhere", "kern", None, {}, {}, {}, {}, None))


def test_request_digest_tells_compiles_apart():
    # The digest names a compile's lock: one lock per compile, the same for the same compile however its
    # dicts were built, and a different one when any input of the compile differs.
    base = precompile.Request("m", "k", None, {"x": "*fp32", "n": "i32"}, {(2,): 16},
                              {(0,): [["tt.divisibility", 16]]}, {"num_warps": 4, "num_stages": 3}, ("cuda", 90))
    reordered = precompile.Request(**{**vars(base), "signature": {"n": "i32", "x": "*fp32"},
                                      "options": {"num_stages": 3, "num_warps": 4}})
    assert base.digest() == precompile.Request(**vars(base)).digest() == reordered.digest()
    assert base.digest() == precompile.Request(**{**vars(base), "path": "/elsewhere/m.py"}).digest()
    changes = {"module": "m2", "qualname": "k2", "signature": {"x": "*fp16", "n": "i32"}, "constants": {(2,): 32},
               "attrs": {}, "options": {"num_warps": 8, "num_stages": 3}, "target": ("cuda", 80)}
    digests = {name: precompile.Request(**{**vars(base), name: value}).digest() for name, value in changes.items()}
    assert len({base.digest(), *digests.values()}) == 1 + len(changes), digests
    assert all(len(d) == 32 and int(d, 16) >= 0 for d in digests.values())  # a file name


def test_a_libtuner_style_tuner_is_precompiled_too(patched):
    """FlagGems' LibTuner: an Autotuner subclass with its own run and a persistent (non-dict)
    config cache; the patch is installed on that class once its package is imported."""

    boundary = Boundary()
    p = patched(boundary)
    own_run = p.patch._originals[triton.runtime.Autotuner]  # its own sweep: not through the patched base

    class LibTuner(triton.runtime.Autotuner):
        def run(self, *args, **kwargs):
            return own_run(self, *args, **kwargs)

    p.patch.install(LibTuner)
    kernel = make_kernel()
    kernel.__class__ = LibTuner
    kernel.cache = PersistentCache()  # a sqlite-backed store, as far as the tuner can tell
    call(kernel, 100)
    assert sorted(boundary.compiled) == sorted((c.kwargs["BLOCK"], c.num_warps) for c in CONFIGS)


# Python 3.12 warns of any fork from a process with threads (this test process may have some).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("started", ["spawn", "fork"])
def test_the_precompiled_kernels_are_the_ones_the_jit_compiles_for_its_sweep(load_through_standin, tmp_path,
                                                                            monkeypatch, started):
    # Real requests, compiled for sm_90 by the real worker pool into an empty cache; then the sweep of
    # Triton's own autotuner, through the stand-in driver, must find every config there: same hashes,
    # nothing compiled anew (this process could not: Triton runs interpreted here). The pool either
    # spawned at the sweep, or forked before it (`start`, a record's child before it touches its device).
    cache = tmp_path / "triton_cache"
    tuned, driver = load_through_standin("tuned", cache)
    tuner = tuned.double_kernel
    args, kwargs = tuned.arguments(), {"grid": (16,)}
    pre = precompile.Precompiler(cpus=1)  # a pool of one, where the host (2 CPUs or more) would allow more
    try:
        if started == "fork":
            pre.start()
            early = list(pre.executor._processes)
            assert early and all(alive(pid) for pid in early)  # there before the sweep asks
        outcome = pre.run(tuner, args, kwargs)
        workers = list(pre.executor._processes)
        assert started == "spawn" or workers == early
        # Spawned at the sweep (the device may hold a context and threads by then), or forked before; deaf
        # to a terminal's Ctrl-C.
        assert pre.executor._mp_context.get_start_method() == pre.method == started
        # Asked for by name, not the platform's default (forkserver from Python 3.14 on Linux).
        assert pre.executor._mp_context is multiprocessing.get_context(started)
        assert pre.executor._initializer is precompile._worker_init
        assert pre.executor._max_workers == 1
    finally:
        pre.close()
    assert pre.executor is None and pre.workers == 1 and outcome.workers == 1
    assert workers and not any(alive(pid) for pid in workers)  # the pool leaves no process behind
    assert (outcome.configs, outcome.compiled, outcome.cached, outcome.failed, outcome.rejected) == (2, 2, 0, [], 0)
    precompiled = sorted(p.name for p in cache.iterdir())
    from triton import knobs

    def hook(**kwargs):  # another tool's hook, already there: it lets every compile through
        return None

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", hook)
    unknown = triton.Config({"BLOCK": 64, "UNKNOWN": 1})
    *requests, refused = precompile.capture(tuner, args, kwargs, [*tuner.configs, unknown])
    assert knobs.runtime.jit_cache_hook is hook  # put back
    assert isinstance(refused, KeyError) and "UNKNOWN" in str(refused)  # one config's failure, the others captured
    assert [r.constants for r in requests] == [{(3,): 64}, {(3,): 128}]
    assert [(r.options["num_warps"], r.options["num_stages"]) for r in requests] == [
        (c.num_warps, c.num_stages) for c in tuner.configs]
    assert {(r.module, r.qualname, r.path) for r in requests} == {("tuned", "double_kernel", tuned.__file__)}
    assert all(r.attrs and r.target == driver.target for r in requests)  # the pointers' divisibility specialization
    # Each compile took the lock of its own request, in the cache it compiled into.
    assert sorted(p.name for p in (cache / precompile.LOCK_DIR).iterdir()) == sorted(r.digest() for r in requests)
    hashes = [precompile.compile_request(r) for r in requests]  # cache hits: what the workers compiled
    tuned.launch()
    jit_kernels = list(tuner.fn.device_caches[0][0].values())
    assert sorted(k.hash for k in jit_kernels) == sorted(hashes) and len(set(hashes)) == 2
    assert sorted(p.name for p in cache.iterdir()) == precompiled
    launched = len(driver.launches)
    assert precompile.capture(tuner, args, kwargs, tuner.configs) == [None, None]  # compiled here now
    assert len(driver.launches) == launched  # and asking launched none of them
    # A later key of a kernel compiled here already: nothing to compile, so no pool is started.
    again = precompile.Precompiler(cpus=1)
    outcome = again.run(tuner, args, kwargs)
    assert (outcome.configs, outcome.compiled, outcome.cached, outcome.failed, outcome.workers) == (2, 0, 2, [], 0)
    assert again.executor is None and again.totals["cached"] == 2 and again.totals["compiled"] == 0
    assert len(driver.launches) == launched


def test_a_fallbacks_reason_is_the_errors_type_and_first_line_cut():
    assert precompile._first_line(ValueError("x" * 300 + "\nsecond")) == "ValueError: " + "x" * 200
    assert precompile._first_line(RuntimeError("  ")) == "RuntimeError"


@pytest.mark.parametrize("mode,touched,forked", [("record", False, True), ("record", True, False),
                                                 ("replay", False, False)])
def test_a_records_pool_is_forked_at_configure_only_while_its_device_is_untouched(tmp_path, monkeypatch, mode,
                                                                                  touched, forked):
    """Forked before any other plugin's configure (tryfirst) touches the device, for a record, which
    sweeps; a replay injects, and where the device is initialized already (FlagGems' conftest may
    do it) the pool is spawned at the first sweep instead."""
    started = []

    class Pool(precompile.Precompiler):
        def start(self):
            started.append(self)
            self.method = "fork"

    monkeypatch.setattr(autotune.precompile, "Precompiler", Pool)
    spec = types.SimpleNamespace(mode=mode, precompile=True, replay_from=str(tmp_path), op="op",
                                 preset_records=None, backend="cuda", token_timing=False)
    records = tmp_path / "autotune_records"
    records.mkdir()
    (records / "op.json").write_text('{"format": 1, "op": "op", "kernels": {}}')
    (tmp_path / "run.json").write_text("{}")
    backend = types.SimpleNamespace(name="cuda", compiles_kernels=True, triton_driver=True,
                                    device_touched=lambda: touched)
    ctx = types.SimpleNamespace(spec=spec, run_dir=tmp_path, backend=backend, say=[].append,
                                mark=lambda m: None, case_id="", configs={})
    plugin = autotune.AutotunePlugin(ctx)
    assert getattr(autotune.AutotunePlugin.pytest_configure, "pytest_impl", {}).get("tryfirst") is True
    plugin.pytest_configure(None)
    try:
        assert started == ([plugin.precompiler] if forked else [])
    finally:
        plugin.pytest_sessionfinish(None)
    facts = json.loads((tmp_path / "run.json").read_text())["observed"]["autotune"]["precompile"]
    assert facts["pool"] == ("fork" if forked else None)


def test_device_touched_is_torchs_flag_and_true_where_torch_cannot_say(monkeypatch):
    import torch

    cuda = backends.get("cuda")
    for flag in (False, True):
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda flag=flag: flag)
        assert cuda.device_touched() is flag
    assert backends.get("interpreter").device_touched() is True  # torch counts the CPU as initialized
    assert dataclasses.replace(cuda, torch_device_type="zl_none").device_touched() is True


def test_a_records_pool_is_forked_before_the_checkouts_conftest_initializes_its_device(tmp_path, monkeypatch):
    """FlagGems' benchmark conftest initializes the device at import: the pool is forked before pytest
    loads it (pytest_load_initial_conftests, tryfirst), not spawned at the first sweep."""
    started, touched = [], []

    class Pool(precompile.Precompiler):
        def start(self):
            started.append(list(touched))
            self.method = "fork"

    monkeypatch.setattr(autotune.precompile, "Precompiler", Pool)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "conftest.py").write_text("import builtins\nbuiltins.zl_touch()\n")  # the device, initialized
    (checkout / "test_op.py").write_text("def test_op():\n    pass\n")
    monkeypatch.setattr("builtins.zl_touch", lambda: touched.append("conftest"), raising=False)
    run_dir = tmp_path / "run"
    (run_dir / "autotune_records").mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    spec = types.SimpleNamespace(mode="record", precompile=True, replay_from=None, op="op", preset_records=None,
                                 backend="cuda", token_timing=False)
    backend = types.SimpleNamespace(name="cuda", compiles_kernels=True, triton_driver=True,
                                    device_touched=lambda: bool(touched))
    ctx = types.SimpleNamespace(spec=spec, run_dir=run_dir, backend=backend, say=[].append,
                                mark=lambda m: None, case_id="", configs={})
    plugin = autotune.AutotunePlugin(ctx)
    # A pytest session inside this one: its conftest must not stay this suite's `conftest` module, nor its dir
    # on sys.path, for the test files that come after on this worker.
    monkeypatch.setitem(sys.modules, "conftest", sys.modules["conftest"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = pytest.main([str(checkout), "-q", "-p", "no:cacheprovider", "--rootdir", str(checkout),
                        "--import-mode=importlib"], plugins=[plugin])
    assert code == 0 and touched == ["conftest"]
    assert started == [[]]  # once, and before the conftest ran
    facts = json.loads((run_dir / "run.json").read_text())["observed"]["autotune"]["precompile"]
    assert facts["pool"] == "fork" and facts["requests_written"] == 0  # no kernel compiled: none to hand on
    assert json.loads((run_dir / precompile.REQUESTS_FILE).read_text())["requests"] == []


def _record_requests(load_through_standin, tmp_path):
    """A record of `tuned` (its sweep compiles both configs into cache_a) through a RequestLog, its file written
    and read back: (the log, the requests, the recording process's option defaults)."""
    tuned, _ = load_through_standin("tuned", tmp_path / "cache_a")
    log = precompile.RequestLog()
    log.install()
    try:
        tuned.launch()
    finally:
        log.uninstall()
    log.write(tmp_path / precompile.REQUESTS_FILE)
    return (log, *precompile.read_requests(tmp_path / precompile.REQUESTS_FILE))


def _cache_files(cache_dir) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir() if p.name != precompile.LOCK_DIR)


def _passes_step_ahead(tuned, requests, defaults, cache_dir):
    """The other side's passes step: its pool compiles the requests into `cache_dir` ahead, then its JIT launches
    `tuned` with the Ahead hook in place: (the Ahead, the pool's kernel hashes, the cache's files before the
    launch)."""
    pool = precompile.Precompiler(cpus=1)
    ahead = precompile.Ahead(pool, requests, defaults)
    try:
        pool.start()
        ahead.start()
        hashes = [future.result(timeout=120) for future in ahead.futures.values()]
        before_launch = _cache_files(cache_dir)
        ahead.install()
        try:
            tuned.launch()
        finally:
            ahead.uninstall()
    finally:
        pool.close()
    return ahead, hashes, before_launch


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_the_other_sides_passes_step_compiles_the_records_requests_ahead_and_its_jit_reads_them(
        load_through_standin, tmp_path):
    """A record writes every compile its JIT asked for; a passes step replaying it compiles them over its pool
    into its own (empty) cache before its rows, and its JIT then finds each there: the same kernels, nothing
    compiled anew, each JIT compile that came to one counted."""
    log, requests, defaults = _record_requests(load_through_standin, tmp_path)
    assert len(requests) == 2 and log.errors == {} and defaults["enable_fp_fusion"] is True
    assert [r.digest() for r in requests] == list(log.requests)  # read back as the compiles they were
    assert [(r.options["num_warps"], r.constants) for r in requests] == [(4, {(3,): 64}), (8, {(3,): 128})]
    compiled_a = sorted(p.name for p in (tmp_path / "cache_a").iterdir())

    tuned, _ = load_through_standin("tuned", tmp_path / "cache_b")  # the other side: its own JIT, its own cache
    ahead, hashes, compiled_b = _passes_step_ahead(tuned, requests, defaults, tmp_path / "cache_b")
    assert compiled_b == [name for name in compiled_a if name != precompile.LOCK_DIR]  # the same compiles
    jit = sorted(k.hash for k in tuned.double_kernel.fn.device_caches[0][0].values())
    assert jit == sorted(hashes)
    assert _cache_files(tmp_path / "cache_b") == compiled_b
    assert ahead.facts() == {"requests": 2, "ready": 2, "waited": 0, "taken_over": 0, "failed": 0, "waited_s": 0.0,
                             "unmatched": 0}


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_kernel_generated_into_a_file_kept_out_of_sys_modules_is_compiled_ahead_with_what_its_loader_set(
        load_through_standin, tmp_path):
    """FlagGems' generated pointwise kernels: their module is loaded from its file, not registered, and its
    loader then puts the scalar JIT function the kernel calls in its globals. The request names the file and
    that link (the function, one attribute below the decorator's object its module holds), so a worker loads
    the file and links it as the loader did: the pool compiles the kernel the JIT then finds ready. (On an
    H100, 6 of acosh_'s 7 compiles failed in the pool: no module named '_gen_module_..._rank_1'.)"""
    built = []  # the generated modules, outside what the fixture releases: their kernels released here

    def build(generated):
        built.append(generated.build(tmp_path))
        return built[-1]

    try:
        generated, _ = load_through_standin("generated", tmp_path / "cache_a")
        log = precompile.RequestLog()
        log.install()
        try:
            generated.launch(build(generated))
        finally:
            log.uninstall()
        log.write(tmp_path / precompile.REQUESTS_FILE)
        (request,), defaults = precompile.read_requests(tmp_path / precompile.REQUESTS_FILE)
        assert (request.module, request.qualname) == ("_zl_gen_module_rank_1", "triple_kernel")
        assert request.path == str(tmp_path / "zl_generated_rank_1.py") and "_zl_gen_module_rank_1" not in sys.modules
        assert request.links == (("triple", "generated", "triple._scalar_fn"),)  # tl, triton: the file imports them

        generated, _ = load_through_standin("generated", tmp_path / "cache_b")  # the other side, its own JIT
        module = build(generated)
        ahead, hashes, compiled = _passes_step_ahead(types.SimpleNamespace(launch=lambda: generated.launch(module)),
                                                     [request], defaults, tmp_path / "cache_b")
        assert ahead.facts() == {"requests": 1, "ready": 1, "waited": 0, "taken_over": 0, "failed": 0,
                                 "waited_s": 0.0, "unmatched": 0}
        jit = [k.hash for k in module.triple_kernel.device_caches[0][0].values()]
        assert jit == hashes and _cache_files(tmp_path / "cache_b") == compiled  # nothing compiled anew
    finally:
        # While the stand-in driver is active (a CompiledKernel unloads from it as it goes), and so that no
        # later test's compiled-kernel scan finds them.
        for module in built:
            module.triple_kernel.device_caches.clear()
        built.clear()
        gc.collect()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_side_whose_env_sets_another_default_option_compiles_the_records_requests_under_its_own(
        load_through_standin, tmp_path, monkeypatch):
    """The record compiled with fp fusion on (its env's default); the other side's env turns it off, so its
    JIT asks for every compile with enable_fp_fusion=False. The record's defaults, written beside its
    requests, let that side put its own in their place: its pool compiles what its JIT then finds ready."""
    _, requests, defaults = _record_requests(load_through_standin, tmp_path)
    assert [r.options["enable_fp_fusion"] for r in requests] == [True, True]

    tuned, _ = load_through_standin("tuned", tmp_path / "cache_b")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # after the loader, which sets the suite's 1
    ahead, hashes, _ = _passes_step_ahead(tuned, requests, defaults, tmp_path / "cache_b")
    assert [r.options["enable_fp_fusion"] for r in ahead.requests] == [False, False]
    jit = sorted(k.hash for k in tuned.double_kernel.fn.device_caches[0][0].values())
    assert jit == sorted(hashes)  # the pool's compiles are the JIT's
    assert ahead.facts() == {"requests": 2, "ready": 2, "waited": 0, "taken_over": 0, "failed": 0, "waited_s": 0.0,
                             "unmatched": 0, "translated": {"enable_fp_fusion": 2}}
    # Without the record's defaults (an older record), nothing is translated and nothing matches.
    held = Held()
    requests_only = precompile.Ahead(precompile.Precompiler(cpus=1, executor_factory=lambda w, m: held), requests)
    requests_only.start()
    assert requests_only.requests == requests and requests_only.translated == {} and len(held.futures) == 2


def test_translate_moves_only_options_left_at_the_recorders_default_where_the_defaults_differ():
    base = precompile.Request("m", "k", None, {}, {}, {}, {"num_warps": 4, "enable_fp_fusion": True,
                                                          "default_dot_input_precision": "tf32"}, None)
    explicit = dataclasses.replace(base, options={**base.options, "enable_fp_fusion": False})
    recorded = {"num_warps": 4, "enable_fp_fusion": True, "default_dot_input_precision": "tf32"}
    own = {"num_warps": 4, "enable_fp_fusion": False, "default_dot_input_precision": "ieee"}
    out, counts = precompile.translate([base, explicit], recorded, own)
    assert out[0].options == {"num_warps": 4, "enable_fp_fusion": False, "default_dot_input_precision": "ieee"}
    # A compile whose kernel set the option away from the recorder's default keeps it.
    assert out[1].options == {"num_warps": 4, "enable_fp_fusion": False, "default_dot_input_precision": "ieee"}
    assert counts == {"enable_fp_fusion": 1, "default_dot_input_precision": 2}
    assert precompile.translate([base], recorded, recorded) == ([base], {})  # same defaults: as recorded


class Held(concurrent.futures.Executor):
    """A pool whose compiles have not started: each future pending until the test says."""

    def __init__(self):
        self.futures = []

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        self.futures.append((future, fn, args))
        return future


def test_a_request_still_queued_is_taken_over_by_the_jit_and_one_compiling_is_waited_for(tmp_path):
    requests = [precompile.Request("m", f"k{i}", None, {"x": "i32"}, {(1,): i}, {}, {"num_warps": 4}, None)
                for i in range(3)]
    pool = precompile.Precompiler(cpus=2, compile_fn=lambda r: r.qualname, executor_factory=lambda w, m: held)
    held = Held()
    ahead = precompile.Ahead(pool, requests)
    ahead.start()
    (queued, *_), (running, *_), (done, fn, args) = held.futures
    assert running.set_running_or_notify_cancel()
    done.set_running_or_notify_cancel()
    done.set_result(fn(*args))
    ahead._request = lambda kw: kw["request"]  # what the JIT asks for, as the hook would read it
    ahead._seen({"request": requests[0]})
    assert queued.cancelled()  # the JIT compiles it itself, now: it waits behind nothing
    threading.Timer(0.05, lambda: running.set_exception(RuntimeError("ptxas died"))).start()
    ahead._seen({"request": requests[1]})  # the worker's compile under way: waited for, then the JIT's own
    ahead._seen({"request": requests[2]})
    ahead._seen({"request": precompile.Request("m", "other", None, {}, {}, {}, {}, None)})  # not the record's
    ahead._seen({"request": dataclasses.replace(requests[2], options={"num_warps": 8})})  # its options differ
    ahead._hook(request=None)  # what a hook we misread raises is counted, and the JIT goes on
    counts = ahead.facts()
    assert counts.pop("waited_s") > 0
    assert counts == {"requests": 3, "ready": 1, "waited": 1, "taken_over": 1, "failed": 1, "unmatched": 2,
                      "differs": {"kernel": 1, "options": 1}, "failures": {"RuntimeError: ptxas died": 1},
                      "errors": {"AttributeError": 1}}


def test_a_request_round_trips_through_json_and_one_without_a_json_form_is_refused():
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    request = precompile.Request("m", "k", "/p/m.py", {"x_ptr": "*fp16", "t": ("i32", "i32")},
                                 {(3,): 64, (4,): tl.float16, (5,): (1, None)}, {(0,): [["tt.divisibility", 16]]},
                                 {"num_warps": 8, "extern_libs": (("libdevice", "/x.bc"),), "debug": False},
                                 GPUTarget("cuda", 90, 32))
    back = precompile.Request.from_json(json.loads(json.dumps(request.to_json())))
    assert back == request and back.digest() == request.digest()
    with pytest.raises(precompile.NotPersistable):
        dataclasses.replace(request, constants={(3,): object()}).to_json()
    assert precompile.read_requests(Path("/nonexistent")) == ([], {})


@pytest.mark.parametrize("token_timing", [True, False])
def test_only_a_passes_step_replaying_a_record_with_requests_compiles_them_ahead(tmp_path, monkeypatch, token_timing):
    """A token-timed replay (the other side's passes step) starts its record's compiles before pytest loads
    any conftest; a timed replay leaves its CPUs to its rows; a record writes its own compiles."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    started = []

    class Pool(precompile.Precompiler):
        def start(self):
            started.append(self)
            self.workers, self.method, self.executor = 2, "fork", Held()

    monkeypatch.setattr(autotune.precompile, "Precompiler", Pool)
    record = tmp_path / "record"
    (record / "autotune_records").mkdir(parents=True)
    (record / "autotune_records" / "op.json").write_text('{"format": 1, "op": "op", "kernels": {}}')
    request = precompile.Request("m", "k", None, {"x": "i32"}, {}, {}, {"num_warps": 4}, GPUTarget("cuda", 90, 32))
    (record / precompile.REQUESTS_FILE).write_text(json.dumps({"format": precompile.REQUESTS_FORMAT,
                                                                "requests": [request.to_json()]}))
    (tmp_path / "run.json").write_text("{}")
    said = []
    spec = types.SimpleNamespace(mode="replay", precompile=True, replay_from=str(record), op="op",
                                 preset_records=None, backend="cuda", token_timing=token_timing)
    backend = types.SimpleNamespace(name="cuda", compiles_kernels=True, triton_driver=True,
                                    device_touched=lambda: False)
    ctx = types.SimpleNamespace(spec=spec, run_dir=tmp_path, backend=backend, say=said.append,
                                mark=lambda m: None, case_id="", configs={})
    before = knobs.runtime.jit_cache_hook
    plugin = autotune.AutotunePlugin(ctx)
    plugin.pytest_load_initial_conftests(None, None, [])
    plugin.pytest_configure(None)
    assert (knobs.runtime.jit_cache_hook is not before) is token_timing
    plugin.pytest_sessionfinish(None)
    assert knobs.runtime.jit_cache_hook is before
    facts = json.loads((tmp_path / "run.json").read_text())["observed"]["autotune"]["precompile"]
    if token_timing:
        assert started == [plugin.precompiler] and plugin.precompiler.executor is None  # closed
        assert facts["ahead"]["requests"] == 1 and facts["pool"] == "fork"
        assert said == ["precompile: the record's 1 compiles started ahead of the rows over 2 processes (fork)"]
    else:
        assert started == [] and "ahead" not in facts and said == []
    assert not (tmp_path / precompile.REQUESTS_FILE).exists()  # a replay writes none
