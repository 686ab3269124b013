"""Parallel autotune sweep on the interpreter backend with two virtual devices."""

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import REPO, load, run_dir_of

from harness import cli
from harness.core import spec as spec_mod
from harness.core.options import RunOptions
from harness.sessions import sweep

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


def shard_picks(run_dir, kernel):
    """The BLOCK each shard's own record chose, per shard, for its one key."""
    picks = []
    for shard in sorted((run_dir / "sweep").glob("shard*/*/autotune_records/split_key.json")):
        (entry,) = load(shard)["kernels"][kernel].values()
        picks.append(entry["config"]["kwargs"]["BLOCK"])
    return picks


@pytest.mark.e2e
def test_parallel_sweep_counts_conflicts_then_measures_a_replayable_record(harness, tmp_path):
    # split_key's winner for its one key depends on the rows, which the key leaves out: shard 0
    # (shape [2, 16]) picks BLOCK=16, shard 1 ([8, 16]) BLOCK=32. One key, exactly one conflict.
    shapes = tmp_path / "split.yaml"
    shapes.write_text("split_key:\n  shapes: [[2, 16], [8, 16]]\n")
    proc = harness("record", "split_key", "--backend", "interpreter", "--ops-path", RESOURCES / "sweep_ops",
                   "--shapes", shapes, "--sweep-devices", "2", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    observed = load(run_dir / "run.json")["observed"]
    assert observed["sweep"]["status"] == "parallel" and observed["sweep"]["shards"] == [1, 1]
    (kernel,) = load(run_dir / "sweep/merged.json")["kernels"]
    assert shard_picks(run_dir, kernel) == [16, 32]
    assert observed["sweep"]["keys"] == 1 and observed["sweep"]["conflicts"] == 1
    assert "1 key(s) with conflicting winners across shards" in proc.stdout
    # The measurement injected the merge (the first shard's pick, for both shapes) and recorded it
    # as this run's own records.
    assert observed["autotune"]["injected"] == 1 and observed["autotune"]["key_missing"] == 0
    assert [r["configs"][kernel].split()[0] for r in load(run_dir / "results.json")["rows"]] == ["BLOCK=16"] * 2
    assert load(run_dir / "autotune_records/split_key.json")["kernels"] == \
        load(run_dir / "sweep/merged.json")["kernels"]
    replay = harness("replay", run_dir)
    assert replay.returncode == 0 and load(run_dir_of(replay) / "run.json")["observed"]["autotune"]["injected"] == 1


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


def _fake_shards(monkeypatch, write) -> list:
    """Two devices, and shards that exit 0 at once after `write(their named run dir)`; the argv each
    was started with, in order."""
    launched = []

    class Shard:
        def wait(self, timeout=None):
            return 0

    def start(argv, log=None):
        launched.append(argv)
        write(Path(argv[argv.index("--run-dir") + 1]))
        return Shard()

    monkeypatch.setattr(sweep.launch, "start", start)
    monkeypatch.setattr(sweep, "sweep_devices", lambda backend, n: [0, 1])
    return launched


def test_shards_compile_into_the_runs_one_cache_and_keep_the_precompile_switch(tmp_path, monkeypatch):
    """Every shard gets the run's Triton cache (what one shard compiled is a hit for the others and
    for the measurement), and the run's --no-precompile."""
    def write(named: Path) -> None:
        (named / "autotune_records").mkdir(parents=True)
        (named / "autotune_records" / "softmax.json").write_text(json.dumps(records({"k": {"[16]": entry(4)}})))

    launched = _fake_shards(monkeypatch, write)
    cache = tmp_path / "cache"
    run_spec = dataclasses.replace(spec(), precompile=False)
    outcome = sweep.run(run_spec, [[4, 16], [8, 16], [2, 16]], 2, tmp_path, lambda line: None, cache)
    assert outcome.facts["status"] == "parallel" and len(launched) == 2
    for argv in launched:
        assert argv[argv.index("--triton-cache") + 1] == str(cache)
        assert "--no-precompile" in argv


def test_shards_measure_as_the_run_does_l2_included_and_are_read_back_by_name(tmp_path, monkeypatch):
    """A shard is the record this run would make of its shapes: every measurement option, `l2`
    too, reaches it (Triton's autotuner flushes the L2 itself as it times configs, so no pick
    depends on --l2; the shard's own run.json then still says how its run measured). Its picks
    are read from the run dir the sweep named, never from another dir dropped beside it."""
    def write(named: Path) -> None:
        stray = named.parent / "softmax_19990101-000000" / "autotune_records"  # another run's, left there
        stray.mkdir(parents=True)
        (stray / "softmax.json").write_text(json.dumps(records({"k": {"[16]": entry(8)}})))
        (named / "autotune_records").mkdir(parents=True)
        (named / "autotune_records" / "softmax.json").write_text(json.dumps(records({"k": {"[16]": entry(4)}})))

    launched = _fake_shards(monkeypatch, write)
    run_spec = dataclasses.replace(spec(), seed=3, timer="direct", l2="cold", warmup_ms=1.5, rep_ms=7.0, windows=2,
                                   max_noise=0.002)
    outcome = sweep.run(run_spec, [[4, 16], [8, 16], [2, 16]], 2, tmp_path, lambda line: None, tmp_path / "cache")
    assert outcome.facts["conflicts"] == 0  # the strays' num_warps=8 were never read
    assert load(outcome.merged)["kernels"]["k"]["[16]"]["config"]["num_warps"] == 4
    for i, argv in enumerate(launched):
        ns = cli.build_parser().parse_args(argv[3:])
        assert RunOptions.from_namespace(ns).measurement() == RunOptions(
            seed=3, timer="direct", l2="cold", warmup_ms=1.5, rep_ms=7.0, windows=2, max_noise=0.002)
        assert ns.named_run_dir.parent == tmp_path / sweep.SWEEP_DIR / f"shard{i}" and ns.out is None


def test_a_ctrl_c_while_the_shards_start_leaves_none_of_those_started_running(tmp_path, monkeypatch):
    """Shard 0 started, the Ctrl-C comes as shard 1 starts: shard 0 is killed and waited for, and every
    shard's log is closed."""
    events, logs = [], []

    class Shard:
        def kill(self):
            events.append("killed")

        def wait(self, timeout=None):
            events.append("waited")
            return -9

    def start(argv, log=None):
        logs.append(log)
        if len(logs) == 2:
            raise KeyboardInterrupt
        return Shard()

    monkeypatch.setattr(sweep.launch, "start", start)
    monkeypatch.setattr(sweep, "sweep_devices", lambda backend, n: [0, 1])
    with pytest.raises(KeyboardInterrupt):
        sweep.run(spec(), [[4, 16], [8, 16], [2, 16]], 2, tmp_path, lambda line: None, tmp_path / "cache")
    assert events == ["killed", "waited"] and all(log.closed for log in logs)
