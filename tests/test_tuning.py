"""Record/replay mechanics in-process, on kernels run by Triton's interpreter."""

import json
import math
import re
import types

import pytest
import torch
import triton
import triton.language as tl
from conftest import PersistentCache

from harness.measure import tuning

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


def make_kernel(configs=CONFIGS):
    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    vars(double)["do_bench"] = tuning.host_bench  # no Triton driver under the interpreter
    return double


def call(kernel, n):
    x = torch.arange(n, dtype=torch.float32)
    out = torch.empty_like(x)
    kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    assert torch.equal(out, x * 2)


@pytest.fixture
def patched(tmp_path):
    made = []

    def make(mode, records=None):
        marks, chosen = [], {}
        store = tuning.RecordStore(tmp_path / "op.json", "op") if mode == "record" else None
        patch = tuning.AutotunePatch(mode, store=store, records=records, mark=marks.append,
                                     chosen=chosen.__setitem__, case=lambda: "case", host_autotune=True)
        patch.install()
        made.append(patch)
        return patch, marks, chosen

    yield make
    for patch in made:
        patch.uninstall()


def only_key(kernel):
    (key,) = dict.keys(kernel.cache)
    return key


def test_record_reads_back_the_chosen_config_per_key(patched):
    kernel = make_kernel()
    patch, marks, chosen = patched("record")
    call(kernel, 40)
    call(kernel, 100)
    entries = patch.store.data["kernels"][tuning.kernel_id(kernel)]
    assert len(entries) == 2
    for key, config in dict.items(kernel.cache):
        assert entries[tuning.key_str(key)]["config"] == tuning.config_to_json(config)
    assert patch.counts["recorded"] == 2 and marks == []
    assert tuning.kernel_id(kernel) in chosen


def test_record_with_a_warm_cache_still_records(patched):
    kernel = make_kernel()
    call(kernel, 40)  # unpatched: fills the cache like a warm persistent cache would
    key = only_key(kernel)
    dict.__setitem__(kernel.cache, key, CONFIGS[5])
    patch, _, _ = patched("record")
    call(kernel, 40)
    entry = patch.store.data["kernels"][tuning.kernel_id(kernel)][tuning.key_str(key)]
    assert entry["config"] == tuning.config_to_json(CONFIGS[5])


def test_record_file_is_on_disk_after_each_choice(patched, tmp_path):
    kernel = make_kernel()
    patched("record")
    call(kernel, 40)
    on_disk = tuning.load_records(tmp_path / "op.json")
    assert len(on_disk["kernels"][tuning.kernel_id(kernel)]) == 1


def records_for(kernel, key, config_json):
    return {"format": 1, "kernels": {tuning.kernel_id(kernel): {tuning.key_str(key): {"config": config_json}}}}


def test_replay_injects_even_over_a_warm_cache(patched):
    kernel = make_kernel()
    call(kernel, 40)
    key = only_key(kernel)
    dict.__setitem__(kernel.cache, key, CONFIGS[0])
    patch, marks, _ = patched("replay", records_for(kernel, key, tuning.config_to_json(CONFIGS[3])))
    call(kernel, 40)
    assert kernel.best_config is CONFIGS[3]
    assert patch.counts["injected"] == 1 and marks == []


def test_replay_injects_before_any_sweep(patched, monkeypatch):
    kernel = make_kernel()
    call(kernel, 40)
    key = only_key(kernel)
    fresh = make_kernel()
    monkeypatch.setattr(fresh, "_bench", lambda *a, **k: pytest.fail("replay must not sweep"))
    records = records_for(fresh, key, tuning.config_to_json(CONFIGS[4]))
    patched("replay", records)
    call(fresh, 40)
    assert fresh.best_config is CONFIGS[4]


def test_replay_key_missing_sweeps_live_loudly(patched):
    kernel = make_kernel()
    patch, marks, _ = patched("replay", {"format": 1, "kernels": {}})
    call(kernel, 40)
    assert patch.counts["key_missing"] == 1
    assert marks and "AUTOTUNE_REPLAY_FALLBACK" in marks[0] and "reason=key_missing" in marks[0]


def test_replay_config_that_fails_to_compile_falls_back(patched):
    kernel = make_kernel()
    call(kernel, 40)
    key = only_key(kernel)
    fresh = make_kernel()
    bad = {"kwargs": {"BLOCK": 24}, "num_warps": 1, "num_stages": 3, "num_ctas": 1}  # arange needs a power of 2
    patch, marks, _ = patched("replay", records_for(fresh, key, bad))
    call(fresh, 40)
    assert patch.counts["compile_failed"] == 1
    assert any("reason=compile_failed" in m for m in marks)
    assert any("AUTOTUNE_REPLAY_OUTSIDE_SPACE" in m for m in marks)


def test_pre_hook_configs_are_not_recorded(patched):
    hooked = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=lambda nargs: None) for b in (16, 32)]
    kernel = make_kernel(hooked)
    patch, marks, _ = patched("record")
    call(kernel, 40)
    assert patch.store.data["kernels"] == {}
    assert patch.counts["not_recorded_pre_hook"] == 1
    assert "reason=pre_hook" in marks[0]


def test_single_config_kernels_record_their_only_config(patched):
    kernel = make_kernel(CONFIGS[:1])
    patch, _, _ = patched("record")
    call(kernel, 40)
    entries = patch.store.data["kernels"][tuning.kernel_id(kernel)]
    assert entries == {tuning.ANY_KEY: {"key": None, "config": tuning.config_to_json(CONFIGS[0]), "case": "case"}}


def test_corrupt_or_missing_records_are_reported(tmp_path):
    with pytest.raises(tuning.RecordsError, match="missing"):
        tuning.load_records(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(tuning.RecordsError, match="corrupt"):
        tuning.load_records(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text('{"format": 99, "kernels": {}}')
    with pytest.raises(tuning.RecordsError, match="unknown format"):
        tuning.load_records(tmp_path / "old.json")


# --- serialisation -------------------------------------------------------------------------------
def test_key_str_stores_any_key():
    assert tuning.key_str(None) == tuning.ANY_KEY
    # Keys may hold values JSON cannot store (a dtype object): stored by repr, still distinct.
    half, single = tuning.key_str((40, torch.float16)), tuning.key_str((40, torch.float32))
    assert json.loads(half) == [40, repr(torch.float16)] and half != single


@triton.jit
def scaled(x_ptr, SCALE: tl.constexpr):
    pass


def test_kernel_id_names_the_python_function_under_every_wrapper():
    tuner = triton.autotune(configs=CONFIGS[:1], key=[])(triton.heuristics({"SCALE": lambda args: 2})(scaled))
    assert tuning.kernel_id(tuner) == f"{__name__}.scaled"
    # A Triton without Autotuner.base_fn: the wrappers (heuristics has a __module__ but no
    # __qualname__) are unwrapped down to the JIT function.
    assert tuning.kernel_id(types.SimpleNamespace(fn=tuner.fn)) == f"{__name__}.scaled"


def test_config_json_round_trips_every_field():
    config = triton.Config({"BLOCK": 64, "GROUP": 8}, num_warps=8, num_stages=2, num_ctas=2, maxnreg=128,
                           ir_override="/tmp/k.ttgir")
    data = json.loads(json.dumps(tuning.config_to_json(config)))  # through the records file
    rebuilt, in_space = tuning.config_from_json(data, CONFIGS)
    assert not in_space and vars(rebuilt) == vars(config)
    assert tuning.config_to_json(rebuilt) == data


def test_config_json_format_omits_unset_options():
    # The records' format: an older record (no maxnreg, no ir_override) must still match the
    # same config of the autotuner's space.
    assert tuning.config_to_json(triton.Config({"BLOCK": 16}, num_warps=2, num_stages=1)) == {
        "kwargs": {"BLOCK": 16}, "num_warps": 2, "num_stages": 1, "num_ctas": 1}
    # A Triton whose Config has no num_ctas, maxnreg or pre_hook.
    bare = types.SimpleNamespace(kwargs={"BLOCK": 16}, num_warps=2, num_stages=1)
    assert tuning.config_to_json(bare) == {"kwargs": {"BLOCK": 16}, "num_warps": 2, "num_stages": 1, "num_ctas": 1}


def test_config_from_json_returns_the_spaces_own_object():
    data = tuning.config_to_json(CONFIGS[3])
    assert tuning.config_from_json(data, CONFIGS) == (CONFIGS[3], True)


def test_a_config_whose_kwargs_json_cannot_hold_is_found_in_its_space_after_a_round_trip(tmp_path):
    # tl dtypes as constexprs and tuples are stored as their str and lists: the replay must still
    # find the space's own Config (with the real values), not build one from the strings.
    space = [triton.Config({"BLOCK": 16, "ACC": acc, "DIMS": (1, 2)}, num_warps=w)
             for acc in (tl.float32, tl.float64) for w in (1, 2)]
    store = tuning.RecordStore(tmp_path / "op.json", "op")
    store.add("m.k", (300,), tuning.config_to_json(space[3]), "fp32-300")
    entry = tuning.load_records(tmp_path / "op.json")["kernels"]["m.k"][tuning.key_str((300,))]
    assert tuning.config_from_json(entry["config"], space) == (space[3], True)


def test_pre_hook_configs_serialise_only_where_the_tuner_reattaches_the_hook():
    hooked = triton.Config({"BLOCK": 16}, num_warps=1, pre_hook=lambda nargs: None)
    assert tuning.config_to_json(hooked) is None
    assert tuning.config_to_json(hooked, hook_reattached=True) == {
        "kwargs": {"BLOCK": 16}, "num_warps": 1, "num_stages": 3, "num_ctas": 1}
    assert tuning.config_from_json(tuning.config_to_json(hooked, True), [hooked], True) == (hooked, True)
    assert tuning.config_from_json(tuning.config_to_json(hooked, True), [hooked])[1] is False


def test_describe():
    assert tuning.describe(triton.Config({"BM": 64, "BN": 32}, num_warps=8, num_stages=2)) == \
        "BM=64 BN=32 num_warps=8 num_stages=2"


def test_records_path(tmp_path):
    assert tuning.records_path(str(tmp_path), "mm") == tmp_path / "autotune_records" / "mm.json"


def test_record_store_is_on_disk_from_the_start_and_rewritten_only_on_a_new_choice(tmp_path):
    path = tmp_path / "mm.json"
    store = tuning.RecordStore(path, "mm")
    assert tuning.load_records(path) == {"format": tuning.RECORD_FORMAT, "op": "mm", "kernels": {}}
    a, b = tuning.config_to_json(CONFIGS[0]), tuning.config_to_json(CONFIGS[1])
    store.add("k", (40, "torch.float32"), a, "fp32-40")
    inode = path.stat().st_ino
    store.add("k", (40, "torch.float32"), a, "fp32-40-again")  # every launch reports its config
    assert path.stat().st_ino == inode  # an atomic rewrite would be a new file
    store.add("k", (40, "torch.float32"), b, "fp32-40-later")
    store.add("k", None, a, "any")
    assert tuning.load_records(path)["kernels"] == {"k": {
        '[40, "torch.float32"]': {"key": [40, "torch.float32"], "config": b, "case": "fp32-40-later"},
        tuning.ANY_KEY: {"key": None, "config": a, "case": "any"}}}


@pytest.mark.parametrize("text", ["[]", '{"format": 2, "kernels": {}}', '{"format": 1}',
                                  '{"format": 1, "kernels": []}'])
def test_records_of_an_unknown_format_are_refused(tmp_path, text):
    path = tmp_path / "mm.json"
    path.write_text(text)
    with pytest.raises(tuning.RecordsError) as info:
        tuning.load_records(path)
    assert str(info.value) == f"autotune records {path}: unknown format (expected format 1)"


def test_records_errors_name_the_file(tmp_path):
    with pytest.raises(tuning.RecordsError) as info:
        tuning.load_records(tmp_path / "none.json")
    assert str(info.value) == f"replay source has no autotune records: {tmp_path / 'none.json'} is missing"
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(tuning.RecordsError) as info:
        tuning.load_records(tmp_path / "bad.json")
    assert str(info.value).startswith(f"autotune records {tmp_path / 'bad.json'} are corrupt: ")


def test_host_bench_times_one_call_in_ms(monkeypatch):
    clock = iter([10.0, 10.25, 20.0, 20.5])
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: next(clock))
    calls = []
    assert tuning.host_bench(lambda: calls.append(1)) == 250.0
    assert tuning.host_bench(lambda: calls.append(1), quantiles=[0.5, 0.2, 0.8]) == [500.0, 500.0, 500.0]
    assert calls == [1, 1]


def test_host_bench_times_a_config_the_interpreter_refuses_as_inf():
    from triton.runtime.errors import InterpreterError

    def refused():
        raise InterpreterError("static_assert: row must fit in one block")

    assert tuning.host_bench(refused) == math.inf
    assert tuning.host_bench(refused, quantiles=[0.5, 0.2, 0.8]) == [math.inf] * 3
    with pytest.raises(ZeroDivisionError):  # anything else is the op's own error, not the config's
        tuning.host_bench(lambda: 1 / 0)


# --- the patch, on a stand-in autotuner ----------------------------------------------------------
def _define():
    def kernel_fn():
        """The function a stand-in tuner autotunes; nested, as kernels defined in a factory are."""

    return kernel_fn


kernel_fn = _define()
KID = f"{__name__}._define.<locals>.kernel_fn"
SPACE = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32)]


class Tuner:
    """Triton's Autotuner.run in miniature: a cache lookup per key, a sweep on a miss (the last
    config wins), then the launch. `fails` maps a BLOCK to the compile error its launch raises."""

    def __init__(self, configs=SPACE, cache=None, fails=None):
        self.fn = kernel_fn
        self.configs = configs
        self.cache = {} if cache is None else cache
        self.fails = fails or {}
        self.swept, self.launched = [], []

    def run(self, key):
        if len(self.configs) > 1:
            if key not in self.cache:
                self.swept.append(key)
                self.cache[key] = self.configs[-1]
            config = self.cache[key]
        else:
            config = self.configs[0]
        self.launched.append(config)
        if config.kwargs["BLOCK"] in self.fails:
            raise self.fails[config.kwargs["BLOCK"]]
        return config


tuner_run_unpatched = Tuner.run


class LibTuner(Tuner):
    """FlagGems' LibTuner in miniature: its own run, a persistent cache that hands back bare
    configs, and the pre_hook re-attached from its own space."""

    def run(self, key):
        if len(self.configs) > 1:
            if key not in self.cache:
                self.swept.append(key)
                last = self.configs[-1]
                self.cache[key] = triton.Config(dict(last.kwargs), num_warps=last.num_warps)  # stored bare
            config = self.cache[key]
            config = next((c for c in self.configs if c.all_kwargs() == config.all_kwargs()), config)
        else:
            config = self.configs[0]
        self.launched.append(config)
        if config.kwargs["BLOCK"] in self.fails:
            raise self.fails[config.kwargs["BLOCK"]]
        return config


HOOKED = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=lambda nargs: None) for b in (16, 32)]


@pytest.fixture
def patch_on(tmp_path):
    made = []

    def make(mode, tuner_class=Tuner, records=None, **options):
        log = types.SimpleNamespace(marks=[], chosen={}, progress=[])
        store = tuning.RecordStore(tmp_path / "op.json", "op") if mode == "record" else None
        patch = tuning.AutotunePatch(mode, store=store, records=records, mark=log.marks.append,
                                     chosen=log.chosen.__setitem__, case=lambda: "case",
                                     progress=log.progress.append, **options)
        patch.install(tuner_class)
        made.append(patch)
        return patch, log

    yield make
    for patch in made:
        patch.uninstall()
    assert Tuner.run.__qualname__ == "Tuner.run" and LibTuner.run.__qualname__ == "LibTuner.run"


def recorded(*picks):
    """Records as a record run writes them: (key, config) per pick, for the stand-in kernel."""
    return {"format": 1, "kernels": {KID: {tuning.key_str(k): {"key": list(k), "config": tuning.config_to_json(c)}
                                           for k, c in picks}}}


def counts(**nonzero):
    return {"recorded": 0, "injected": 0, "key_missing": 0, "compile_failed": 0, "not_recorded_pre_hook": 0,
            "outside_space": 0, **nonzero}


def said(log) -> list[str]:
    """The progress lines, each sweep's wall time as T."""
    return [re.sub(r" in \d+\.\d\d s$", " in T s", line) for line in log.progress]


def test_record_says_when_it_sweeps_and_reports_each_choice(patch_on):
    patch, log = patch_on("record")
    tuner = Tuner(cache={(8,): SPACE[0]})  # key (8,) is warm
    tuner.run((40,))
    tuner.run((40,))
    tuner.run((8,))
    assert said(log) == ["autotune: sweeping kernel_fn key=[40] over 2 configs",
                         "autotune: swept kernel_fn key=[40] in T s"]
    assert patch.sweeps["keys"] == 1 and patch.sweeps["seconds"] >= 0
    assert log.chosen == {KID: "BLOCK=16 num_warps=1 num_stages=3"}  # the last launch's
    assert patch.counts == counts(recorded=2) and log.marks == []
    assert {k: e["config"] for k, e in patch.store.data["kernels"][KID].items()} == {
        "[40]": tuning.config_to_json(SPACE[1]), "[8]": tuning.config_to_json(SPACE[0])}


def test_record_injects_and_records_preset_picks(patch_on):
    # A parallel sweep's merged picks: measured as given, and recorded as this run's own.
    patch, log = patch_on("record", records=recorded(((40,), SPACE[0])))
    tuner = Tuner()
    assert tuner.run((40,)) is SPACE[0] and tuner.swept == []
    assert patch.counts == counts(recorded=1, injected=1) and log.marks == []
    assert patch.store.data["kernels"][KID]["[40]"]["config"] == tuning.config_to_json(SPACE[0])


def test_replay_counts_and_marks_every_deviation_per_measurement(patch_on):
    outside = triton.Config({"BLOCK": 64}, num_warps=4)
    patch, log = patch_on("replay", records=recorded(((1,), SPACE[0]), ((2,), SPACE[0]), ((3,), outside),
                                                       ((4,), outside)))
    tuner = Tuner(cache={(6,): SPACE[1]})
    for key in [(1,), (2,), (1,), (3,), (4,), (5,), (5,), (6,)]:
        tuner.run(key)
    assert [c.kwargs["BLOCK"] for c in tuner.launched] == [16, 16, 16, 64, 64, 32, 32, 32]
    assert tuner.swept == [(5,)]
    assert patch.counts == counts(injected=4, outside_space=2, key_missing=2)
    assert log.marks == [f"AUTOTUNE_REPLAY_OUTSIDE_SPACE kernel={KID} key=[3]",
                         f"AUTOTUNE_REPLAY_OUTSIDE_SPACE kernel={KID} key=[4]",
                         f"AUTOTUNE_REPLAY_FALLBACK kernel={KID} key=[5] reason=key_missing",
                         f"AUTOTUNE_REPLAY_FALLBACK kernel={KID} key=[5] reason=key_missing",
                         f"AUTOTUNE_REPLAY_FALLBACK kernel={KID} key=[6] reason=key_missing"]
    # Only a key that really sweeps says so; (6,) ran from the warm cache.
    assert said(log) == ["autotune: sweeping kernel_fn key=[5] live (key_missing)",
                         "autotune: swept kernel_fn key=[5] in T s"]
    assert patch.sweeps["keys"] == 1
    assert log.chosen == {KID: "BLOCK=32 num_warps=1 num_stages=3"}


def test_replay_without_records_sweeps_every_key_live(patch_on):
    patch, log = patch_on("replay")
    Tuner().run((1,))
    assert patch.counts == counts(key_missing=1)
    assert log.marks == [f"AUTOTUNE_REPLAY_FALLBACK kernel={KID} key=[1] reason=key_missing"]


@pytest.mark.parametrize("error", [
    triton.runtime.errors.OutOfResources(1 << 17, 1 << 16, "shared memory"),
    triton.runtime.errors.PTXASError("ptxas fatal: too many registers\nsecond line"),
    triton.runtime.errors.InterpreterError(""),
    triton.compiler.errors.CompilationError(None, None, "bad"),
    triton.compiler.errors.CompileTimeAssertionFailure(None, None, "assert"),
], ids=lambda e: type(e).__name__)
def test_a_recorded_config_that_does_not_compile_sweeps_live(patch_on, error):
    patch, log = patch_on("replay", records=recorded(((1,), SPACE[0]), ((2,), SPACE[0])))
    tuner = Tuner(fails={16: error})
    for key in [(1,), (1,), (2,)]:
        tuner.run(key)
    assert [c.kwargs["BLOCK"] for c in tuner.launched] == [16, 32, 32, 16, 32]
    assert tuner.swept == [(1,), (2,)]
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    fallback = f"AUTOTUNE_REPLAY_FALLBACK kernel={KID} key=[{{}}] reason=compile_failed"
    # The live sweep's own lookup marks the key too (a row's markers are a set).
    assert log.marks == [fallback.format(1) + f" detail={detail!r}", fallback.format(1), fallback.format(1),
                         fallback.format(2) + f" detail={detail!r}", fallback.format(2)]
    assert patch.counts == counts(injected=2, compile_failed=2)


def test_compile_fallback_detail_is_one_short_line(patch_on):
    patch, log = patch_on("replay", records=recorded(((1,), SPACE[0])))
    Tuner(fails={16: triton.runtime.errors.PTXASError("x" * 300 + "\nmore")}).run((1,))
    assert log.marks[0] == (f"AUTOTUNE_REPLAY_FALLBACK kernel={KID} key=[1] reason=compile_failed "
                            f"detail={('PTXAS error: ' + 'x' * 300)[:200]!r}")
    empty = triton.runtime.errors.InterpreterError("")
    patch, log = patch_on("replay", records=recorded(((1,), SPACE[0])), tuner_class=LibTuner)
    LibTuner(fails={16: empty}, cache=PersistentCache()).run((1,))
    assert log.marks[0].endswith("reason=compile_failed detail='InterpreterError'")


def test_a_compile_error_without_an_injected_config_propagates(patch_on):
    error = triton.runtime.errors.OutOfResources(2, 1, "shared memory")
    patch_on("record")
    with pytest.raises(triton.runtime.errors.OutOfResources):
        Tuner(fails={32: error}).run((1,))
    patch_on("replay", records=recorded(((1,), SPACE[1])), tuner_class=LibTuner)
    tuner = LibTuner(fails={32: error}, cache=PersistentCache())
    with pytest.raises(triton.runtime.errors.OutOfResources):
        tuner.run((2,))  # key_missing: swept live, nothing of ours to take back


def test_pre_hook_choices_are_marked_per_measurement_and_counted_per_key(patch_on):
    patch, log = patch_on("record")
    tuner = Tuner(configs=HOOKED)
    for key in [(1,), (1,), (2,)]:
        tuner.run(key)
    assert patch.counts == counts(not_recorded_pre_hook=2) and patch.store.data["kernels"] == {}
    assert log.marks == [f"AUTOTUNE_NOT_RECORDED kernel={KID} key=[{k}] reason=pre_hook" for k in (1, 1, 2)]


def test_host_autotune_installs_host_bench_only_where_asked_and_missing(patch_on):
    patch_on("record")
    tuner = Tuner()
    tuner.run((1,))
    assert "do_bench" not in vars(tuner)  # a backend with a Triton driver keeps Triton's own
    patch_on("record", host_autotune=True, tuner_class=LibTuner)
    lib = LibTuner(cache=PersistentCache())
    lib.run((1,))
    assert vars(lib)["do_bench"] is tuning.host_bench
    own = LibTuner(cache=PersistentCache())
    vars(own)["do_bench"] = kernel_fn
    own.run((1,))
    assert vars(own)["do_bench"] is kernel_fn


def test_libtuner_records_pre_hook_configs_it_reattaches(patch_on):
    patch, log = patch_on("record", tuner_class=LibTuner)
    persistent = PersistentCache({(8,): triton.Config({"BLOCK": 16}, num_warps=1)})  # warm for (8,)
    tuner = LibTuner(configs=HOOKED, cache=persistent)
    tuner.run((40,))
    tuner.run((8,))
    assert tuner.launched == [HOOKED[1], HOOKED[0]]
    assert said(log) == ["autotune: sweeping kernel_fn key=[40] over 2 configs",
                         "autotune: swept kernel_fn key=[40] in T s"]
    assert patch.counts == counts(recorded=2) and log.marks == []
    assert {k: e["config"]["kwargs"] for k, e in patch.store.data["kernels"][KID].items()} == {
        "[40]": {"BLOCK": 32}, "[8]": {"BLOCK": 16}}
    assert set(persistent.rows) == {(8,), (40,)}  # a record run's sweep lands in the persistent cache


def test_libtuner_replay_injects_over_its_persistent_cache_without_writing_it(patch_on):
    persistent = PersistentCache({(1,): triton.Config({"BLOCK": 32}, num_warps=1)})
    rows = dict(persistent.rows)
    picks = {"format": 1, "kernels": {KID: {"[1]": {"config": tuning.config_to_json(HOOKED[0], True)},
                                             "[2]": {"config": tuning.config_to_json(HOOKED[0], True)}}}}
    patch, log = patch_on("replay", records=picks, tuner_class=LibTuner)
    tuner = LibTuner(configs=HOOKED, cache=persistent, fails={16: triton.runtime.errors.PTXASError("no")})
    tuner.run((1,))  # injected BLOCK=16 fails: the key is masked and swept live
    tuner.run((1,))
    tuner.run((2,))  # injected, fails, swept live: its winner stays in this process
    tuner.run((3,))  # key_missing: swept live, into the persistent cache as FlagGems would
    assert [c.kwargs["BLOCK"] for c in tuner.launched] == [16, 32, 32, 16, 32, 32]
    assert tuner.launched[0] is HOOKED[0]  # the space's own config, with its pre_hook
    assert tuner.swept == [(1,), (2,), (3,)]
    assert patch.counts == counts(injected=2, compile_failed=2, key_missing=1)
    assert not any("OUTSIDE_SPACE" in m for m in log.marks)
    assert persistent.rows == {**rows, (3,): persistent.rows[(3,)]}
    assert said(log) == [line for k, why in ((1, "compile_failed"), (2, "compile_failed"), (3, "key_missing"))
                         for line in (f"autotune: sweeping kernel_fn key=[{k}] live ({why})",
                                      f"autotune: swept kernel_fn key=[{k}] in T s")]
    assert patch.sweeps["keys"] == 3


def test_libtuner_replay_keeps_injected_configs_out_of_the_persistent_cache(patch_on):
    persistent = PersistentCache()
    patch, log = patch_on("replay", records=recorded(((1,), SPACE[0])), tuner_class=LibTuner)
    tuner = LibTuner(cache=persistent)
    assert tuner.run((1,)) is SPACE[0] and tuner.run((1,)) is SPACE[0]
    assert tuner.swept == [] and persistent.rows == {}
    assert patch.counts == counts(injected=1) and log.marks == []


def test_install_wraps_once_and_uninstall_restores(patch_on):
    original = Tuner.run
    patch, _ = patch_on("record")
    patch.install(Tuner)  # a second install must not wrap the wrapper
    Tuner().run((1,))
    assert patch.counts["recorded"] == 1
    patch.uninstall()
    assert Tuner.run is original
    patch.install(Tuner)  # installable again after an uninstall
    Tuner().run((2,))
    assert patch.counts["recorded"] == 2


@pytest.mark.parametrize("tuner_class", [Tuner, LibTuner])
def test_a_run_leaves_its_tuners_caches_as_it_found_them_for_the_next_run_in_the_process(patch_on, tuner_class):
    """A measuring host runs several replays in one process, each with a patch of its own, on tuners that
    outlive them: what one run injected is not the next run's, and the next run's patch sees its lookups."""
    own = {} if tuner_class is Tuner else PersistentCache()
    tuner = tuner_class(cache=own)
    first, _ = patch_on("replay", tuner_class=tuner_class, records=recorded(((1,), SPACE[0])))
    assert tuner.run((1,)) is SPACE[0]
    first.uninstall()
    assert tuner.cache is own and (1,) not in own
    second, log = patch_on("replay", tuner_class=tuner_class, records=recorded(((1,), SPACE[1])))
    assert tuner.run((1,)) is SPACE[1] and tuner.swept == []
    assert second.counts == counts(injected=1) and log.chosen == {KID: tuning.describe(SPACE[1])}


def test_a_tuner_left_wrapped_by_a_run_that_never_uninstalled_is_observed_by_the_next_runs_patch(patch_on):
    tuner = Tuner()
    patch_on("replay", records=recorded(((1,), SPACE[0])))[0]  # its run crashed: never uninstalled
    assert tuner.run((1,)) is SPACE[0]
    Tuner.run = tuner_run_unpatched  # as the next run's process finds the class: its own patch
    second, log = patch_on("replay", records=recorded(((1,), SPACE[1])))
    assert tuner.run((1,)) is SPACE[1] and second.counts == counts(injected=1) and log.marks == []


def test_single_config_kernels_record_their_pre_hook_config_only_where_it_is_reattached(patch_on):
    patch, log = patch_on("record", tuner_class=LibTuner)
    LibTuner(configs=HOOKED[:1], cache=PersistentCache()).run((1,))
    assert patch.store.data["kernels"][KID] == {
        tuning.ANY_KEY: {"key": None, "config": tuning.config_to_json(HOOKED[0], True), "case": "case"}}
    patch, log = patch_on("record")
    Tuner(configs=HOOKED[:1]).run((1,))
    assert patch.store.data["kernels"] == {} and patch.counts == counts(not_recorded_pre_hook=1)
    assert log.marks == [f"AUTOTUNE_NOT_RECORDED kernel={KID} key=* reason=pre_hook"]


def test_record_records_preset_picks_with_pre_hooks_the_tuner_reattaches(patch_on):
    # A parallel sweep's merge on FlagGems: the injected config is the space's own, pre_hook and all.
    picks = {"format": 1, "kernels": {KID: {"[1]": {"config": tuning.config_to_json(HOOKED[0], True)}}}}
    patch, log = patch_on("record", records=picks, tuner_class=LibTuner)
    tuner = LibTuner(configs=HOOKED, cache=PersistentCache())
    assert tuner.run((1,)) is HOOKED[0] and tuner.swept == []
    assert patch.counts == counts(injected=1, recorded=1) and log.marks == []
    assert patch.store.data["kernels"][KID]["[1]"]["config"] == picks["kernels"][KID]["[1]"]["config"]


def test_a_row_names_every_config_a_kernel_ran_with_under_several_keys():
    from harness.child.plugins import autotune

    ctx = types.SimpleNamespace(configs={})
    plugin = autotune.AutotunePlugin(ctx)
    for kernel, config in (("m.k", "BLOCK=64 num_warps=2"), ("m.k", "BLOCK=64 num_warps=1"),
                           ("m.k", "BLOCK=64 num_warps=2"), ("m.other", "BLOCK=8 num_warps=4")):
        plugin._chosen(kernel, config)
    assert ctx.configs == {"m.k": "BLOCK=64 num_warps=2 | BLOCK=64 num_warps=1", "m.other": "BLOCK=8 num_warps=4"}
