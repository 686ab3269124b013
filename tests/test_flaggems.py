"""FlagGems-style checkouts: node resolution, shapes through the class chain (and into hardcoded
input iterators), LibTuner record/replay with a persistent cache, level and FlagTune pinning.
The checkout is our own fixture (tests/resources/flaggems_checkout), run on the interpreter."""

import collections
import contextlib
import json
import re
import shutil
import sqlite3
import types

import pytest
from conftest import REPO, load, run_dir_of, run_harness

import backends
from harness.child import runner
from harness.child.plugins import flaggems as flaggems_plugin
from harness.core import options as run_options
from harness.core.spec import FlagGemsOptions
from harness.providers import flaggems

pytestmark = pytest.mark.e2e
CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"
MM_KERNEL = "flag_gems.ops.mm_kernel"
SHAPES = """\
softmax:
  shapes: [[2, 8], [3, 16]]
BlasBenchmark:
  shapes: [[1, 4, 8, 4], [1, 16, 16, 8]]
GenericBenchmark:
  shapes: [[1, 2, 4, 4]]
"""


@pytest.fixture(scope="module")
def shape_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("shapes") / "ours.yaml"
    path.write_text(SHAPES)
    return path


def record(out, op, *extra):
    proc = run_harness("record", op, "--flaggems-dir", CHECKOUT, "--backend", "interpreter", "--out", out, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir_of(proc), proc


def rows_of(run_dir):
    return load(run_dir / "results.json")["rows"]


# --- resolution --------------------------------------------------------------------------------
def test_targets_resolve_from_op_op_file_and_pytest_node():
    dirs = flaggems.parse_dirs([str(CHECKOUT)])
    assert dirs == {"flaggems": CHECKOUT.resolve()}
    t = flaggems.resolve_target("flaggems:mm", dirs)
    assert (t.repo, t.test_file, t.function, t.op) == ("flaggems", "benchmark/test_mm.py", "test_mm", "mm")
    nested = flaggems.resolve_target("flaggems:scale_nested@special/nested", dirs)
    assert nested.test_file == "benchmark/test_special/test_nested.py"
    node = flaggems.resolve_target(f"{CHECKOUT}/benchmark/test_softmax.py::test_log_softmax", {})
    assert (node.repo, node.root, node.op) == ("flaggems", str(CHECKOUT.resolve()), "log_softmax")
    named = flaggems.resolve_target(f"{CHECKOUT}/benchmark/test_mm.py::test_mm", {"vllm": CHECKOUT.resolve()})
    assert named.repo == "vllm"


@pytest.mark.parametrize(("op", "message"), [
    ("flaggems:nonexistent", "test_nonexistent.py does not exist"),
    ("flaggems:log_softmax@mm", "has no function test_log_softmax (it has: test_mm)"),
    ("vllm:mm", "no checkout for repo 'vllm'"),
])
def test_bad_targets_fail_with_what_is_wrong(op, message):
    with pytest.raises(flaggems.FlagGemsError, match=re.escape(message)):
        flaggems.resolve_target(op, flaggems.parse_dirs([str(CHECKOUT)]))


def test_paths_given_relative_become_absolute_and_the_rest_stays(tmp_path):
    # A value travels into specs and plans read from other directories: its path is made absolute now.
    assert run_options.absolute_dir("ck", tmp_path) == f"flaggems={tmp_path / 'ck'}"
    assert run_options.absolute_dir("v=../ck", tmp_path / "sub") == f"v={tmp_path / 'ck'}"
    assert run_options.absolute_dir("v=", tmp_path) == "v="  # left to parse_dirs, which says what is wrong
    with pytest.raises(flaggems.FlagGemsError, match=r"v=: expected \[NAME=\]PATH"):
        flaggems.parse_dirs([run_options.absolute_dir("v=", tmp_path)])
    for choice in ("private", "user", "sqlite:///tuned.db", "postgresql://host/db"):
        assert run_options.absolute_libtuner_cache(choice, tmp_path) == choice
    assert run_options.absolute_libtuner_cache("tuned.db", tmp_path) == str(tmp_path / "tuned.db")


def test_bad_checkouts_fail_before_anything_runs(tmp_path):
    assert flaggems.parse_dirs([f"vllm={CHECKOUT}"]) == {"vllm": CHECKOUT.resolve()}
    assert flaggems.parse_dirs(None) == {}
    for items, message in (([str(tmp_path)], "has no benchmark/ folder"),
                           ([f"x={tmp_path / 'nope'}"], "is not a directory"),
                           ([f"a={CHECKOUT}", f"a={CHECKOUT}"], "'a' given twice"),
                           ([f"builtin={CHECKOUT}"], "reserved"),
                           ([f"my-repo={CHECKOUT}"], "NAME an identifier")):
        with pytest.raises(flaggems.FlagGemsError, match=message):
            flaggems.parse_dirs(items)
    proc = run_harness("record", "flaggems:nope", "--flaggems-dir", CHECKOUT, "--backend", "interpreter",
                       "--out", tmp_path)
    assert proc.returncode == 2 and "test_nope.py does not exist" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_vendor_cache_and_flagtune_are_set_before_flag_gems_is_imported(tmp_path, monkeypatch):
    for key in ("GEMS_VENDOR", "FLAGGEMS_DB_URL", "USE_FLAGTUNE"):
        # set then deleted: monkeypatch then restores each at teardown, also when it was unset
        # (a bare delenv of an absent key records nothing, and the keys set below would leak).
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    options = FlagGemsOptions("flaggems", str(CHECKOUT), "benchmark/test_mm.py", "test_mm", flagtune="1")
    spec = types.SimpleNamespace(flaggems=options, dtypes=["bf16"], color=False)
    ctx = types.SimpleNamespace(spec=spec, backend=backends.get("cuda"), run_dir=tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    args = runner.prepare_flaggems(ctx)
    import os

    assert os.environ["GEMS_VENDOR"] == "nvidia" and os.environ["USE_FLAGTUNE"] == "1"
    assert os.environ["FLAGGEMS_DB_URL"] == f"sqlite:///{tmp_path / 'libtuner_cache.db'}"
    assert args[0] == f"{CHECKOUT}/benchmark/test_mm.py::test_mm"
    assert args[args.index("--level") + 1] == "core" and args[args.index("--dtypes") + 1] == "bfloat16"


# --- record and replay -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mm_record(tmp_path_factory, shape_file):
    return record(tmp_path_factory.mktemp("runs"), "flaggems:mm", "--shapes", shape_file)


def test_blas_shapes_come_from_the_class_key(mm_record):
    run_dir, proc = mm_record
    rows = rows_of(run_dir)
    # BlasBenchmark's (b, m, n, k) from our file, not the checkout's core_shapes, nor 1-D defaults.
    assert [r["case"] for r in rows] == ["fp32-4x4,4x8", "fp32-16x8,8x16"]
    assert all(r["status"] == "SUCCESS" and r["timer"] == "host" and r["candidate_ms"] > 0 for r in rows)
    assert rows[0]["params"]["shape_detail"] == [[4, 4], [4, 8]] and "tflops" in rows[0]
    assert "shapes: key 'BlasBenchmark'" in proc.stdout
    assert "[1/?] mm fp32-4x4,4x8 SUCCESS" in proc.stdout


def test_libtuner_choices_are_recorded_with_pre_hook_configs(mm_record):
    run_dir, _ = mm_record
    run = load(run_dir / "run.json")
    facts = run["observed"]["flaggems"]
    assert facts["libtuner_hooked"] and facts["package"] == "flag_gems"
    assert facts["libtuner_cache"] == {"choice": "private", "url": f"sqlite:///{run_dir / 'libtuner_cache.db'}"}
    entries = load(run_dir / "autotune_records" / "mm.json")["kernels"][MM_KERNEL]
    assert len(entries) == 2 and run["observed"]["autotune"]["recorded"] == 2
    assert all(set(e["config"]["kwargs"]) == {"BM", "BN"} for e in entries.values())
    assert all(r["configs"][MM_KERNEL].startswith("BM=") for r in rows_of(run_dir))


def cache_rows(db) -> dict:
    """(table, key) -> config, as the LibTuner stand-in stores them."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return {(tbl, key): config for tbl, key, config in conn.execute("SELECT tbl, key, config FROM configs")}


def test_replay_injects_libtuner_configs_over_a_warm_persistent_cache_and_leaves_it_unchanged(mm_record, tmp_path):
    run_dir, _ = mm_record
    recorded = cache_rows(run_dir / "libtuner_cache.db")  # the private cache holds the recorded winners
    # A warm cache holding the other config for every key: replay must not let it win, nor overwrite it.
    warm = tmp_path / "warm.db"
    shutil.copy(run_dir / "libtuner_cache.db", warm)
    with contextlib.closing(sqlite3.connect(warm)) as conn:
        for (tbl, key), config in recorded.items():
            other = json.loads(config)
            other["kwargs"]["BM"] = {16: 32, 32: 16}[other["kwargs"]["BM"]]
            conn.execute("UPDATE configs SET config = ? WHERE tbl = ? AND key = ?", (json.dumps(other), tbl, key))
        conn.commit()
    warm_before = cache_rows(warm)
    assert len(warm_before) == 2 and all(warm_before[k] != recorded[k] for k in recorded)
    proc = run_harness("replay", run_dir, "--libtuner-cache", warm, "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay = run_dir_of(proc)
    run = load(replay / "run.json")
    assert run["observed"]["autotune"]["injected"] == 2 and run["observed"]["autotune"]["key_missing"] == 0
    assert run["observed"]["flaggems"]["libtuner_cache"]["url"] == f"sqlite:///{warm}"
    assert [r["configs"] for r in rows_of(replay)] == [r["configs"] for r in rows_of(run_dir)]
    assert [r["case"] for r in rows_of(replay)] == [r["case"] for r in rows_of(run_dir)]
    assert not any(r["markers"] for r in rows_of(replay))
    assert cache_rows(warm) == warm_before  # the injected configs never reached the user's cache
    # The replay's inputs are the record's, byte for byte.
    digests = [r["input_sha256"] for r in rows_of(run_dir)]
    assert all(digests) and len(set(digests)) == 2
    assert [r["input_sha256"] for r in rows_of(replay)] == digests


def test_a_warm_persistent_cache_is_still_recorded(mm_record, tmp_path):
    run_dir, _ = mm_record
    warm = tmp_path / "warm.db"
    shutil.copy(run_dir / "libtuner_cache.db", warm)
    again, proc = record(tmp_path, "flaggems:mm", "--shapes", run_dir / "shapes.yaml", "--libtuner-cache", warm)
    assert "autotune: sweeping" not in proc.stdout  # every key was a cache hit
    assert load(again / "autotune_records" / "mm.json")["kernels"][MM_KERNEL].keys() == \
        load(run_dir / "autotune_records" / "mm.json")["kernels"][MM_KERNEL].keys()


# --- shapes ------------------------------------------------------------------------------------
def test_hardcoded_input_shapes_take_ours_through_input_fn(tmp_path, shape_file):
    ours, proc = record(tmp_path, "flaggems:avg_pool2d", "--shapes", shape_file)
    assert [r["case"] for r in rows_of(ours)] == ["fp32-1x2x4x4"]
    assert "hardcodes its shapes; ours are fed through its input_fn" in proc.stdout
    upstream, _ = record(tmp_path, "flaggems:avg_pool2d")
    assert [r["case"] for r in rows_of(upstream)] == ["fp32-2x3x8x8", "fp32-1x4x4x4"]
    assert (upstream / "shapes.yaml").read_text().startswith("# upstream shapes")


def test_a_file_without_a_key_keeps_upstream_shapes_and_says_so(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("layer_norm:\n  shapes: [[8, 8]]\n")
    run_dir, proc = record(tmp_path, "flaggems:mm", "--shapes", other)
    assert [r["case"] for r in rows_of(run_dir)] == ["fp32-8x8,8x16"]  # core_shapes.yaml's BlasBenchmark
    # The note names the run dir's copy of the file, the one a replay reads.
    note = (f"shapes: {run_dir / 'shapes.yaml'} has no key for 'mm' (tried mm, BlasBenchmark, Benchmark, object): "
            "the checkout's own shapes are kept")
    assert load(run_dir / "run.json")["observed"]["flaggems_notes"] == [note]
    assert note in proc.stdout.splitlines()


def test_a_run_collects_only_its_nodes_file_and_the_checkouts_conftest_still_loads(tmp_path, monkeypatch):
    # FlagGems' benchmark/ holds ~700 files; a node of each was made on every step before its test ran.
    log = tmp_path / "collected.txt"
    monkeypatch.setenv("ZL_TEST_COLLECT_LOG", str(log))
    run_dir, _ = record(tmp_path, "flaggems:softmax")
    assert log.read_text().split() == ["test_softmax.py"]
    assert [r["status"] for r in rows_of(run_dir)] == ["SUCCESS"] * len(rows_of(run_dir))


def test_level_is_passed_through_recorded_and_pinned_on_replay(tmp_path):
    core, _ = record(tmp_path, "flaggems:log_softmax@softmax")
    comprehensive, _ = record(tmp_path, "flaggems:log_softmax@softmax", "--level", "comprehensive")
    assert [r["case"] for r in rows_of(core)] == ["fp32-2x16"]
    # The level adds the class's set_more_shapes, as upstream does.
    assert [r["case"] for r in rows_of(comprehensive)] == ["fp32-2x16", "fp32-3x48"]
    assert load(comprehensive / "run.json")["spec"]["flaggems"]["level"] == "comprehensive"
    proc = run_harness("replay", comprehensive, "--level", "core", "--out", tmp_path)
    assert proc.returncode == 2 and "recorded with --level=comprehensive" in proc.stderr
    proc = run_harness("replay", comprehensive, "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["case"] for r in rows_of(run_dir_of(proc))] == ["fp32-2x16", "fp32-3x48"]


def test_upstreams_shape_file_is_parsed_in_c_to_the_same_shapes_and_put_back_as_the_run_ends(tmp_path):
    import yaml

    run_dir, _ = record(tmp_path, "flaggems:log_softmax@softmax", "--level", "comprehensive")
    assert [r["case"] for r in rows_of(run_dir)] == ["fp32-2x16", "fp32-3x48"]  # core_shapes.yaml's, as before
    facts = load(run_dir / "run.json")["observed"]["flaggems"]
    assert facts["shape_file_parser"] == ("libyaml" if yaml.__with_libyaml__ else "pyyaml")
    # The interpreter's device is the host: its draws are upstream's.
    assert facts["host_draws_on_device"] == {"moved": {}, "handed": {}, "copied_back": {}, "refused": {}}
    if not yaml.__with_libyaml__:
        return
    base = types.SimpleNamespace(yaml=yaml)
    plugin = types.SimpleNamespace(patched=[])
    assert flaggems_plugin.FlagGemsPlugin._parse_yaml_in_c(plugin, base) == "libyaml"
    text = (REPO / "tests/resources/flaggems_checkout/benchmark/core_shapes.yaml").read_text()
    assert base.yaml is not yaml and base.yaml.safe_load(text) == yaml.safe_load(text)
    assert base.yaml.YAMLError is yaml.YAMLError  # what upstream catches around it
    assert plugin.patched == [(base, "yaml", yaml)]  # put back with the run's other patches


def test_flagtune_switch_must_match_the_record(tmp_path, monkeypatch):
    run_dir, _ = record(tmp_path, "flaggems:log_softmax@softmax", "--flagtune", "1")
    assert load(run_dir / "run.json")["spec"]["flaggems"]["flagtune"] == "1"
    monkeypatch.setenv("USE_FLAGTUNE", "0")
    proc = run_harness("replay", run_dir, "--out", tmp_path)
    assert proc.returncode == 2 and "USE_FLAGTUNE=1" in proc.stderr


def test_dtypes_pass_through_and_a_failing_benchmark_is_a_row(tmp_path, shape_file):
    run_dir, _ = record(tmp_path, "flaggems:softmax", "--shapes", shape_file, "--dtypes", "fp16")
    assert [r["case"] for r in rows_of(run_dir)] == ["fp16-2x8", "fp16-3x16"]
    # The shape file's dtypes narrow upstream's when --dtypes is not given.
    narrowed = tmp_path / "narrowed.yaml"
    narrowed.write_text("softmax:\n  shapes: [[2, 8]]\n  dtypes: [fp16]\n")
    run_dir, _ = record(tmp_path, "flaggems:softmax", "--shapes", narrowed)
    assert [r["case"] for r in rows_of(run_dir)] == ["fp16-2x8"]
    proc = run_harness("record", "flaggems:softmax", "--flaggems-dir", CHECKOUT, "--backend", "interpreter",
                       "--dtypes", "bf16", "--out", tmp_path)
    assert proc.returncode == 1
    failed = rows_of(run_dir_of(proc))
    assert len(failed) == 1 and failed[0]["status"] == "FAILED" and "can't be supported" in failed[0]["error"]


def test_a_flaggems_vllm_checkout_is_hooked_through_its_own_package(tmp_path, shape_file):
    # FlagGems-vllm has the same scaffold with the package `flaggems_vllm`: our fixture, renamed.
    vllm = tmp_path / "FlagGems-vllm"
    shutil.copytree(CHECKOUT, vllm, ignore=shutil.ignore_patterns("__pycache__"))
    (vllm / "src" / "flag_gems").rename(vllm / "src" / "flaggems_vllm")
    for path in vllm.rglob("*.py"):
        path.write_text(path.read_text().replace("flag_gems", "flaggems_vllm"))
    proc = run_harness("record", "vllm:mm", "--flaggems-dir", f"vllm={vllm}", "--shapes", shape_file,
                       "--backend", "interpreter", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    facts = load(run_dir / "run.json")["observed"]["flaggems"]
    assert facts["package"] == "flaggems_vllm" and facts["libtuner_hooked"]
    assert facts["package_file"] == str(vllm / "src" / "flaggems_vllm" / "__init__.py")
    assert list(load(run_dir / "autotune_records" / "mm.json")["kernels"]) == ["flaggems_vllm.ops.mm_kernel"]
    assert load(run_dir / "run.json")["spec"]["provider"] == "flaggems:vllm"


def test_an_ab_over_a_flaggems_op_passes_its_options_to_every_side(tmp_path, shape_file):
    cache = tmp_path / "shared.db"
    proc = run_harness("ab", "--ops", "flaggems:mm", "--flaggems-dir", CHECKOUT, "--shapes", shape_file,
                       "--level", "core", "--libtuner-cache", cache, "--backend", "interpreter", "--repeats", "2",
                       "--b-env", "ZL_TEST_SWITCH=1", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(tmp_path.glob("ab_*/flaggems-mm/*/*/run.json"))
    assert len(runs) == 6  # A's record (with A's passes), B's passes step, then two replays per side
    for run in map(load, runs):
        assert run["spec"]["flaggems"]["libtuner_cache"] == str(cache)
        assert run["observed"]["flaggems"]["libtuner_cache"]["url"] == f"sqlite:///{cache}"
    replays = [load(r) for r in runs if load(r)["spec"]["mode"] == "replay"]
    assert all(r["observed"]["autotune"]["injected"] == 2 and r["observed"]["autotune"]["key_missing"] == 0
               for r in replays)
    report = load(next(tmp_path.glob("ab_*/report.json")))
    assert [row["shape"] for row in report["rows"]] == [["4x4,4x8"], ["16x8,8x16"]]


# --- benchmarks that decide shapes or time outside the hooked paths ----------------------------
def test_a_subclass_with_its_own_set_shapes_gets_its_cases_seeded_and_our_shapes(tmp_path, harness):
    # upstream's channel_shuffle and unfold_copy: set_shapes overridden, so the base one never runs
    run_dir, proc = record(tmp_path, "flaggems:own_shapes@own_shapes")
    rows = rows_of(run_dir)
    assert [(r["case"], r["status"]) for r in rows] == [("fp32-2x8,2", "SUCCESS"), ("fp32-4x16,4", "SUCCESS")]
    assert all(r["baseline_ms"] and r["candidate_ms"] and r["input_sha256"] for r in rows)
    replay = harness("replay", run_dir)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert [r["input_sha256"] for r in rows_of(run_dir_of(replay))] == [r["input_sha256"] for r in rows]
    ours = tmp_path / "own.yaml"
    ours.write_text("own_shapes:\n  shapes: [[[3, 5], 1]]\n")
    run_dir, _ = record(tmp_path, "flaggems:own_shapes@own_shapes", "--shapes", ours)
    assert [r["case"] for r in rows_of(run_dir)] == ["fp32-3x5,1"]


def test_a_timing_outside_any_input_iterator_still_makes_its_row_and_says_so(tmp_path):
    run_dir, proc = record(tmp_path, "flaggems:direct_latency@own_shapes")
    (row,) = rows_of(run_dir)
    assert (row["case"], row["status"], row["candidate_ms"]) == ("fp32-8x8", "SUCCESS", None)
    assert row["baseline_ms"] > 0  # the one side it timed
    note = ("inputs: Benchmark times inputs that did not come through its input iterator: cases are named from "
            "the arguments timed, and zl_bench did not seed their construction")
    assert note in proc.stdout.splitlines() and note in load(run_dir / "run.json")["observed"]["flaggems_notes"]


@pytest.mark.parametrize(("metrics", "roles"), [
    (["latency_base", "latency", "speedup"], ["baseline", "candidate"]),
    (["latency", "tflops"], ["candidate"]),
    (["latency_base"], ["baseline"]),
    (["tflops"], ["baseline"]),
])
def test_each_timing_is_named_by_the_side_upstream_times_in_that_order(metrics, roles):
    # The measured side's name is what its markers say (NO_DEVICE_WORK side=candidate leaves the
    # A/B headline, side=baseline does not).
    assert flaggems_plugin._roles(metrics) == roles


def test_sparse_inputs_are_digested_not_failed_and_replay_matches(tmp_path, harness):
    # upstream's sparse_sampled_addmm: its CSR inputs have no strides; digesting them failed every case
    ours = tmp_path / "sparse.yaml"
    ours.write_text("sparse_input:\n  shapes: [[8, 16], [16, 32]]\n")
    run_dir, _ = record(tmp_path, "flaggems:sparse_input@input_kinds", "--shapes", ours)
    rows = rows_of(run_dir)
    assert [(r["status"], r["markers"]) for r in rows] == [("SUCCESS", [])] * 2
    assert len({r["input_sha256"] for r in rows}) == 2 and all(rows[0]["input_sha256"])
    replay = harness("replay", run_dir)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert [r["input_sha256"] for r in rows_of(run_dir_of(replay))] == [r["input_sha256"] for r in rows]


BIG = (1024, flaggems_plugin.HOST_DRAW_MIN_ELEMENTS // 1024)


class MetaDraws(flaggems_plugin.HostDrawsOnDevice):
    """HostDrawsOnDevice onto the meta device (what a CPU machine has besides the host), its copy back a
    stand-in that records what it filled (zeros: a meta tensor has no values); its generator lacks int8."""

    def __init__(self, filled: list):
        def copy_back(host, drawn):
            filled.append((drawn.device.type, drawn.dtype, tuple(drawn.shape)))
            host.zero_()

        super().__init__("meta", copy_back)

    def _on_device(self, func, args, kwargs):
        import torch

        if kwargs.get("dtype") == torch.int8:
            raise RuntimeError("\"random_\" not implemented for 'Char'")
        return super()._on_device(func, args, kwargs)


def upstreams_draws(device):
    """The host draws FlagGems' input functions make, as they make them (generate_tensor_input's integers,
    bitwise_right_shift_'s shift amounts, margin_ranking_loss's signs, a name imported from torch)."""
    import torch
    from torch import randint

    made = {"ints": torch.randint(-2**15, 2**15 - 1, BIG, dtype=torch.int16, device="cpu").to(device)}
    shift = randint(0, 8, BIG, dtype=torch.int32, device="cpu")
    made["shift"] = shift.to(device) if shift.shape == BIG and shift.dim() == 2 else None  # read, not its values
    made["signs"] = (torch.randint(0, 2, BIG, dtype=torch.int16, device="cpu") * 2 - 1).to(device)
    made["offset"] = (torch.ones(BIG, dtype=torch.int16) + torch.randint(0, 8, BIG, dtype=torch.int16)).to(device)
    made["kept"] = torch.randn(*BIG)  # yielded on the host
    made["widened"] = torch.rand(size=BIG).to(torch.float64)  # a new dtype on the host
    made["small"] = torch.randint(0, 8, (BIG[0] - 1, BIG[1]), device="cpu").to(device)  # one element short
    made["own_generator"] = torch.randint(-3, 4, BIG, generator=torch.Generator().manual_seed(1))
    made["with_grad"] = torch.randn(BIG, requires_grad=True)
    made["asked_on_device"] = torch.randint(0, 8, BIG, device=device)
    return made


def test_big_host_draws_are_made_on_the_device_and_cross_the_bus_only_where_the_host_reads_them():
    import torch

    filled = []
    with MetaDraws(filled) as draws:
        made = upstreams_draws("meta")
    # A `.to(device)` of a draw got a copy made on the device: nothing copied back, a tensor of its own.
    assert draws.moved == {"randint": 4, "randn": 1, "rand": 1}
    assert draws.handed == {"randint": 2} and made["ints"].device.type == made["shift"].device.type == "meta"
    # Read on the host (an arithmetic op, first or second operand; a dtype change there) or kept there: filled
    # from the device first.
    assert draws.copied_back == {"randint": 2, "randn": 1, "rand": 1}
    assert collections.Counter(filled) == {("meta", torch.int16, BIG): 2, ("meta", torch.float32, BIG): 2}
    assert made["kept"].device.type == "cpu" and made["widened"].dtype == torch.float64
    assert made["signs"].device.type == "meta" and draws.waiting == {}
    for name in ("own_generator", "with_grad"):  # upstream's own draws, on the host
        assert made[name].device.type == "cpu" and made[name].unique().numel() > 1
    assert made["with_grad"].requires_grad and made["asked_on_device"].device.type == "meta"
    assert made["small"].device.type == "meta"


def test_big_host_draws_made_on_the_device_hold_upstreams_values_wherever_they_land():
    """On a machine whose device is the host, a draw made 'on the device' is upstream's own, seeded alike: what
    each pattern gets, handed over, filled or kept, holds the values upstream's draws hold."""
    import torch

    torch.manual_seed(7)
    upstream = upstreams_draws("cpu")
    torch.manual_seed(7)
    with flaggems_plugin.HostDrawsOnDevice("cpu") as draws:
        ours = upstreams_draws("cpu")
    # Asked for on the device, which here is the host: moved too.
    assert draws.moved == {"randint": 5, "randn": 1, "rand": 1} and draws.handed == {"randint": 2}
    for name in upstream:
        assert torch.equal(ours[name], upstream[name]), name
    # A copy handed over is a tensor of its own, as upstream's `.to` of a host tensor was.
    with flaggems_plugin.HostDrawsOnDevice("cpu") as draws:
        host = torch.randint(0, 8, BIG, device="cpu")
        first, second = host.to("cpu"), host.to("cpu")
        first.add_(1)
        assert len(draws.waiting) == 1
        del host  # gone unread: its device draw is let go at once, not at the exit
        assert draws.waiting == {} and draws.copied_back == {}
    assert torch.equal(first - 1, second)


def test_a_draw_the_device_refuses_is_upstreams_on_the_host_and_counted():
    import torch

    with MetaDraws([]) as draws:
        drawn = torch.randint(0, 8, BIG, dtype=torch.int8, device="cpu")
    assert draws.refused == {"randint": 1} and draws.moved == {}
    assert drawn.device.type == "cpu" and drawn.dtype == torch.int8 and drawn.unique().numel() > 1


def test_a_benchmark_on_a_device_draws_its_inputs_through_it_and_the_run_counts_them(monkeypatch):
    import torch

    filled = []
    monkeypatch.setattr(flaggems_plugin, "HostDrawsOnDevice", lambda device: MetaDraws(filled))

    def inputs():
        yield torch.randn(4), torch.randint(0, 8, BIG, device="cpu")
        yield torch.randint(0, 8, BIG, dtype=torch.int32).to("meta"), torch.randint(0, 8, (2,))
        yield (torch.randint(0, 8, BIG, dtype=torch.int8),)

    plugin = types.SimpleNamespace(host_draws={name: collections.Counter()
                                               for name in MetaDraws.COUNTS})
    on_device, on_host, it = types.SimpleNamespace(device="meta"), types.SimpleNamespace(device="cpu"), inputs()
    first = flaggems_plugin.FlagGemsPlugin._next_input(plugin, on_device, it)
    second = flaggems_plugin.FlagGemsPlugin._next_input(plugin, on_device, it)
    assert plugin.host_draws == {"moved": {"randint": 2}, "handed": {"randint": 1}, "copied_back": {"randint": 1},
                                 "refused": {}}
    assert first[1].device.type == "cpu" and second[0].device.type == "meta" and len(filled) == 1
    flaggems_plugin.FlagGemsPlugin._next_input(plugin, on_device, it)
    assert plugin.host_draws["refused"] == {"randint": 1}  # said in run.json, not silent
    # A benchmark on the host (the interpreter's) draws as upstream does.
    assert flaggems_plugin.FlagGemsPlugin._next_input(plugin, on_host, iter([(torch.randn(*BIG),)]))
    assert plugin.host_draws["moved"] == {"randint": 2} and len(filled) == 1


def test_each_input_the_benchmarks_iterator_yields_is_drawn_through_it(monkeypatch):
    import torch

    handed, begun = [], []
    monkeypatch.setattr(flaggems_plugin, "HostDrawsOnDevice", lambda device: MetaDraws(handed))
    plugin = flaggems_plugin.FlagGemsPlugin.__new__(flaggems_plugin.FlagGemsPlugin)
    plugin.our_shapes, plugin.case_counts = None, {}
    plugin.host_draws = {name: collections.Counter() for name in MetaDraws.COUNTS}
    plugin.ctx = types.SimpleNamespace(spec=types.SimpleNamespace(seed=0), selects=lambda case: True)
    plugin._begin_case = lambda bench, dtype, item, case_id, label: begun.append(case_id)

    def own_inputs(dtype):  # upstream's iterator: its inputs built as each is asked for
        for rows in (BIG[0], 8):
            yield torch.randn(rows, BIG[1]), torch.randint(0, 8, (rows, BIG[1]), dtype=dtype, device="cpu")

    bench = types.SimpleNamespace(device="meta", get_input_iter=own_inputs)
    plugin._take_inputs(bench)
    assert len(list(bench.get_input_iter(torch.int16))) == 2
    assert begun == [f"int16-{BIG[0]}x{BIG[1]},{BIG[0]}x{BIG[1]}", f"int16-8x{BIG[1]},8x{BIG[1]}"]
    # The big case's alone, kept on the host as yielded: filled from the device.
    assert plugin.host_draws["moved"] == {"randn": 1, "randint": 1} and len(handed) == 2
