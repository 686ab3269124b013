"""Record/replay mechanics in-process, on kernels run by Triton's interpreter."""

import pytest
import torch
import triton
import triton.language as tl

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
