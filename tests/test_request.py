"""The run request: `to_argv` renders exactly the flags harness/cli.py parses, for every field, and
the sessions that start record/replay children build their command lines through it."""

import dataclasses
import json
from pathlib import Path

import pytest

from harness import cli
from harness.core import launch
from harness.core.options import RunOptions, declared
from harness.core.request import RunRequest
from harness.providers.catalog import Entry
from harness.sessions import ab, batch
from harness.sessions.ab import runner as ab_runner

# Each request field beside its options and the argparse name it comes back as (an option's is its field's).
DEST = {"command": "command", "target": None, "sweep_devices": "sweep_devices", "ir": "ir",
        "only": "only", "color": "color", "out": "out",
        "run_dir": "named_run_dir", "precompile": "precompile", "triton_cache": "triton_cache", "cases": "cases",
        "measuring_host": "measuring_host", "device_gate": "device_gate"}

RECORD = RunRequest("record", "flaggems:mm@blas", RunOptions(
    backend="interpreter", device=3, shapes=Path("/s/shapes.yaml"), dtypes=("fp16", "bf16"),
    ops_paths=("/ops/a", "mod.b"), flaggems_dirs=("flaggems=/fg", "v=/other"), level="comprehensive", flagtune="1",
    libtuner_cache="user", seed=7, timer="direct", l2="cold", warmup_ms=2.5, rep_ms=10.0), sweep_devices=2, ir=False,
    only="configs", color="never", out=Path("/runs/x"), precompile=False, triton_cache=Path("/cache/a"))
REPLAY = RunRequest("replay", "/runs/x/mm_1", RunOptions(
    backend="cuda", device=1, shapes=Path("/s/other.yaml"), dtypes=("fp32",), ops_paths=("/ops/a",),
    flaggems_dirs=("flaggems=/fg",), level="core", flagtune="0", libtuner_cache="private"), ir=False, only="passes",
    color="always",
    run_dir=Path("/runs/y/mm_2"), triton_cache=Path("/cache/b"), cases=("fp32-4x8,8", "fp32-2x2#2"),
    measuring_host=Path("/tmp/host-A-1.sock"), device_gate=Path("/tmp/ab/device.gate"))


@pytest.mark.parametrize("request_", [RECORD, REPLAY], ids=["record", "replay"])
def test_every_field_round_trips_through_the_cli_parser(request_):
    assert set(DEST) | {"options"} == {f.name for f in dataclasses.fields(RunRequest)}  # a new field needs its flag
    ns = cli.build_parser().parse_args(request_.to_argv())
    assert RunOptions.from_namespace(ns) == request_.options  # every option, derived from its declaration
    for field in DEST:
        if request_.command == "replay" and field == "sweep_devices":
            assert getattr(ns, field, None) is None  # replay refuses such an option, and the request renders none
            continue
        if request_.command == "record" and field == "cases":
            assert getattr(ns, field, None) is None  # a record runs every case (RunRequest refuses cases)
            continue
        value = getattr(ns, DEST[field] or ("op" if request_.command == "record" else "run_dir"))
        value = str(value) if field == "target" else tuple(value) if field == "cases" else value
        assert value == getattr(request_, field), field


def test_a_replay_refuses_every_record_only_option_by_name(capsys):
    for f, meta in declared(RunOptions):
        if meta.record_only:
            with pytest.raises(SystemExit):
                cli.build_parser().parse_args(["replay", "/r", meta.flag, "1"])
            assert f"{meta.flag} is record-only" in capsys.readouterr().err, f.name


@pytest.mark.parametrize("command,target", [("record", "softmax"), ("replay", "/runs/x/softmax_1")])
def test_a_field_left_out_gives_the_childs_own_default(command, target):
    bare = RunRequest(command, target)
    assert bare.to_argv() == [command, target]
    ns = cli.build_parser().parse_args(bare.to_argv())
    default = cli.build_parser().parse_args([command, target])
    assert vars(ns) == vars(default)
    assert RunRequest("record", "add", RunOptions(ops_paths=[], flaggems_dirs=[])).to_argv() == ["record", "add"]


def test_requests_are_frozen_and_refuse_what_the_child_would_refuse():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RECORD.options.device = 0
    with pytest.raises(ValueError, match="replay takes no seed, timer"):
        RunRequest("replay", "/r", RunOptions(seed=1, timer="direct"))
    with pytest.raises(ValueError, match="not one of"):
        RunRequest("ab")
    with pytest.raises(ValueError, match="out and run_dir"):
        RunRequest("record", "add", out=Path("/runs"), run_dir=Path("/runs/add_1"))
    with pytest.raises(ValueError, match="dtypes: empty"):
        RunRequest("record", "add", RunOptions(dtypes=()))
    with pytest.raises(ValueError, match="a record of some cases"):
        RunRequest("record", "add", cases=("fp32-8",))
    with pytest.raises(ValueError, match="not a list of distinct case ids"):
        RunRequest("replay", "/r", cases=("fp32-8", "fp32-8"))
    assert RunOptions(dtypes=["fp16"]).dtypes == ("fp16",)  # a list becomes a tuple


def test_command_line_runs_the_harness_with_a_given_interpreter():
    assert RECORD.command_line("/py/bin/python")[:3] == ["/py/bin/python", "-m", "harness"]
    assert RECORD.command_line()[3:] == RECORD.to_argv()


def test_an_ab_plan_builds_its_record_and_replays_from_one_request_type(tmp_path):
    plan = ab.Plan("p", ["mm"], ab.Side("A", ""), ab.Side("B", ""), options=RunOptions(
        shapes=Path("/s.yaml"), dtypes=["fp16"], backend="interpreter", device=2, ops_paths=["/ops"],
        flaggems_dirs=["flaggems=/fg"], level="comprehensive", flagtune="1", seed=5, timer="profiler", l2="cold",
        warmup_ms=1.5, rep_ms=20.0, windows=4))
    record = cli.build_parser().parse_args(plan.request("record", "mm", tmp_path / "r").to_argv())
    assert (record.op, record.backend, record.device, record.dtypes, record.level, record.flagtune, record.color,
            record.named_run_dir, record.out) == ("mm", "interpreter", 2, ["fp16"], "comprehensive", "1", "never",
                                                  tmp_path / "r", None)
    assert (record.seed, record.timer, record.l2, record.warmup_ms, record.rep_ms, record.windows) == (
        5, "profiler", "cold", 1.5, 20.0, 4)
    # A replay keeps the record's backend and FlagGems options: it is not given them again.
    replay = cli.build_parser().parse_args(plan.request("replay", "/runs/mm_1", tmp_path / "p").to_argv())
    assert (replay.run_dir, replay.backend, replay.level, replay.flagtune) == (Path("/runs/mm_1"), None, None, None)
    assert (replay.shapes, replay.dtypes, replay.ops_paths, replay.flaggems_dirs, replay.device) == (
        Path("/s.yaml"), ["fp16"], ["/ops"], ["flaggems=/fg"], 2)


def test_a_batch_op_command_parses_back_to_its_options(tmp_path):
    opts = batch.Options(RunOptions(backend="interpreter", dtypes=["fp16"], shapes=Path("/s.yaml"), ops_paths=["/ops"],
                                    flaggems_dirs=["flaggems=/fg"], level="core", flagtune="0"), [0, 1])
    runner = batch.Batch(tmp_path, opts, {})
    builtin = Entry(repo="builtin", op="add", op_file="", file="ops/add.py")
    cmd = runner._command(builtin, 1, ["fp16"], tmp_path / "a1" / "add_1")
    ns = cli.build_parser().parse_args(cmd)
    assert (ns.command, ns.op, ns.backend, ns.device, ns.dtypes, ns.shapes, ns.ops_paths, ns.named_run_dir,
            ns.color) == ("record", "add", "interpreter", 1, ["fp16"], Path("/s.yaml"), ["/ops"],
                          tmp_path / "a1" / "add_1", "never")
    # Only a FlagGems op gets its checkout and upstream's options.
    assert (ns.flaggems_dirs, ns.level, ns.flagtune) == (None, None, None)
    assert (ns.seed, ns.timer, ns.l2) == (0, "auto", "warm")  # the record's own defaults
    measured = batch.Batch(tmp_path, dataclasses.replace(opts, run=dataclasses.replace(
        opts.run, timer="profiler", l2="cold", seed=4, rep_ms=5.0, windows=2)), {})
    ns = cli.build_parser().parse_args(measured._command(builtin, 1, None, tmp_path / "a1"))
    assert (ns.seed, ns.timer, ns.l2, ns.warmup_ms, ns.rep_ms, ns.windows) == (4, "profiler", "cold", None, 5.0, 2)


def test_a_plan_and_the_command_line_say_how_a_record_measures(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("ops: [add]\ntimer: profiler\nl2: cold\nseed: 3\nwarmup_ms: 5\nwindows: 2\n")
    plan = ab.load_plan(plan_file)
    assert plan.options.measurement() == RunOptions(timer="profiler", l2="cold", seed=3, warmup_ms=5, windows=2)
    # A backend with a device profiler (the interpreter refuses --timer profiler before anything runs).
    args = cli.parse_request(["ab", str(plan_file), "--backend", "cuda", "--l2", "warm", "--rep-ms", "7",
                              "--windows", "3"])
    resolved = ab.resolve_plan(args)  # the command line over the plan, the rest kept
    assert resolved.options.measurement() == RunOptions(timer="profiler", l2="warm", seed=3, warmup_ms=5, rep_ms=7.0,
                                                        windows=3)
    for bad, message in (("timer: fast", "'timer' must be one of"), ("l2: lukewarm", "'l2' must be one of"),
                         ("seed: -1", "'seed' must be an integer from 0 to 4294967295"),
                         ("rep_ms: many", "'rep_ms' must be a number of ms from 0 to 600000"),
                         ("windows: -1", "'windows' must be an integer from 1 to 64"),
                         ("seed: true", "'seed' must be an integer from 0 to 4294967295")):
        plan_file.write_text(f"ops: [add]\n{bad}\n")
        with pytest.raises(ab.PlanError, match=message):
            ab.load_plan(plan_file)


def test_run_dir_that_holds_anything_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "run.json").write_text("{}")  # another run's
    assert cli.main(["record", "softmax", "--backend", "interpreter", "--run-dir", str(taken)]) == 2
    assert capsys.readouterr().err == (f"error: --run-dir {taken} exists and is not an empty dir: name a new or "
                                       "empty one\n")
    assert [p.name for p in taken.iterdir()] == ["run.json"]


def test_run_dir_is_the_run_dir_itself_not_a_parent_and_not_with_out(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["record", "add", "--out", str(tmp_path), "--run-dir", str(tmp_path / "r")])
    assert "--run-dir: not allowed with argument --out" in capsys.readouterr().err
    # One A/B run's dir only: a comparison and a corpus A/B write elsewhere.
    for argv in (["--compare", str(tmp_path / "a"), str(tmp_path / "b")], ["--ops", "add", "--devices", "0"]):
        assert cli.main(["ab", *argv, "--run-dir", str(tmp_path / "ab")]) == 2
        assert capsys.readouterr().err.startswith("error: --run-dir names the dir of one A/B run")
    assert not (tmp_path / "ab").exists()
    assert not hasattr(cli.build_parser().parse_args(["batch", "--ops", "add"]), "named_run_dir")  # --batch-dir


def test_an_ab_reads_each_step_back_from_the_run_dir_it_named_never_a_stray_one(tmp_path, monkeypatch):
    """A run dir dropped into a step's dir (another run's, a leftover) is not the step's: a step
    whose child claimed nothing failed, whatever else its dir holds."""
    named = []

    def run(argv, **kwargs):
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        named.append(run_dir)
        write_complete_run(run_dir.parent / "add_19990101-000000")  # a stray run in the step's dir
        if "B-1" in run_dir.parts:  # B's first replay dies before it claims its run dir
            return 1, None
        write_complete_run(run_dir)
        return 0, None

    def unidentified(side):  # no kernel reuse: no probe of each side's Triton
        raise ab.SideUnidentified("not probed")

    monkeypatch.setattr(launch, "run", lambda argv, **kw: run(argv[3:], **kw))
    monkeypatch.setattr(ab_runner, "side_compiler_key", unidentified)
    plan = ab.Plan(name="t", ops=["add"], a=ab.Side("A", ""), b=ab.Side("B", ""), repeats=2,
                   options=RunOptions(backend="interpreter"))
    runner = ab.Runner(plan, tmp_path)
    try:
        results = runner.run()
    finally:
        runner.close()  # its cache root removed: none left in the temp dir
    assert [d.parent.name for d in named] == ["A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    assert all(d.parent.parent == tmp_path / "add" and d.name.startswith("add_2") for d in named)
    assert results["add"] == {"record": [named[0]], "A-passes": [named[0]], "B-passes": [named[1]],
                              "A": [named[2], named[4]], "B": [named[5]]}
    steps = runner.state["steps"]
    assert [s["run_dir"] for s in steps] == [str(d) if i != 3 else None for i, d in enumerate(named)]
    assert "running" not in runner.state


def write_complete_run(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"spec": {}, "observed": {"outcome": {"status": "COMPLETE"}}}))
    (run_dir / "results.json").write_text('{"rows": []}')


@pytest.mark.parametrize("only", ["timing", "passes", "configs"])
def test_what_a_record_is_for_round_trips_and_two_purposes_are_refused(only, capsys):
    request = RunRequest("record", "softmax", only=only)
    assert request.to_argv() == ["record", "softmax", f"--{only}-only"]
    assert cli.build_parser().parse_args(request.to_argv()).only == only
    other = next(o for o in ("timing", "passes", "configs") if o != only)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["record", "softmax", f"--{only}-only", f"--{other}-only"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_replay_is_never_configs_only_its_configs_are_its_records():
    with pytest.raises(ValueError, match="a configs-only replay"):
        RunRequest("replay", "/runs/x/mm_1", only="configs")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["replay", "/runs/x/mm_1", "--configs-only"])
    with pytest.raises(ValueError, match="not one of"):
        RunRequest("record", "mm", only="everything")
