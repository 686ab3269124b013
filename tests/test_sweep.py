"""Parallel autotune sweep on the interpreter backend with two virtual devices."""

import pytest
from conftest import REPO, load, run_dir_of

from harness import spec as spec_mod
from harness import sweep

RESOURCES = REPO / "tests" / "resources"


def records(kernels):
    return {"format": 1, "op": "op", "kernels": kernels}


def entry(warps):
    return {"key": [16], "config": {"kwargs": {}, "num_warps": warps, "num_stages": 1, "num_ctas": 1}}


def test_round_robin_shards():
    assert sweep.round_robin([1, 2, 3, 4, 5], 2) == [[1, 3, 5], [2, 4]]


def test_merge_counts_conflicting_winners_and_keeps_the_first():
    a = records({"k": {"[16]": entry(4), "[32]": entry(4)}})
    b = records({"k": {"[16]": entry(8), "[64]": entry(2)}, "other": {"*": entry(1)}})
    merged, keys, conflicts = sweep.merge([a, b])
    assert keys == 4 and conflicts == 1
    assert merged["kernels"]["k"]["[16]"]["config"]["num_warps"] == 4


def spec(mode="record"):
    return spec_mod.RunSpec(op="softmax", backend="interpreter", mode=mode, device=0, dtypes=["fp32"],
                            shapes_source="x")


@pytest.mark.parametrize("mode,n,shapes,devices,reason", [
    ("replay", 2, 4, [0, 1], "replay already pins every config"),
    ("record", 1, 4, [0], "fewer than 2 devices requested (1)"),
    ("record", 2, 4, [0], "only 1 device(s) visible, 2 requested"),
    ("record", 2, 1, [0, 1], "fewer than 2 shapes (1)"),
])
def test_refusals(mode, n, shapes, devices, reason):
    assert sweep.refusal(spec(mode), n, shapes, devices) == reason


@pytest.mark.e2e
def test_parallel_sweep_merges_then_measures_a_replayable_record(harness, tmp_path):
    proc = harness("record", "softmax", "--backend", "interpreter", "--sweep-devices", "2", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    observed = load(run_dir / "run.json")["observed"]
    assert observed["sweep"]["status"] == "parallel" and observed["sweep"]["shards"] == [1, 1]
    assert observed["sweep"]["keys"] == 4 and observed["sweep"]["conflicts"] >= 0
    # The measurement injected the merge and recorded it as this run's own records.
    assert observed["autotune"]["injected"] == 4 and observed["autotune"]["key_missing"] == 0
    assert load(run_dir / "autotune_records/softmax.json")["kernels"] == load(run_dir / "sweep/merged.json")["kernels"]
    assert "conflicting winners" in proc.stdout
    replay = harness("replay", run_dir)
    assert replay.returncode == 0 and load(run_dir_of(replay) / "run.json")["observed"]["autotune"]["injected"] == 4


@pytest.mark.e2e
def test_a_failed_shard_refuses_the_merge(harness, tmp_path):
    proc = harness("record", "crashy", "--backend", "interpreter", "--ops-path", RESOURCES / "crash_ops",
                   "--sweep-devices", "2", "--out", tmp_path)
    assert "parallel sweep refused: shard 1 exited" in proc.stdout and "never swept" in proc.stdout
    run = load(run_dir_of(proc) / "run.json")
    assert run["observed"]["sweep"]["status"] == "refused"
    assert run["spec"]["preset_records"] is None  # the serial sweep ran instead (and crashed in turn)


@pytest.mark.e2e
def test_one_shape_sweeps_serially(harness, tmp_path):
    proc = harness("record", "mm", "--backend", "interpreter", "--sweep-devices", "2", "--out", tmp_path)
    assert proc.returncode == 0
    assert "parallel sweep refused: fewer than 2 shapes (1); sweeping serially" in proc.stdout
