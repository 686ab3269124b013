"""The run spec: frozen once resolved (every change is a new spec), its FlagGems options a typed
value decoded once from run.json, whose JSON keeps its shape."""

import dataclasses
import json
import math

import pytest
from conftest import REPO, load
from result_rows import result_row

import backends
from harness import cli
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.sessions import resolve, run

CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"
COMPLETE = {"status": "COMPLETE", "rows_done": 1, "rows_planned": None, "reason": None, "running_case": None}


def flaggems_spec(**options) -> spec_mod.RunSpec:
    fg = spec_mod.FlagGemsOptions("flaggems", str(CHECKOUT), "benchmark/test_mm.py", "test_mm", **options)
    return spec_mod.RunSpec(op="mm", backend="interpreter", mode="record", device=0, dtypes=[],
                            shapes_source="upstream (level core)", timer="host", provider="flaggems:flaggems",
                            flaggems=fg)


def test_a_resolved_spec_cannot_be_written():
    spec = flaggems_spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.preset_records = "merged.json"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.flaggems.shapes_file = "shapes.yaml"
    changed = dataclasses.replace(spec, preset_records="merged.json")
    assert changed.preset_records == "merged.json" and spec.preset_records is None


def test_flaggems_options_are_typed_in_memory_and_a_plain_object_in_run_json(tmp_path):
    spec = flaggems_spec(level="comprehensive", flagtune="1")
    spec_mod.write(tmp_path, spec)
    stored = load(tmp_path / rundir.RUN_JSON)["spec"]
    # The shape run.json has always had (spec version 1): the options' fields as an object.
    assert stored["version"] == 1
    assert stored["flaggems"] == {"repo": "flaggems", "root": str(CHECKOUT), "test_file": "benchmark/test_mm.py",
                                  "function": "test_mm", "level": "comprehensive", "shapes_file": None,
                                  "flagtune": "1", "libtuner_cache": "private"}
    read = spec_mod.read(tmp_path)
    assert isinstance(read.flaggems, spec_mod.FlagGemsOptions) and read == spec
    assert read.flaggems.node == "benchmark/test_mm.py::test_mm"


@pytest.mark.parametrize(("flaggems", "message"), [
    ("mm", "'flaggems' is not an object"),
    ({"repo": "flaggems", "test_file": "benchmark/test_mm.py", "function": "test_mm"}, "flaggems lacks root"),
])
def test_a_bad_flaggems_section_says_what_is_wrong_in_one_line(tmp_path, flaggems, message):
    data = {"spec": {**flaggems_spec().to_json(), "flaggems": flaggems}}
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps(data))
    with pytest.raises(spec_mod.SpecError) as info:
        spec_mod.read(tmp_path)
    assert str(info.value) == f"{tmp_path / rundir.RUN_JSON}: {message}"


def test_the_spec_written_into_a_run_dir_is_the_spec_the_run_goes_on_with(tmp_path):
    ours = tmp_path / "ours.yaml"
    ours.write_text("BlasBenchmark:\n  shapes: [[1, 4, 8, 4]]\n")
    resolved = flaggems_spec(shapes_file=str(ours))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    written, shown, planned = run._write_inputs(run_dir, resolved, [])
    # The run reads its shapes from the copy in the run dir, and so does a replay of it.
    assert written.flaggems.shapes_file == str(run_dir / rundir.SHAPES_YAML)
    assert spec_mod.read(run_dir) == written and (shown, planned) == (resolved.shapes_source, None)
    assert resolved.flaggems.shapes_file == str(ours)
    assert "BlasBenchmark" in (run_dir / rundir.SHAPES_YAML).read_text()


def flaggems_record(tmp_path, root: str):
    """A finished FlagGems record's run dir, written by hand, its checkout recorded at `root`."""
    rec = tmp_path / "runs" / "rec"
    rec.mkdir(parents=True)
    (rec / rundir.SHAPES_YAML).write_text("BlasBenchmark:\n  shapes: [[1, 4, 8, 4]]\n")
    recorded = flaggems_spec(shapes_file=str(rec / rundir.SHAPES_YAML))
    spec_mod.write(rec, dataclasses.replace(recorded, flaggems=dataclasses.replace(recorded.flaggems, root=root)))
    rundir.merge_json(rec / rundir.RUN_JSON, {"observed": {"outcome": COMPLETE}})
    (rec / rundir.RECORDS_DIR).mkdir()
    rundir.atomic_write_json(rec / rundir.RECORDS_DIR / "mm.json", {"format": 1, "op": "mm", "kernels": {}})
    rundir.atomic_write_json(rec / rundir.RESULTS_JSON, {"format": 1, "rows": [result_row(case="fp32-4x4,4x8")]})
    return rec


def test_a_flaggems_replay_is_a_new_spec_with_the_moved_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("USE_FLAGTUNE", raising=False)  # the record's FlagTune switch, off
    rec = flaggems_record(tmp_path, root="/moved/away/flaggems")
    args = cli.parse_request(["replay", str(rec), "--flaggems-dir", f"flaggems={CHECKOUT}",
                              "--libtuner-cache", "user"])
    replay, _, _ = resolve.resolve_replay(args)
    assert replay.mode == "replay" and replay.replay_from == str(rec.resolve())
    assert replay.flaggems == dataclasses.replace(spec_mod.read(rec).flaggems, root=str(CHECKOUT.resolve()),
                                                  shapes_file=str(rec.resolve() / rundir.SHAPES_YAML),
                                                  libtuner_cache="user")
    assert spec_mod.read(rec).flaggems.root == "/moved/away/flaggems"  # the record is left as it was


def test_replaying_the_newest_record_leaves_the_parsed_arguments_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("USE_FLAGTUNE", raising=False)
    rec = flaggems_record(tmp_path, root=str(CHECKOUT))
    args = cli.parse_request(["replay", "--out", str(tmp_path / "runs")])
    replay, _, _ = resolve.resolve_replay(args)
    assert replay.replay_from == str(rec.resolve()) and args.target is None
    assert f"replaying the newest replayable record run: {rec}" in capsys.readouterr().out


def test_l2_round_trips_through_run_json_and_a_run_json_without_it_reads_as_warm(tmp_path):
    cold = dataclasses.replace(flaggems_spec(), l2="cold", timer="profiler")
    spec_mod.write(tmp_path, cold)
    assert load(tmp_path / rundir.RUN_JSON)["spec"]["l2"] == "cold"
    assert spec_mod.read(tmp_path) == cold
    # A run dir written before --l2 existed measured on a warm L2, and its replays must too.
    old = {k: v for k, v in flaggems_spec().to_json().items() if k != "l2"}
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps({"spec": old}))
    assert spec_mod.read(tmp_path).l2 == "warm"


def test_an_unknown_l2_in_run_json_says_what_is_wrong_in_one_line(tmp_path):
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps({"spec": {**flaggems_spec().to_json(), "l2": "tepid"}}))
    with pytest.raises(spec_mod.SpecError) as info:
        spec_mod.read(tmp_path)
    assert str(info.value) == f"{tmp_path / rundir.RUN_JSON}: l2 'tepid' not one of ('warm', 'cold')"


@pytest.mark.parametrize(("fields", "message"), [
    ({"only": "timings"}, "only 'timings' not one of ('timing', 'passes', 'configs')"),
    ({"only": "configs", "mode": "replay"}, "a configs-only replay (only a record has configs of its own)"),
])
def test_what_a_run_is_for_is_checked_as_run_json_is_read(tmp_path, fields, message):
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps({"spec": {**flaggems_spec().to_json(), **fields}}))
    with pytest.raises(spec_mod.SpecError) as info:
        spec_mod.read(tmp_path)
    assert str(info.value) == f"{tmp_path / rundir.RUN_JSON}: {message}"


@pytest.mark.parametrize(("only", "passes", "token"), [
    (None, True, False), ("timing", False, False), ("passes", True, True), ("configs", False, True)])
def test_what_a_run_is_for_says_whether_it_carries_the_passes_and_how_it_times(tmp_path, only, passes, token):
    spec = dataclasses.replace(flaggems_spec(), only=only)
    spec_mod.write(tmp_path, spec)
    assert spec_mod.read(tmp_path) == spec
    assert (spec.passes, spec.token_timing) == (passes, token)


def test_a_replay_keeps_the_recorded_l2_and_timer(tmp_path, monkeypatch):
    rec = tmp_path / "runs" / "softmax_rec"
    rec.mkdir(parents=True)
    (rec / rundir.SHAPES_YAML).write_text("softmax:\n  shapes: [[4, 16]]\n  dtypes: [fp32]\n")
    recorded = spec_mod.RunSpec(op="softmax", backend="cuda", mode="record", device=0, dtypes=["fp32"],
                                shapes_source=f"{rec / rundir.SHAPES_YAML}#softmax", timer="profiler", l2="cold")
    spec_mod.write(rec, recorded)
    rundir.merge_json(rec / rundir.RUN_JSON, {"observed": {"outcome": COMPLETE}})
    (rec / rundir.RECORDS_DIR).mkdir()
    rundir.atomic_write_json(rec / rundir.RECORDS_DIR / "softmax.json", {"format": 1, "op": "softmax", "kernels": {}})
    rundir.atomic_write_json(rec / rundir.RESULTS_JSON, {"format": 1, "rows": [result_row(case="fp32-4x16")]})
    monkeypatch.setattr(backends.Backend, "enumerate_devices", lambda self, *a, **k: [0])  # a cuda host
    replay, _, _ = resolve.resolve_replay(cli.parse_request(["replay", str(rec)]))
    assert replay.mode == "replay" and (replay.timer, replay.l2) == ("profiler", "cold")


def test_replay_takes_no_l2_of_its_own():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["replay", "runs/x", "--l2", "warm"])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("timer", "nope", "timer 'nope' not one of"), ("seed", "x", "seed is 'x', not of type int"),
    ("seed", True, "seed is True, not of type int"), ("device", 1.5, "device is 1.5, not of type int"),
    ("dtypes", "fp16", "dtypes is 'fp16', not of type list[str]"), ("rep_ms", None, "rep_ms is None, not of type"),
    ("windows", 0, "windows 0 is not an integer from 1 to 64"), ("windows", 2.0, "windows is 2.0, not of type int"),
    ("replay_from", 3, "replay_from is 3, not of type str | None"),
    # Ranged as their options are (one rule): each of these failed every row of a replay, or hung it.
    ("seed", -1, "seed -1 is not an integer from 0 to 4294967295"),
    ("seed", 2**32, "seed 4294967296 is not an integer from 0 to 4294967295"),
    ("rep_ms", math.nan, "rep_ms nan is not a number of ms from 0 to 600000"),
    ("warmup_ms", 1e308, r"warmup_ms 1e\+308 is not a number of ms from 0 to 600000"),
    ("windows", 1000, "windows 1000 is not an integer from 1 to 64"),
    ("device", -3, "device -3 is not a device index")])
def test_a_hand_edited_spec_value_is_refused_naming_the_field(tmp_path, field, value, message):
    spec = spec_mod.RunSpec(op="softmax", backend="interpreter", mode="record", device=0, dtypes=["fp32"],
                            shapes_source="s.yaml#softmax", rep_ms=2)
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps({"spec": {**spec.to_json(), field: value}}))
    with pytest.raises(spec_mod.SpecError, match=message.replace("|", r"\|").replace("[", r"\[")):
        spec_mod.read(tmp_path)
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps({"spec": spec.to_json()}))
    assert spec_mod.read(tmp_path).rep_ms == 2  # an int where a float is typed reads
