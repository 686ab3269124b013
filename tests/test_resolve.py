"""Resolving a replay (and devices, and yaml inputs): every bad source is refused in one line naming
the file and what is wrong; an incomplete record is replayed, loudly, and the replay says so."""

import json
import os
import re
from pathlib import Path

import pytest
from conftest import load, run_dir_of
from result_rows import result_row

import backends
from harness import cli
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.core.errors import UsageError
from harness.providers import shapes
from harness.sessions import ab, resolve
from harness.sessions.ab import session as ab_session
from ops import DTYPES_RULE

KILLED = {"status": "INCOMPLETE", "rows_done": 13, "rows_planned": 20, "reason": "killed by signal 9",
          "running_case": "fp32-2x8"}
COMPLETE = {"status": "COMPLETE", "rows_done": 2, "rows_planned": 2, "reason": None, "running_case": None}
KERNEL = "ops.softmax.softmax_kernel"


def record_dir(tmp_path, outcome=COMPLETE, backend="interpreter", kernels=None, name="rec") -> Path:
    """A record run dir as the harness leaves it, written by hand."""
    d = tmp_path / name
    d.mkdir()
    spec = spec_mod.RunSpec(op="softmax", backend=backend, mode="record", device=0, dtypes=["fp32"],
                            shapes_source="tiny.yaml#norm", timer="host", warmup_ms=0.0, rep_ms=0.0)
    spec_mod.write(d, spec)
    if outcome is not None:
        rundir.merge_json(d / rundir.RUN_JSON, {"observed": {"outcome": outcome}})
    shapes.write_used(d / rundir.SHAPES_YAML, "softmax", [[2, 8], [3, 16]], ["fp32"], "tiny.yaml#norm")
    (d / rundir.RECORDS_DIR).mkdir()
    rundir.atomic_write_json(d / rundir.RECORDS_DIR / "softmax.json",
                             {"format": 1, "op": "softmax", "kernels": kernels or {}})
    rundir.atomic_write_json(d / rundir.RESULTS_JSON, {"format": 1, "rows": [result_row("softmax", shape=(2, 8))]})
    return d


def replay(*argv):
    return resolve.resolve_replay(cli.parse_request(["replay", *map(str, argv)]))


def refusal(*argv) -> str:
    with pytest.raises(UsageError) as info:
        replay(*argv)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_complete_record_replays_quietly_and_carries_its_outcome(tmp_path, capsys):
    d = record_dir(tmp_path)
    run_spec, shape_list, _ = replay(d)
    assert shape_list == [[2, 8], [3, 16]] and run_spec.replay_source_outcome == COMPLETE
    assert capsys.readouterr().err == ""


def test_incomplete_record_warns_once_and_the_replay_spec_says_so(tmp_path, capsys):
    d = record_dir(tmp_path, outcome=KILLED)
    run_spec, _, _ = replay(d)
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {d} is an incomplete record (13/20 rows; killed by signal 9 during case fp32-2x8): cases it "
        "never reached have no recorded config and will sweep live"]
    # Fixed at resolve time, and round-trips through the replay's run.json.
    out = tmp_path / "replay_dir"
    out.mkdir()
    spec_mod.write(out, run_spec)
    assert spec_mod.read(out) == run_spec and spec_mod.read(out).replay_source_outcome == KILLED


def test_record_without_outcome_is_incomplete_reason_unknown(tmp_path, capsys):
    d = record_dir(tmp_path, outcome=None)
    run_spec, _, _ = replay(d)
    assert run_spec.replay_source_outcome["status"] == "INCOMPLETE"
    assert run_spec.replay_source_outcome["rows_done"] == 1  # what its results.json holds
    assert f"warning: {d} is an incomplete record (1 row; outcome not recorded: the recording process was " \
           "killed)" in capsys.readouterr().err


def test_incomplete_record_that_chose_nothing_is_refused_saying_why(tmp_path):
    d = record_dir(tmp_path, outcome=KILLED | {"rows_done": 0, "running_case": None})
    (d / rundir.RECORDS_DIR / "softmax.json").unlink()
    assert refusal(d) == (f"cannot replay {d}: it is an incomplete record (0/20 rows; killed by signal 9) and "
                          f"replay source has no autotune records: {d / rundir.RECORDS_DIR / 'softmax.json'} is "
                          "missing")


@pytest.mark.parametrize("name,text,match", [
    (rundir.RESULTS_JSON, '{"format": 1, "rows": [{"ca',
     "results.json does not read as results: not JSON \\(Unterminated string"),
    (rundir.RESULTS_JSON, '{"format": 1}', "results.json does not read as results: it holds no 'rows' list"),
    (rundir.SHAPES_YAML, "softmax:\n  shapes: [[2, 8]\n  dtypes: [fp32]\n", "shapes.yaml:3:3: not valid yaml: "),
    (f"{rundir.RECORDS_DIR}/softmax.json", '{"format": 1, "kern', "softmax.json are corrupt"),
    (f"{rundir.RECORDS_DIR}/softmax.json", json.dumps({"format": 1, "kernels": {KERNEL: {"[8]": {"key": [8]}}}}),
     f"softmax.json are corrupt: kernel {KERNEL} key \\[8\\]: None is not a config with kwargs"),
    (f"{rundir.RECORDS_DIR}/softmax.json", json.dumps({"format": 1, "kernels": {KERNEL: {"[8]": {"config": {
        "kwargs": {"BLOCK": 8}, "num_warps": "x", "num_stages": 1}}}}}),
     f"softmax.json are corrupt: kernel {KERNEL} key \\[8\\]: num_warps='x' is not a whole number >= 1"),
    (f"{rundir.RECORDS_DIR}/softmax.json", json.dumps({"format": 1, "kernels": {KERNEL: {"[8]": {"config": {
        "kwargs": {"BLOCK": {"a": 1}}, "num_warps": 4, "num_stages": 1}}}}}),
     f"softmax.json are corrupt: kernel {KERNEL} key \\[8\\]: kwarg BLOCK=.* is no constexpr value"),
    (rundir.RUN_JSON, '{"spec": {"op": "softmax"', "run.json is corrupt"),
])
def test_corrupt_file_refuses_the_replay_naming_it(tmp_path, name, text, match):
    d = record_dir(tmp_path)
    (d / name).write_text(text)
    line = refusal(d)
    assert line.startswith(f"cannot replay {d}: ")
    assert re.search(match, line), line


def test_a_refusal_is_the_only_line_even_for_an_incomplete_record(tmp_path, capsys):
    assert "device(s) [5] do not exist here" in refusal(record_dir(tmp_path, outcome=KILLED), "--device", "5")
    assert capsys.readouterr().err == ""


def test_corrupt_outcome_is_refused(tmp_path):
    d = record_dir(tmp_path, outcome="done")
    assert "observed.outcome 'done' is not an outcome" in refusal(d)


def test_replay_of_a_replay_names_its_record(tmp_path):
    d = record_dir(tmp_path)
    run_spec, _, _ = replay(d)
    second = tmp_path / "second"
    second.mkdir()
    spec_mod.write(second, run_spec)
    assert refusal(second) == (f"cannot replay {second}: it is a replay (of {d.resolve()}); replay its record: "
                               f"nox -s replay -- {d.resolve()}")


def test_record_of_an_absent_backend_says_no_backend_can_replay_it(tmp_path, monkeypatch):
    d = record_dir(tmp_path, backend="cuda")
    monkeypatch.setattr(backends.get("cuda").__class__, "enumerate_devices",
                        lambda self, *a, **k: [] if self.name == "cuda" else [0])
    line = refusal(d)
    assert line == (f"cannot replay {d}: it was recorded on backend 'cuda' and this machine has no cuda device; "
                    "configs do not carry across backends, so no other backend (not --backend interpreter "
                    "either) can replay it: replay it on a cuda host")
    assert "configs do not carry across backends" in refusal(d, "--backend", "interpreter")


def test_device_beyond_the_backend_is_refused_with_the_valid_indices(tmp_path, monkeypatch):
    # The interpreter's devices are virtual, one per CPU core.
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    with pytest.raises(UsageError) as info:
        resolve.resolve_device(backends.get("interpreter"), 5)
    assert str(info.value) == "backend 'interpreter': device(s) [5] do not exist here; it has 1 device, " \
                              "valid --device: 0"
    assert resolve.resolve_device(backends.get("interpreter"), 0) == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert resolve.resolve_device(backends.get("interpreter"), 2) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(UsageError, match=r"device\(s\) \[2\] do not exist here; it has 2 devices, valid --device: "
                                         r"0, 1$"):
        resolve.resolve_device(backends.get("cuda"), 2)


def test_visible_devices_by_uuid_are_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5ad3c1e2")
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES='GPU-5ad3c1e2' is not a list of device indices"):
        resolve.resolve_device(backends.get("cuda"), None)


@pytest.mark.parametrize("load_it", [shapes.load, ab.load_plan])
def test_bad_yaml_names_file_and_line_in_one_line(tmp_path, load_it):
    path = tmp_path / "in.yaml"
    path.write_text("ops: [softmax]\nrepeats: 3\na:\n  env: {X: 1\n  label: a\n")
    with pytest.raises(ValueError) as info:
        load_it(path)
    text = str(info.value)
    assert f"{path}:5:8: not valid yaml: " in text
    assert "\n" not in text and "<unicode string>" not in text


@pytest.mark.e2e
def test_incomplete_record_replays_end_to_end_and_its_run_json_says_so(harness, tmp_path):
    d = record_dir(tmp_path, outcome=KILLED)
    proc = harness("replay", d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"warning: {d} is an incomplete record (13/20 rows; killed by signal 9 during case fp32-2x8): cases it "
        "never reached have no recorded config and will sweep live")
    run = load(run_dir_of(proc) / rundir.RUN_JSON)
    assert run["spec"]["replay_source_outcome"] == KILLED
    assert run["observed"]["autotune"]["key_missing"] == 2  # nothing recorded: both cases swept live


@pytest.mark.parametrize("flag", ["--seed", "--timer", "--l2", "--warmup-ms", "--rep-ms", "--windows",
                                  "--sweep-devices"])
def test_a_record_option_given_to_replay_is_refused_by_name(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["replay", "some_run", flag, "3"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{flag} is record-only: a replay measures as its record did" in err


@pytest.mark.parametrize("value", ["fp16,fp16", "fp99", ","])
def test_a_dtype_list_on_the_command_line_follows_the_shape_files_rule(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["record", "add", "--dtypes", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{value!r} must be {DTYPES_RULE}, comma-separated" in err
    assert cli.build_parser().parse_args(["record", "add", "--dtypes", "fp16, bf16"]).dtypes == ["fp16", "bf16"]


# --- one selection grammar: [REPO:]OP[@FILE] for every command ---------------------------------------
def record(*argv):
    return resolve.resolve_record(cli.parse_request(["record", *map(str, argv)]))


USER_OPS = Path(__file__).parent / "resources" / "user_ops"


@pytest.mark.parametrize("text", ["softmax", "builtin:softmax", "softmax@softmax", "builtin:softmax@softmax"])
def test_record_takes_a_builtin_op_in_the_batch_grammar(text):
    run_spec, _, _ = record(text, "--backend", "interpreter")
    assert run_spec.op == "softmax" and run_spec.provider == "builtin"


def test_record_takes_an_ops_path_op_in_the_batch_grammar():
    run_spec, _, _ = record("path:scale3@scale", "--backend", "interpreter", "--ops-path", USER_OPS)
    assert run_spec.op == "scale3" and run_spec.provider == str(USER_OPS / "scale.py")


@pytest.mark.parametrize(("text", "error"), [
    ("path:softmax", "'path:softmax': operator 'softmax' is builtin:softmax@softmax (builtin)"),
    ("builtin:softmax@mm", "'builtin:softmax@mm': operator 'softmax' is builtin:softmax@softmax (builtin)"),
])
def test_a_selection_whose_repo_or_file_is_not_where_the_op_is_is_refused(text, error):
    with pytest.raises(UsageError) as info:
        record(text, "--backend", "interpreter")
    assert str(info.value) == error


def test_ab_takes_the_same_grammar_before_any_step():
    plan = ab.resolve_plan(cli.parse_request(["ab", "--ops", "builtin:softmax", "mm@mm",
                                                          "--backend", "interpreter"]))
    ab_session.check_plan(plan)
    plan.ops = ["path:softmax"]
    with pytest.raises(UsageError, match="operator 'softmax' is builtin:softmax@softmax"):
        ab_session.check_plan(plan)


@pytest.mark.parametrize(("backend", "given", "resolved"), [
    ("cuda", None, 0.001), ("cuda", 0.0, 0.0), ("cuda", 0.02, 0.02), ("interpreter", None, 0.0)])
def test_a_records_max_noise_is_the_backends_unless_given_and_zero_turns_it_off(backend, given, resolved,
                                                                              monkeypatch):
    """On a GPU a side stops sampling at 0.1% by default (a third of the budget: backends.base says why);
    an explicit 0 times the whole budget; the interpreter's timings are no numbers to stop on."""
    monkeypatch.setattr(resolve, "resolve_device", lambda backend, device: 0)  # no GPU here
    argv = ["record", "add", "--backend", backend, *(["--max-noise", f"{given:%}"] if given is not None else [])]
    request = cli.parse_request(argv)
    spec = resolve._record_spec(request, backends.get(backend), op="add", dtypes=["fp32"], shapes_source="x")
    assert spec.max_noise == pytest.approx(resolved)
