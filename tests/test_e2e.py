"""record -> replay end to end on the interpreter backend, in subprocesses, as a user runs it."""

import json
import shutil

import pytest
import torch
from conftest import REPO, load, run_dir_of, wait_gone

from harness.child.plugins.seeds import input_sha256, seed_everything
from harness.measure import tuning
from harness.providers import registry

pytestmark = pytest.mark.e2e
RESOURCES = REPO / "tests" / "resources"
SOFTMAX_KERNEL = "ops.softmax.softmax_kernel"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from conftest import run_harness

    out = tmp_path_factory.mktemp("runs")
    proc = run_harness("record", "softmax", "--backend", "interpreter", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir_of(proc), proc


def test_record_leaves_a_complete_run_dir(recorded):
    run_dir, proc = recorded
    assert run_dir.name.startswith("softmax_")
    for name in ("run.json", "shapes.yaml", "results.json", "run.log", "autotune_records/softmax.json",
                 "autotune_records/meta.json"):
        assert (run_dir / name).is_file(), name
    run = load(run_dir / "run.json")
    assert run["spec"]["mode"] == "record" and run["spec"]["backend"] == "interpreter"
    assert run["observed"]["versions"]["triton"] and run["observed"]["compiler"]["files_digest"]
    assert run["observed"]["timers_used"] == {"host": 4} and run["observed"]["exit_status"] == 0
    rows = load(run_dir / "results.json")["rows"]
    assert [(r["dtype"], r["shape"]) for r in rows] == [("fp32", [4, 16]), ("fp32", [3, 40]),
                                                        ("fp16", [4, 16]), ("fp16", [3, 40])]
    for r in rows:
        assert r["status"] == "SUCCESS" and r["timer"] == "host" and r["candidate_ms"] > 0
        assert r["samples"]["candidate"]["n"] == len(r["samples"]["candidate"]["raw"])
        assert SOFTMAX_KERNEL in r["configs"]
    records = load(run_dir / "autotune_records/softmax.json")
    assert len(records["kernels"][SOFTMAX_KERNEL]) == 4  # (N, dtype) keys
    log = (run_dir / "run.log").read_text()
    assert "results" in log and "\033[" not in log
    assert "run dir:" in proc.stdout
    assert proc.stdout.count("autotune: sweeping softmax_kernel") == 4  # live progress, once per key
    # No IR on the interpreter: the run goes on, and says why in run.json and in the log.
    assert run["observed"]["ir"] == {"collected": False, "reason": "backend 'interpreter' compiles no kernels"}
    assert "IR collection off: backend 'interpreter' compiles no kernels" in proc.stdout


def test_replay_pins_every_recorded_config(recorded, harness):
    run_dir, _ = recorded
    proc = harness("replay", run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay_dir = run_dir_of(proc)
    run = load(replay_dir / "run.json")
    assert run["spec"]["mode"] == "replay" and run["spec"]["replay_from"] == str(run_dir)
    assert run["observed"]["autotune"]["injected"] == 4
    assert run["observed"]["autotune"]["key_missing"] == 0
    assert not (replay_dir / "autotune_records").exists()  # replay runs write no records
    assert (replay_dir / "shapes.yaml").read_text().split("\n", 1)[1] == \
        (run_dir / "shapes.yaml").read_text().split("\n", 1)[1]
    recorded_rows = {r["case"]: r["configs"] for r in load(run_dir / "results.json")["rows"]}
    replayed_rows = {r["case"]: r["configs"] for r in load(replay_dir / "results.json")["rows"]}
    assert replayed_rows == recorded_rows
    # The replay's inputs are the record's, byte for byte (same seed, shapes and dtypes).
    recorded_inputs = {r["case"]: r["input_sha256"] for r in load(run_dir / "results.json")["rows"]}
    assert len(set(recorded_inputs.values())) == len(recorded_inputs) == 4  # one digest per case, all present
    assert {r["case"]: r["input_sha256"] for r in load(replay_dir / "results.json")["rows"]} == recorded_inputs
    assert all(not r["markers"] for r in load(replay_dir / "results.json")["rows"])
    assert "autotune: sweeping" not in proc.stdout
    # The header says what the replay kept from the record.
    assert f" timer={run['spec']['timer']} l2={run['spec']['l2']}\n" in proc.stdout


def test_edited_record_is_the_config_that_runs(recorded, harness, tmp_path):
    run_dir, _ = recorded
    edited = tmp_path / run_dir.name
    shutil.copytree(run_dir, edited)
    path = edited / "autotune_records/softmax.json"
    records = json.loads(path.read_text())
    entries = records["kernels"][SOFTMAX_KERNEL]
    key16 = next(k for k, e in entries.items() if e["key"][0] == 16 and "float32" in e["key"][1])
    current = entries[key16]["config"]["num_warps"]
    forced = 2 if current != 2 else 4
    entries[key16]["config"].update(num_warps=forced, num_stages=1)
    del entries[next(k for k, e in entries.items() if e["key"][0] == 40 and "float16" in e["key"][1])]
    path.write_text(json.dumps(records))

    proc = harness("replay", edited)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["case"]: r for r in load(run_dir_of(proc) / "results.json")["rows"]}
    assert rows["fp32-4x16"]["configs"][SOFTMAX_KERNEL] == f"num_warps={forced} num_stages=1"
    assert rows["fp32-4x16"]["markers"] == []
    missing = rows["fp16-3x40"]["markers"]
    assert len(missing) == 1 and "AUTOTUNE_REPLAY_FALLBACK" in missing[0] and "reason=key_missing" in missing[0]
    assert "AUTOTUNE_REPLAY_FALLBACK" in proc.stdout  # loud in the log too


def test_record_survives_a_crash_mid_run(harness, tmp_path):
    proc = harness("record", "crashy", "--backend", "interpreter", "--ops-path", RESOURCES / "crash_ops",
                   "--out", tmp_path)
    assert proc.returncode == 128 + 9, proc.stdout + proc.stderr  # killed by SIGKILL
    (run_dir,) = tmp_path.iterdir()
    rows = load(run_dir / "results.json")["rows"]
    assert [r["shape"] for r in rows] == [[300]] and rows[0]["status"] == "SUCCESS"
    records = tuning.load_records(run_dir / "autotune_records/crashy.json")
    assert len(records["kernels"]["ops.add.add_kernel"]) == 1
    assert "[1/2] crashy fp32-300 SUCCESS" in (run_dir / "run.log").read_text()
    assert "record INCOMPLETE: 1/2 rows, child killed by signal 9 (SIGKILL) during case fp32-2x700" in proc.stdout


def test_a_wrong_candidate_fails_its_row_with_no_time(harness, tmp_path):
    shapes = tmp_path / "one.yaml"
    shapes.write_text("wrong_add:\n  shapes: [[64]]\n")
    proc = harness("record", "wrong_add", "--backend", "interpreter", "--ops-path", RESOURCES / "wrong_ops",
                   "--shapes", shapes, "--out", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (row,) = load(run_dir_of(proc) / "results.json")["rows"]
    assert row["status"] == "FAILED"
    assert row["baseline_ms"] is None and row["candidate_ms"] is None and row["speedup"] is None
    assert "samples" not in row and row["timer"] is None
    assert "candidate disagrees with baseline" in row["error"]
    assert "[1/1] wrong_add fp32-64 FAILED AssertionError: candidate disagrees with baseline" in proc.stdout


@pytest.mark.parametrize("op,status", [("nan_through", "SUCCESS"), ("nan_own", "FAILED"), ("static_some", "SUCCESS"),
                                       ("bare_inputs", "FAILED"), ("baseline_raises", "FAILED"),
                                       ("candidate_raises", "FAILED")])
def test_operators_at_the_edges_pass_or_fail_with_a_clear_error(harness, tmp_path, op, status):
    # tests/resources/edge_ops: nan_through propagates its inputs' NaN as torch does, nan_own writes
    # a NaN of its own; static_some's kernel refuses its smallest block by a static_assert, and the
    # sweep goes on; bare_inputs returns a tensor, not a tuple; *_raises: which side raised.
    shapes = tmp_path / "one.yaml"
    shapes.write_text(f"{op}:\n  shapes: [[300]]\n")
    proc = harness("record", op, "--backend", "interpreter", "--ops-path", RESOURCES / "edge_ops", "--shapes", shapes,
                   "--out", tmp_path)
    (row,) = load(run_dir_of(proc) / "results.json")["rows"]
    assert row["status"] == status, proc.stdout
    assert proc.returncode == (0 if status == "SUCCESS" else 1)
    if op.endswith("_raises"):
        side, what = ("baseline", "torch reference") if op == "baseline_raises" else ("candidate", "kernel")
        assert row["error"] == f"{side} raised RuntimeError: {what} not implemented"
        assert f"FAILED {side} raised RuntimeError: {what} not implemented" in proc.stdout
    if op == "bare_inputs":
        assert row["error"].startswith("TypeError: operator bare_inputs: inputs() must return a tuple of arguments")
    if op == "static_some":
        (config,) = row["configs"].values()
        assert config.split()[0] in ("BLOCK=512", "BLOCK=1024", "BLOCK=2048")  # never the refused one


def test_each_case_runs_with_the_runs_imports_frozen_out_of_the_collectors_view(harness, tmp_path):
    # tests/resources/heap_ops: the op's inputs refuse to be built while the imports are not frozen.
    shapes = tmp_path / "one.yaml"
    shapes.write_text("heap_frozen:\n  shapes: [[300]]\n")
    proc = harness("record", "heap_frozen", "--backend", "interpreter", "--ops-path", RESOURCES / "heap_ops",
                   "--shapes", shapes, "--out", tmp_path)
    (row,) = load(run_dir_of(proc) / "results.json")["rows"]
    assert row["status"] == "SUCCESS" and proc.returncode == 0, row["error"]


def test_a_poisoned_capture_stops_the_run(harness, tmp_path):
    # tests/resources/poison_ops: the capture of the first case fails as a dead CUDA context does.
    shapes = tmp_path / "two.yaml"
    shapes.write_text("poisoned:\n  shapes: [[64], [128]]\n")
    proc = harness("record", "poisoned", "--backend", "interpreter", "--ops-path", RESOURCES / "poison_ops",
                   "--shapes", shapes, "--out", tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # stopped before its last case
    run_dir = run_dir_of(proc)
    rows = load(run_dir / "results.json")["rows"]
    assert [r["case"] for r in rows] == ["fp32-64"]  # the second case never ran
    assert rows[0]["status"] == "FAILED" and rows[0]["candidate_ms"] is None
    assert rows[0]["markers"] == ["CAPTURE_POISONED phase=capture detail='CUDA error: unknown error'"]
    outcome = load(run_dir / "run.json")["observed"]["outcome"]
    reason = "stopped: capture poisoned the accelerator context: CUDA error: unknown error"
    assert outcome == {"status": "INCOMPLETE", "rows_done": 1, "rows_planned": 2, "reason": reason,
                       "running_case": None, "exit_code": 3}
    # The poisoned case's row is written: the stop came between cases, so no case is named as running.
    assert f"record INCOMPLETE: 1/2 rows, {reason}; run dir" in proc.stdout


def test_user_operator_from_ops_path_records_and_replays(harness, tmp_path):
    proc = harness("record", "scale3", "--backend", "cpu", "--ops-path", RESOURCES / "user_ops",
                   "--dtypes", "fp32", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    assert load(run_dir / "run.json")["spec"]["provider"].endswith("scale.py")
    proc = harness("replay", run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load(run_dir_of(proc) / "run.json")["observed"]["autotune"]["injected"] == 2


def test_inputs_drawn_from_numpy_and_random_replay_byte_for_byte(harness, tmp_path):
    # Each process starts numpy's and Python's generators from the OS's entropy: only the seeds make
    # the replay's inputs the record's.
    shapes = tmp_path / "draws.yaml"
    shapes.write_text("draws:\n  shapes: [[3, 5], [8]]\n")
    proc = harness("record", "draws", "--backend", "interpreter", "--ops-path", RESOURCES / "seeded_ops",
                   "--shapes", shapes, "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    proc = harness("replay", run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded, replayed = ({r["case"]: r["input_sha256"] for r in load(d / "results.json")["rows"]}
                          for d in (run_dir, run_dir_of(proc)))
    assert len(set(recorded.values())) == len(recorded) == 2 and all(recorded.values())
    assert replayed == recorded
    assert wait_gone(str(tmp_path)) == []  # neither run left a process behind


def test_options_shapes_dtypes_out(harness, tmp_path):
    shapes = tmp_path / "my.yaml"
    shapes.write_text("gelu:\n  shapes: [[5, 7]]\n")
    proc = harness("record", "gelu", "--backend", "interpreter", "--shapes", shapes, "--dtypes", "fp16",
                   "--device", "0", "--out", tmp_path / "out", "--seed", "7")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    assert run_dir.parent == tmp_path / "out"
    spec = load(run_dir / "run.json")["spec"]
    assert spec["dtypes"] == ["fp16"] and spec["seed"] == 7 and spec["shapes_source"].endswith("my.yaml#gelu")
    (row,) = load(run_dir / "results.json")["rows"]
    assert row["case"] == "fp16-5x7"
    # The inputs are those seed 7 builds, not those of the default seed.
    gelu, _ = registry.load("gelu", [])

    def digest_at(seed):
        seed_everything(seed)
        return input_sha256(gelu.inputs((5, 7), torch.float16, "cpu"))

    assert row["input_sha256"] == digest_at(7) != digest_at(0)


def test_windows_given_to_a_record_reach_the_childs_timer_and_its_replays(harness, tmp_path):
    # tests/resources/window_ops: the direct timer's windows on the host clock, so a row's windows_ms
    # counts the windows the child's Timer timed.
    shapes = tmp_path / "one.yaml"
    shapes.write_text("windowed:\n  shapes: [[64]]\n")
    proc = harness("record", "windowed", "--backend", "interpreter", "--ops-path", RESOURCES / "window_ops",
                   "--shapes", shapes, "--windows", "3", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_dir_of(proc)
    proc = harness("replay", record)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for run_dir in (record, run_dir_of(proc)):
        assert load(run_dir / "run.json")["spec"]["windows"] == 3
        (row,) = load(run_dir / "results.json")["rows"]
        assert row["status"] == "SUCCESS" and row["timer"] == "direct"
        assert [len(row["samples"][side]["windows_ms"]) for side in ("baseline", "candidate")] == [3, 3]


def test_windows_a_timer_cannot_take_are_said_in_one_line_and_in_run_json(harness, tmp_path):
    shapes = tmp_path / "one.yaml"
    shapes.write_text("pointwise:\n  shapes: [[64]]\n")
    proc = harness("record", "add", "--backend", "interpreter", "--shapes", shapes, "--windows", "2",
                   "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("--windows 2 not applied: the host timer takes no windows; each side timed in one window"
            in proc.stdout + proc.stderr)
    run_dir = run_dir_of(proc)
    assert load(run_dir / "run.json")["observed"]["windows"] == {"applied": False,
                                                                 "reason": "the host timer takes no windows"}
    rows = load(run_dir / "results.json")["rows"]
    assert rows and all("windows_ms" not in json.dumps(row) for row in rows)


def _error(proc, code=2):
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr  # one clear line, no traceback
    return lines[0]


def test_unknown_backend_lists_known(harness):
    line = _error(harness("record", "softmax", "--backend", "tpu"))
    assert "unknown backend 'tpu'" in line and "interpreter" in line


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA GPU")
def test_gpu_backend_without_device_suggests_interpreter(harness):
    line = _error(harness("record", "softmax", "--backend", "cuda"))
    assert "no device found" in line and "--backend interpreter" in line


def test_unknown_op_and_bad_dtype(harness):
    assert "unknown operator 'nope'" in _error(harness("record", "nope", "--backend", "cpu"))
    # Bad input with an exit code of its own (4): a batch tells it from other failures.
    assert "does not take dtype" in _error(harness("record", "scale3", "--backend", "cpu", "--ops-path",
                                                   RESOURCES / "user_ops", "--dtypes", "bf16"), code=65)


def test_bad_shape_file_names_file_and_key(harness, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("softmax:\n  shapes: [[0, 4]]\n")
    line = _error(harness("record", "softmax", "--backend", "cpu", "--shapes", bad))
    assert str(bad) in line and "key 'softmax'" in line


def test_replay_refuses_missing_corrupt_and_cross_backend(recorded, harness, tmp_path):
    assert "does not exist" in _error(harness("replay", tmp_path / "nope"))
    corrupt = tmp_path / "corrupt"
    shutil.copytree(recorded[0], corrupt)
    (corrupt / "run.json").write_text("{ half a file")
    assert "corrupt" in _error(harness("replay", corrupt))
    no_records = tmp_path / "no_records"
    shutil.copytree(recorded[0], no_records)
    shutil.rmtree(no_records / "autotune_records")
    assert "no autotune records" in _error(harness("replay", no_records))
    line = _error(harness("replay", recorded[0], "--backend", "cuda"))
    assert "recorded on backend 'interpreter'" in line
