"""IR naming rules on synthetic variant tables, and the dump path on kernels really compiled for a
Hopper target on the CPU (Triton compiles for an explicit GPUTarget without a GPU)."""

import dataclasses
import importlib
import os
import subprocess
import sys
import threading
import types

import pytest
from conftest import REPO, load

import backends
from harness.child.plugins import ir as ir_plugin_module
from harness.child.plugins.ir import IRPlugin
from harness.core import ir_index, rundir
from harness.core.spec import ONLY, RunSpec
from harness.measure import ir
from harness.measure.ir import Variant

KERNELS = REPO / "tests" / "resources" / "ir_kernels"


def var(h, dtype="bf16", align="nodiv", w=4, s=3, **constexprs):
    return Variant(kernel="m.k", hash=h, constexprs=tuple(sorted(constexprs.items())), num_warps=w,
                   num_stages=s, dtype=dtype, align=align)


@pytest.mark.parametrize("name,short", [("BLOCK_SIZE_M", "BSM"), ("blockSizeM", "BSM"), ("BLOCK_M", "BM"),
                                        ("BLOCK", "BLOCK"), ("EVEN_K", "EK"), ("num_stages", "NS")])
def test_abbreviate(name, short):
    assert ir.abbreviate(name) == short


def test_clashing_abbreviations_keep_full_names():
    assert ir.abbreviations(["BLOCK_M", "BATCH_M", "GROUP_SIZE"]) == {
        "BLOCK_M": "BLOCK_M", "BATCH_M": "BATCH_M", "GROUP_SIZE": "GS"}
    # An abbreviation equal to another parameter's full name would read as that parameter.
    assert ir.abbreviations(["BLOCK_M", "BM"]) == {"BLOCK_M": "BLOCK_M", "BM": "BM"}


def test_only_varying_constexprs_enter_the_name():
    group = [var("a" * 8, BLOCK_M=64, GROUP_M=8), var("b" * 8, BLOCK_M=128, GROUP_M=8, w=8)]
    assert ir.name_variants(group) == {"a" * 8: "BM64_w4s3", "b" * 8: "BM128_w8s3"}


def test_collisions_resolve_by_dtype_then_alignment_then_hash():
    by_dtype = [var("h1", dtype="bf16"), var("h2", dtype="fp16")]
    assert ir.name_variants(by_dtype) == {"h1": "w4s3__bf16", "h2": "w4s3__fp16"}
    by_align = [var("h1", align="div16-A"), var("h2", align="nodiv")]
    assert ir.name_variants(by_align) == {"h1": "w4s3__div16-A", "h2": "w4s3__nodiv"}
    by_hash = [var("1234567890"), var("abcdefabcd")]
    assert ir.name_variants(by_hash) == {"1234567890": "w4s3__12345678", "abcdefabcd": "w4s3__abcdefab"}
    mixed = [var("h1", dtype="bf16"), var("h2", dtype="bf16", align="div16-A"), var("h3", dtype="fp16")]
    assert ir.name_variants(mixed) == {"h1": "w4s3__bf16__nodiv", "h2": "w4s3__bf16__div16-A", "h3": "w4s3__fp16"}


def test_names_are_unique_for_any_group():
    group = [var(f"{i:08d}", dtype=d, BLOCK=b) for i, (d, b) in enumerate(
        [("bf16", 16), ("bf16", 16), ("fp16", 16), ("fp16", 32), ("bf16", 32)])]
    names = ir.name_variants(group)
    assert len(set(names.values())) == len(group)


@pytest.fixture
def hopper_kernels(monkeypatch, tmp_path):
    """Two configs x two dtypes of a kernel, compiled for sm_90 on this CPU, into a cache dir of
    this test's own: a fresh process compiles (see resources/ir_kernels/hopper.py), this one loads."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton_cache"), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, str(KERNELS / "hopper.py")], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        # Only a Triton build without the CUDA backend's tools (ptxas) cannot do this.
        assert "ptxas" in proc.stderr or "FileNotFoundError" in proc.stderr, proc.stderr
        pytest.skip(f"cannot compile for sm_90 here: {proc.stderr.strip().splitlines()[-1]}")
    for key in ("TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # so triton.jit builds a JITFunction, as in the compiling process
    monkeypatch.syspath_prepend(str(KERNELS))
    monkeypatch.delitem(sys.modules, "hopper", raising=False)
    hopper = importlib.import_module("hopper")
    monkeypatch.delitem(sys.modules, "hopper")
    return hopper.compile_all()


def launch(collector, handle):
    """A launch as Triton reports it: a LazyDict holding name, function and stream."""
    from triton.compiler.compiler import LazyDict

    collector.on_launch(LazyDict({"name": "k", "function": handle, "stream": 0}))


def test_dump_writes_used_variants_index_and_legend(hopper_kernels, tmp_path):
    collector = ir.IRCollector(tmp_path)
    # Stand-ins for loaded function handles (a GPU would set them on first launch).
    for i, ck in enumerate(hopper_kernels):
        ck.function = 1000 + i
    collector.shape = "4096x4096"
    for i in range(3):  # 64-wide bf16 and fp16, 128-wide bf16 launched; 128-wide fp16 only compiled
        launch(collector, 1000 + i)
    collector.sweeping = 1
    launch(collector, 1003)  # a sweep launch is not a use
    collector.write()

    kdir = tmp_path / "ttgir" / "4096x4096" / "scale_kernel"
    files = sorted(p.name for p in kdir.iterdir())
    assert files == ["BSM128_w4s3.ttgir", "BSM64_w4s3__bf16.ttgir", "BSM64_w4s3__fp16.ttgir"]
    assert "ttg." in (kdir / "BSM128_w4s3.ttgir").read_text()
    rows = ir_index.read_index(tmp_path)
    assert len(rows) == 4
    unlaunched = [r for r in rows if r["file"] == "-"]
    assert len(unlaunched) == 1 and unlaunched[0]["launches"] == "0"
    assert all(r["ttgir_sha"] != "-" and r["ptx_sha"] != "-" for r in rows)
    assert "| BSM | BLOCK_SIZE_M |" in (tmp_path / "ttgir" / "naming.md").read_text()
    # Statistics of the launched variants only (a sweep loser's would cost a disassembly each).
    stats = ir_index.read_stats(tmp_path)
    assert set(stats) == {r["hash"] for r in rows if r["file"] != "-"}
    for record in stats.values():
        assert record["warps"] == 4 and record["global load widths"] != ir_index.NOT_AVAILABLE
        assert record["instructions from"] == ("sass" if collector.tools["cuobjdump"] else "ptx")
    assert collector.unreadable == 0
    collector.sweeping = 0
    collector.on_launch(object())  # metadata of an unknown shape is counted as unreadable, not guessed
    assert collector.unreadable == 1


def two_variants_launched(hopper_kernels, tmp_path, monkeypatch, extract, background):
    """A collector whose case launched two variants, their statistics extracted by `extract`."""
    monkeypatch.setattr(ir.kernel_stats, "extract", extract)
    collector = ir.IRCollector(tmp_path, background_stats=background)
    hopper_kernels[0].function, hopper_kernels[1].function = 4000, 4001
    collector.shape = "64"
    launch(collector, 4000)
    launch(collector, 4001)
    return collector


@pytest.mark.parametrize("background", [False, True])
def test_a_cases_statistics_are_waited_for_unless_they_may_run_beside_the_next_cases(
        hopper_kernels, tmp_path, monkeypatch, background):
    release, started = threading.Event(), []

    def extract(asm, meta, tools, limits, loaded):  # a disassembly that takes until released
        started.append(threading.current_thread().name)
        release.wait(30)
        return {"warps": meta["num_warps"]}

    collector = two_variants_launched(hopper_kernels, tmp_path, monkeypatch, extract, background)
    if not background:  # a case's write waits for its variants' statistics, extracted at once
        threading.Timer(0.5, release.set).start()
        collector.write(final=False)
        assert len(ir_index.read_stats(tmp_path)) == 2 and len(started) == 2
        assert all(name.startswith("zl_kernel_stats") for name in started)
        return
    collector.write(final=False)  # returns while both are still being extracted: written without them
    assert ir_index.read_stats(tmp_path) == {} and len(ir_index.launched(tmp_path)) == 2
    release.set()
    collector.write()  # the final write waits for every launched variant's
    assert {r["warps"] for r in ir_index.read_stats(tmp_path).values()} == {4} and len(started) == 2


@pytest.mark.parametrize("background", [False, True])
def test_more_statistics_are_extracted_at_once_where_the_timings_are_for_no_comparison(
        hopper_kernels, tmp_path, monkeypatch, background):
    monkeypatch.setattr(ir, "STATS_THREADS", 1)
    monkeypatch.setattr(ir, "BACKGROUND_STATS_THREADS", 2)
    lock, running, most, second = threading.Lock(), [0], [0], threading.Event()

    def extract(asm, meta, tools, limits, loaded):  # the first waits for a second to start beside it
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            if running[0] == 2:
                second.set()
        second.wait(30 if background else 1)
        with lock:
            running[0] -= 1
        return {"warps": meta["num_warps"]}

    collector = two_variants_launched(hopper_kernels, tmp_path, monkeypatch, extract, background)
    collector.write()
    assert most[0] == (2 if background else 1) and len(ir_index.read_stats(tmp_path)) == 2


def test_statistics_that_cannot_be_read_are_said_and_the_ir_is_still_written(hopper_kernels, tmp_path):
    collector = ir.IRCollector(tmp_path, limits={"regs_per_sm": 65536})  # a device limit missing
    hopper_kernels[0].function = 3000
    collector.shape = "64"
    launch(collector, 3000)
    collector.write()
    [record] = ir_index.read_stats(tmp_path).values()
    if collector.tools["cuobjdump"]:  # registers known: the occupancy bound reads every limit
        assert record == {"stats error": "KeyError: 'threads_per_sm'"}
    assert len(ir_index.launched(tmp_path)) == 1


def test_compare_reports_identical_changed_and_only_in_one(hopper_kernels, tmp_path):
    def run(name, launched, tamper=None):
        collector = ir.IRCollector(tmp_path / name)
        (tmp_path / name).mkdir()
        for i, ck in enumerate(hopper_kernels):
            ck.function = 2000 + i
        collector.shape = "64"
        for i in launched:
            launch(collector, 2000 + i)
        collector.write()
        if tamper:
            index = tmp_path / name / "ttgir" / "index.tsv"
            index.write_text(index.read_text().replace(tamper[0], tamper[1]))
        return tmp_path / name

    a = run("a", [0, 1])
    llir = ir_index.read_index(a)[0]["llir_sha"]
    b = run("b", [0, 1, 2], tamper=(llir, "0" * 16))
    rows = ir.compare(a, b)
    assert sorted(r["status"] for r in rows) == ["changed", "identical", "only_in_b"]
    changed = next(r for r in rows if r["status"] == "changed")
    assert changed["stages"] == "llir"
    # Matched by parameters although b renamed the file (a dtype collision appeared in b).
    pairs = {(r["file_a"], r["file_b"]) for r in rows}
    assert ("64/scale_kernel/BSM64_w4s3.ttgir", "64/scale_kernel/BSM64_w4s3__bf16.ttgir") in pairs


# --- the live plugin: Triton's own autotuner and launch path, through a stand-in driver ---------------
@pytest.fixture
def live_plugin(monkeypatch, tmp_path, load_through_standin, request):
    """The IR plugin configured on cuda against the real launch hook and autotuner (both put back
    after the test), and the tuned kernel of resources/ir_kernels/tuned.py compiled for sm_90; for a
    passes-only run where the test's param says so."""
    from triton import knobs
    from triton.knobs import HookChain
    from triton.runtime.autotuner import Autotuner

    tuned, driver = load_through_standin("tuned")
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", HookChain())
    monkeypatch.setattr(Autotuner, "_bench", Autotuner._bench)
    said = []
    spec = RunSpec("tuned", "cuda", "replay", 0, ["fp32"], "default", only=getattr(request, "param", None))
    # The device's occupancy limits, as the cuda backend reads them on a GPU (None on this CPU host).
    backend = dataclasses.replace(backends.get("cuda"), occupancy_limits=lambda: dict(H200_LIMITS))
    ctx = types.SimpleNamespace(spec=spec, backend=backend, run_dir=tmp_path, say=said.append)
    monkeypatch.setattr(ir_plugin_module, "atexit", ExitHooks())
    plugin = IRPlugin(ctx)
    plugin.pytest_configure(None)
    assert ir_plugin_module.atexit.hooks == [plugin.collector.write]  # a crash in a later case still writes the IR
    # Added to Triton's own chain of launch hooks, which stays a chain (other tools add theirs to it).
    assert knobs.runtime.launch_enter_hook.calls == [plugin.collector.on_launch]
    yield plugin, tuned, driver, said


@pytest.mark.parametrize("live_plugin", [None, "passes"], indirect=True, ids=["timed", "passes-only"])
def test_only_a_passes_only_run_extracts_statistics_beside_its_next_cases(live_plugin, request):
    plugin = live_plugin[0]
    assert plugin.collector.background_stats is ("passes-only" in request.node.name)
    finals = []
    plugin.collector.write = lambda final=True: finals.append(final)
    plugin.pytest_runtest_teardown(None)  # a case's write: what is still extracting is not waited for here
    assert finals == [False]


H200_LIMITS = {"regs_per_sm": 65536, "threads_per_sm": 2048, "smem_per_sm": 233472}


class ExitHooks:
    """Stands in for atexit in the plugin's module: what is registered now (atexit itself cannot say:
    its count keeps an unregistered hook's slot)."""

    def __init__(self):
        self.hooks = []

    def register(self, fn):
        self.hooks.append(fn)

    def unregister(self, fn):
        self.hooks = [h for h in self.hooks if h != fn]


def exit_hooks_left(plugin) -> int:
    """The exit-time writes still registered once the session finished."""
    return sum(1 for h in ir_plugin_module.atexit.hooks if h == plugin.collector.write)


def test_a_launch_inside_an_autotune_sweep_is_not_counted_and_one_outside_it_is(live_plugin, tmp_path):
    plugin, tuned, driver, said = live_plugin
    assert plugin.collector is not None and said == []
    assert load(tmp_path / "run.json")["observed"]["ir"] == {"collected": True,
                                                            "reason": "launch hook + compiled-kernel scan"}
    plugin.pytest_zl_case_started("fp32-1024", "1024")
    tuned.launch()  # the sweep launches both configs, then the winner runs once
    chosen = driver.launches[-1]
    assert set(driver.launches) == set(driver.loaded) and len(driver.loaded) == 2
    assert dict(plugin.collector.launches) == {("1024", chosen): 1}
    plugin.pytest_runtest_teardown(None)
    tuned.launch()  # the key is tuned: no sweep, one launch
    assert dict(plugin.collector.launches) == {("1024", chosen): 2}
    plugin.pytest_sessionfinish(None)
    rows = {r["launches"]: r for r in ir_index.read_index(tmp_path)}
    (block,) = [v.params["BLOCK"] for h, v in plugin.collector.variants.items()
                if plugin.collector.handle_to_hash[chosen] == h]
    assert block == tuned.double_kernel.best_config.kwargs["BLOCK"]
    assert set(rows) == {"2", "0"} and rows["0"]["file"] == "-"  # the sweep's loser: compiled, never used
    (written,) = (tmp_path / "ttgir" / "1024" / "double_kernel").iterdir()
    assert "ttg." in written.read_text()
    observed = load(tmp_path / "run.json")["observed"]["ir"]
    # What the kernel statistics could use: the tools found, the device's limits.
    assert observed.pop("kernel_stats") == {"tools": ir.kernel_stats.find_tools(), "occupancy_limits": H200_LIMITS}
    assert observed == {
        "collected": True, "reason": "launch hook + compiled-kernel scan", "variants_compiled": 2,
        "files_written": 1, "unreadable_launches": 0}
    assert said == [f"IR: 2 variants compiled, 1 launched variant files under {tmp_path / 'ttgir'}"]
    assert exit_hooks_left(plugin) == 0  # the exit-time dump is for crashes only


def ir_plugin(tmp_path, ir_on=True, backend="cuda", only=None):
    said = []
    ctx = types.SimpleNamespace(spec=RunSpec("add", backend, "record", 0, ["fp32"], "default", ir=ir_on, only=only),
                                backend=backends.get(backend),
                                run_dir=tmp_path, say=said.append)
    return IRPlugin(ctx), said


@pytest.mark.parametrize(("ir_on", "backend", "only", "reason"), [
    (False, "cuda", None, "turned off (--no-ir)"),
    (True, "cuda", "timing", "a timing-only run (--timing-only)"),
    (True, "cuda", "configs", "a configs-only run (--configs-only)"),
    (True, "interpreter", None, "backend 'interpreter' compiles no kernels"),
])
def test_a_run_without_ir_says_why_and_collects_nothing(tmp_path, ir_on, backend, only, reason):
    plugin, said = ir_plugin(tmp_path, ir_on, backend, only)
    plugin.pytest_configure(None)
    assert plugin.collector is None and said == [f"IR collection off: {reason}"]
    assert load(tmp_path / "run.json")["observed"]["ir"] == {"collected": False, "reason": reason}
    plugin.pytest_zl_case_started("fp32-8", "8")
    plugin.pytest_runtest_teardown(None)
    plugin.pytest_sessionfinish(None)
    assert not (tmp_path / "ttgir").exists() and said == [f"IR collection off: {reason}"]


def test_the_launch_hook_is_installed_on_every_triton_that_has_one(monkeypatch):
    from harness.child.plugins.ir import _install_launch_hook

    seen = []
    runtime = types.SimpleNamespace(launch_enter_hook=None)  # a Triton before the HookChain (3.4)
    monkeypatch.setattr("triton.knobs.runtime", runtime)
    assert _install_launch_hook(seen.append) is None and runtime.launch_enter_hook == seen.append
    runtime.launch_enter_hook = lambda metadata: seen.append(("earlier hook", metadata))
    assert _install_launch_hook(seen.append) is None
    runtime.launch_enter_hook("m")  # the hook found there still runs, first
    assert seen == [("earlier hook", "m"), "m"]
    monkeypatch.setattr("triton.knobs.runtime", types.SimpleNamespace())
    assert _install_launch_hook(seen.append) == "this Triton has no knobs.runtime.launch_enter_hook"
    import triton

    monkeypatch.delattr(triton, "knobs")
    monkeypatch.setitem(sys.modules, "triton.knobs", None)
    assert _install_launch_hook(seen.append) == "this Triton has no triton.knobs (launch hooks arrived in Triton 3.4)"


def test_a_plugin_whose_hook_cannot_be_installed_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr("triton.knobs.runtime", types.SimpleNamespace())
    plugin, said = ir_plugin(tmp_path)
    plugin.pytest_configure(None)
    assert plugin.collector is None
    assert said == ["IR collection off: this Triton has no knobs.runtime.launch_enter_hook"]


def test_a_case_without_a_shape_files_no_ir_under_a_new_one(tmp_path):
    plugin, _ = ir_plugin(tmp_path)
    plugin.collector = ir.IRCollector(tmp_path)
    plugin.pytest_zl_case_started("fp32-8", "8")
    plugin.pytest_zl_case_started("test_mm", None)  # not one of our cases
    assert plugin.collector.shape == "8"


def test_unreadable_launches_are_counted_and_said(live_plugin, tmp_path):
    plugin, tuned, driver, said = live_plugin
    plugin.collector.on_launch(object())
    plugin.pytest_sessionfinish(None)
    assert said[-1] == "IR: 1 launches had unreadable metadata and were not counted"
    assert load(tmp_path / "run.json")["observed"]["ir"]["unreadable_launches"] == 1


@pytest.mark.parametrize("only", ["timing", "configs"])
def test_compare_ir_of_an_ab_step_without_ir_points_to_the_run_that_has_it(tmp_path, capsys, only):
    """An A/B's repeat (timing-only) or its record (configs-only)."""
    from harness import cli

    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        rundir.merge_json(tmp_path / side / rundir.RUN_JSON, {"observed": {"ir": {"collected": False,
                                                                                  "reason": ONLY[only]}}})
    assert cli.main(["compare-ir", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'a'} has no ttgir/index.tsv ({ONLY[only]}: an A/B collects IR in "
        "A's record and B's passes step (A-record and B-passes; a bisect probe in A-passes and B-passes))\n")
