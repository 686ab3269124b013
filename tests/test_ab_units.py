"""The single-op A/B's parts that run in this process (harness.sessions.ab): how a side describes
itself, the command line over a plan, KEY=VAL pairs, and whether a failed run still went through every
case. The A/B's steps themselves are end to end in tests/test_ab.py."""

import json
import os
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.core.errors import UsageError
from harness.core.options import MAX_REPEATS
from harness.core.spec import RunSpec
from harness.measure import ir
from harness.sessions import ab
from harness.sessions.ab import session as ab_session


def _args(*argv):
    return cli.parse_request(["ab", *argv])


def test_a_side_describes_its_label_switches_python_and_requirements():
    side = ab.Side("B", "ieee", {"X": "1", "Y": "a b"}, "/envs/b/bin/python", ["triton==3.1", "numpy"])
    assert side.describe() == "ieee X=1 Y=a b python=/envs/b/bin/python pip: triton==3.1 numpy"
    assert ab.Side("A", "").describe() == "as is"  # nothing set: the environment this runs in
    assert ab.Side("A", "", {"X": "1"}).describe() == "X=1"
    assert ab.Side("A", "", python="/p").describe() == "python=/p"


def test_env_pairs_are_key_value_split_at_the_first_equals_sign():
    assert ab_session._env_pairs(["A=1", "B=x=y", "C="], "--a-env") == {"A": "1", "B": "x=y", "C": ""}
    assert ab_session._env_pairs(None, "--a-env") == {}
    for bad in ("novalue", "=1", "=x=y"):
        with pytest.raises(UsageError, match=f"^--b-env '{bad}': expected KEY=VAL$"):
            ab_session._env_pairs([bad], "--b-env")


def test_the_command_line_overrides_the_plan_side_by_side(tmp_path, capsys):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("ops: [mm]\nrepeats: 4\nfdr: 0.1\nb: {env: {X: '1'}}\n")
    plan = ab.resolve_plan(_args(str(plan_file), "--backend", "interpreter", "--a-env", "Y=2",
                                 "--b-python", sys.executable, "--ops", "add", "softmax", "--device", "1",
                                 "--dtypes", "fp16", "--level", "core", "--flagtune", "1",
                                 "--libtuner-cache", "user"))
    assert (plan.ops, plan.repeats, plan.fdr, plan.options.device, plan.options.dtypes) == (
        ["add", "softmax"], 4, 0.1, 1, ("fp16",))
    assert (plan.a.env, plan.b.env) == ({"Y": "2"}, {"X": "1"})
    assert (plan.a.python, plan.b.python) == (None, os.path.abspath(sys.executable))
    assert (plan.options.level, plan.options.flagtune, plan.options.libtuner_cache, plan.options.backend) == (
        "core", "1", "user", "interpreter")
    assert "A/A run" not in capsys.readouterr().out
    again = ab.resolve_plan(_args(str(plan_file), "--backend", "interpreter", "--repeats", "2", "--fdr", "0.2"))
    assert (again.ops, again.repeats, again.fdr, again.a.env, again.b.python) == (["mm"], 2, 0.2, {}, None)


def test_shapes_given_on_the_command_line_are_a_file_from_here_or_flaggems_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--shapes", "mine.yaml"))
    assert given.options.shapes == tmp_path / "mine.yaml"  # relative to where the A/B was started
    upstream = ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--shapes", "upstream"))
    assert upstream.options.shapes == Path("upstream")  # FlagGems' own shapes: a name, not a file here
    ab_session.check_plan(upstream)  # so no file is looked for
    with pytest.raises(UsageError, match=f"^shape file {tmp_path / 'mine.yaml'} does not exist$"):
        ab_session.check_plan(given)


def test_a_backend_named_by_an_alias_is_planned_under_its_own_name():
    # Every step and the report read the plan's backend by its name.
    assert ab.resolve_plan(_args("--ops", "add", "--backend", "cpu")).options.backend == "interpreter"


def test_an_ab_whose_sides_do_not_differ_says_it_is_an_a_a_run(capsys):
    plan = ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter"))
    assert (plan.name, plan.ops, plan.a.describe(), plan.b.describe()) == ("adhoc", ["add"], "as is", "as is")
    ab.say_if_a_a(plan)
    assert "note: sides A and B are identical: this is an A/A run (measures noise)" in capsys.readouterr().out
    ab.say_if_a_a(ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--b-env", "X=1")))
    assert "A/A" not in capsys.readouterr().out


def test_an_ab_of_an_unknown_op_says_only_that(capsys):
    # Not the A/A note first: the plan does not run.
    with pytest.raises(UsageError, match=r"^unknown operator .sofmax. \(did you mean softmax\?\); built-in: add,"):
        ab.run_from_args(_args("--ops", "sofmax", "--backend", "interpreter"))
    assert capsys.readouterr().out == ""


def test_a_command_line_the_ab_cannot_run_is_refused_before_anything_runs(tmp_path):
    for repeats in ("1", str(MAX_REPEATS + 1)):  # refused at the door, as the option declares
        with pytest.raises(SystemExit) as refused:
            _args("--ops", "add", "--backend", "interpreter", "--repeats", repeats)
        assert refused.value.code == 2
    missing = tmp_path / "no_python"
    with pytest.raises(UsageError, match=f"^--a-python {missing} does not exist$"):
        ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--a-python", str(missing)))
    for fdr in ("1.5", "nan"):  # refused at the door, as the option declares
        with pytest.raises(SystemExit) as refused:
            _args("--ops", "add", "--backend", "interpreter", "--fdr", fdr)
        assert refused.value.code == 2
    broken = tmp_path / "plan.yaml"
    broken.write_text("ops: []\n")
    with pytest.raises(UsageError, match="'ops' must be a non-empty list"):  # a PlanError, said as a usage error
        ab.resolve_plan(_args(str(broken), "--backend", "interpreter"))


def _run_dir(root, status, results=True):
    root.mkdir(parents=True)
    spec = RunSpec("add", "interpreter", "record", 0, ["fp32"], "default").to_json()
    (root / "run.json").write_text(json.dumps({"spec": spec, "observed": {"outcome": {"status": status}}}))
    if results:
        (root / "results.json").write_text(json.dumps({"format": 1, "rows": []}))
    return root


def test_a_failed_run_went_through_only_if_it_ran_every_case_and_wrote_its_results(tmp_path):
    assert ab.went_through(_run_dir(tmp_path / "complete", "COMPLETE"))
    assert not ab.went_through(_run_dir(tmp_path / "stopped", "INTERRUPTED"))
    assert not ab.went_through(_run_dir(tmp_path / "no_results", "COMPLETE", results=False))
    assert not ab.went_through(tmp_path / "never_written")
    corrupt = _run_dir(tmp_path / "corrupt", "COMPLETE")
    (corrupt / "run.json").write_text("{")
    assert not ab.went_through(corrupt)


# --- the plan file: every field checked, each refusal one line naming the file and the field -------
def _plan(tmp_path, text):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("line,message", [
    ("name: 5", "'name' must be a string of 1 to 100 printable characters, not 5"),
    ("backend: 1", "'backend' must be a string (a backend name), not 1"),
    ("shapes: [s.yaml]", "'shapes' must be a path, not ['s.yaml']"),
    ("libtuner_cache: 3", "'libtuner_cache' must be a cache name, path or URL, not 3"),
    ("ops_paths: ops", "'ops_paths' must be a list of paths, not 'ops'"),
    ("ops_paths: [1]", "'ops_paths' must be a list of paths, not [1]"),
    ("flaggems_dirs: [1]", "'flaggems_dirs' must be a list of [NAME=]PATH, not [1]"),
    ("device: -1", "'device' must be a device index (an integer >= 0), not -1"),
    ("device: 1.0", "'device' must be a device index (an integer >= 0), not 1.0"),
    ("device: true", "'device' must be a device index (an integer >= 0), not True"),
    ("level: all", "'level' must be one of core, comprehensive, not 'all'"),
    ("flagtune: 2", "'flagtune' must be 0 or 1, not 2"), ("flagtune: true", "'flagtune' must be 0 or 1, not True"),
    ("repeats: 2.5", "'repeats' must be an integer from 2 to 100 (a row's spread between repeats is its noise) or "
                     "auto, not 2.5"),
    ("max_repeats: 8", "max_repeats: only with repeats: auto (its repeats are 3)"),
    ("repeats: auto\nmax_repeats: 101", "'max_repeats' must be an integer from 3 to 100, not 101"),
    ("repeats: auto\nresolve: 1", "'resolve' must be a percentage above 0.3% and below 50% (`1%`, or the fraction "
                                  "0.01), not 1"),
    ("repeats: auto\nresolve: 1 percent", "'resolve' must be a percentage such as 1% or 0.5%, not '1 percent'"),
    ("fdr: 0", "'fdr' must be a number between 0 and 1, not 0"),
    ("step_start: warm", "'step_start' must be one of fork, fresh, prewarmed, not 'warm'"),
    ("step_passes: twice", "'step_passes' must be one of once, every, not 'twice'"),
    ("timer: fast", "'timer' must be one of auto, graph, direct, profiler, host, not 'fast'"),
    ("l2: hot", "'l2' must be one of warm, cold, not 'hot'"),
    ("warmup_ms: -1", "'warmup_ms' must be a number of ms from 0 to 600000, not -1"),
    ("rep_ms: '5'", "'rep_ms' must be a number of ms from 0 to 600000, not '5'"),
    ("seed: 1.5", "'seed' must be an integer from 0 to 4294967295, not 1.5"),
    ("windows: 0", "'windows' must be an integer from 1 to 64, not 0"),
    ("windows: 2.0", "'windows' must be an integer from 1 to 64, not 2.0"),
    ("- ops: [add]", "top level must be a mapping"),
    # The plan's options are its own fields, not a mapping of their own (Plan.options is the resolved set).
    ("options: {}", "unknown fields ['options'] (allowed: ['a', 'b', 'backend', 'chunk', 'chunk_records', 'device', "
                    "'dtypes', 'fdr', "
                    "'first', 'flaggems_dirs', 'flagtune', 'l2', 'level', 'libtuner_cache', 'max_noise', "
                    "'max_repeats', 'name', 'ops', 'ops_paths', 'record_jobs', 'rep_ms', 'repeats', 'resolve', "
                    "'seed', 'shapes', 'step_passes', 'step_start', 'timer', 'warmup_ms', 'windows'])"),
])
def test_a_plan_field_no_step_could_take_is_refused_in_one_line_naming_the_file(tmp_path, line, message):
    path = _plan(tmp_path, line if line.startswith("- ") else f"ops: [add]\n{line}\n")
    with pytest.raises(ab.PlanError) as refused:
        ab.load_plan(path)
    assert str(refused.value) == f"plan {path}: {message}"


def test_a_plan_that_is_not_a_mapping_is_refused_as_a_plan(tmp_path):
    for text in ("- add\n", "ops: [add\n"):
        with pytest.raises(ab.PlanError, match=f"^plan {_plan(tmp_path, text)}"):
            ab.load_plan(tmp_path / "plan.yaml")
    with pytest.raises(ab.PlanError, match=f"^plan {tmp_path / 'none.yaml'} does not exist$"):
        ab.load_plan(tmp_path / "none.yaml")
    # The mapping a corpus A/B stored, checked the same way.
    with pytest.raises(ab.PlanError, match=r"^plan stored: top level must be a mapping$"):
        ab.plan_from_data(["add"], "stored")


def test_a_plan_takes_every_field_it_names_and_its_paths_relative_to_its_folder(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "py").write_text("")
    (tmp_path / "py").chmod(0o755)  # a side's python is a program
    (tmp_path / "reqs.txt").write_text("triton==3.1  # the build under test\n\n# nothing\nnumpy\n")
    path = _plan(tmp_path, "ops: [add, mm]\nname: fast\ndevice: 0\nlevel: core\nflagtune: 1\nops_paths: [ops]\n"
                           "step_start: fresh\nstep_passes: every\nwarmup_ms: 0\nrep_ms: 0.5\nwindows: 2\nseed: 0\n"
                           "repeats: 2\nshapes: s.yaml\n"
                           "a: {label: base, python: py}\nb: {label: new, env: {X: '1'}, requirements: reqs.txt}\n")
    plan = ab.load_plan(path)
    o = plan.options
    assert (plan.name, plan.ops, o.device, o.level, o.flagtune, plan.repeats) == (
        "fast", ["add", "mm"], 0, "core", "1", 2)
    assert (list(o.ops_paths), str(o.shapes)) == ([str(tmp_path / "ops")], str(tmp_path / "s.yaml"))
    assert (plan.step_start, plan.step_passes, o.warmup_ms, o.rep_ms, o.windows, o.seed) == (
        "fresh", "every", 0, 0.5, 2, 0)
    assert plan.a.describe() == f"base python={tmp_path / 'py'}"
    assert plan.b.describe() == "new X=1 pip: triton==3.1 numpy"
    assert ab.load_plan(_plan(tmp_path, "ops: [add]\nflagtune: '0'\n")).options.flagtune == "0"
    assert ab.load_plan(_plan(tmp_path, "ops: [add]\nb: {env: {X: '1'}}\n")).b.describe() == "X=1"  # no label
    # FlagGems' own shapes are named, not a file.
    assert str(ab.load_plan(_plan(tmp_path, "ops: [add]\nshapes: upstream\n")).options.shapes) == "upstream"
    # What a plan leaves out: three repeats, prewarmed steps (new interpreters at fork's pace: forked ones
    # came out more alike on an H200, docs/performance.md), the one-off passes once, sides as they are.
    plain = ab.load_plan(_plan(tmp_path, "ops: [add]\n"))
    assert (plain.name, plain.repeats, plain.step_start, plain.step_passes, plain.options.device, plain.options.level,
            plain.options.flagtune, list(plain.options.ops_paths)) == (
        "plan", 3, "prewarmed", "once", None, None, None, [])
    assert (plain.a.label, plain.b.label, plain.a.describe()) == ("", "", "as is")
    # A stored plan's paths are relative to the base it is read with, not to where it was stored.
    stored = ab.plan_from_data({"ops": ["add"], "ops_paths": ["ops"], "shapes": "s.yaml"}, "/elsewhere/p.yaml",
                               tmp_path)
    assert (list(stored.options.ops_paths), str(stored.options.shapes)) == (
        [str(tmp_path / "ops")], str(tmp_path / "s.yaml"))


@pytest.mark.parametrize("side,message", [
    ("[x]", "side 'B' must be a mapping"),
    ("{labels: x}", "side 'B': unknown fields ['labels'] (allowed: ['env', 'label', 'python', 'requirements'])"),
    ("{requirements: 5}", "side 'B': requirements must be a list of pip specifiers or a file name"),
    ("{requirements: [1]}", "side 'B': requirements must be a list of pip specifiers or a file name"),
    ("{env: [X]}", "side 'B': env must be a mapping of NAME: value"),
    ("{env: {X: true}}", "side 'B': env X: True is not a string or a number (quote it: '1', 'true'; no NUL character)"),
    ("{label: 5}", "side 'B': label must be a string, not 5"),
    ("{python: 5}", "side 'B': python must be a string, not 5"),
])
def test_a_side_no_step_could_run_is_refused_naming_the_plan_and_the_side(tmp_path, side, message):
    path = _plan(tmp_path, f"ops: [add]\nb: {side}\n")
    with pytest.raises(ab.PlanError) as refused:
        ab.load_plan(path)
    assert str(refused.value) == f"{path}: {message}"
    with pytest.raises(ab.PlanError, match=f"^{path}: side 'A' must be a mapping$"):
        ab.load_plan(_plan(tmp_path, "ops: [add]\na: x\n"))


def test_a_sides_python_and_env_names_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(ab.PlanError, match=f"^{tmp_path / 'plan.yaml'}: side 'B': python {tmp_path / 'nope'} "
                                           "does not exist$"):
        ab.load_plan(_plan(tmp_path, "ops: [add]\nb: {python: nope}\n"))
    # A NUL cannot be in a variable's name (the kernel would cut the name there).
    with pytest.raises(ab.PlanError, match=r"^p: side 'A': env name 'X\\x00Y' is not a variable name$"):
        ab.plan_from_data({"ops": ["add"], "a": {"env": {"X\0Y": "1"}}}, "p")


# --- validity: what the A/B can conclude, from each op's first run of either side ------------------
def _ir_index(run, *kernels):
    """A run dir whose IR index lists each (kernel, hash) launched at shape 64."""
    (run / "ttgir").mkdir(parents=True)
    lines = ["\t".join(ir.INDEX_COLUMNS)]
    for kernel, value in kernels:
        row = {c: "x" for c in ir.INDEX_COLUMNS} | {"shape": "64", "kernel": kernel, "file": f"64/{kernel}/w4s3.ttgir"}
        row |= {f"{s}_sha": value for s in ir.HASHED_STAGES}
        lines.append("\t".join(row[c] for c in ir.INDEX_COLUMNS))
    (run / "ttgir" / "index.tsv").write_text("\n".join(lines) + "\n")
    return run


NOTHING = ("the A/B axis changed NOTHING: both sides compiled byte-identical IR at every stage for every launched "
           "kernel; a switch that no longer exists looks exactly like this")
NOT_COLLECTED = ("IR was not collected on some ops (see run.json observed.ir): cannot tell whether the axis changed "
                 "the generated code there")


def test_validity_counts_each_ops_kernels_by_how_their_ir_compares(tmp_path):
    a = _ir_index(tmp_path / "a", ("k", "1"), ("only_a", "1"), ("j", "1"))
    b = _ir_index(tmp_path / "b", ("k", "1"), ("only_b", "1"), ("j", "2"))
    same = _ir_index(tmp_path / "same", ("k", "1"))
    bare = tmp_path / "bare"
    bare.mkdir()
    # An op a side has no run of is left out; one whose IR either side lacks is said; the ops after both still count.
    warnings, per_op = ab.validity({"one_sided": {"A": [a], "B": []}, "half": {"A": [a], "B": [bare]},
                                    "op": {"A": [a, bare], "B": [b]}, "same": {"A": [same], "B": [same]}})
    assert per_op == {"half": "IR not collected",
                      "op": {"identical": 1, "changed": 1, "only_in_a": 1, "only_in_b": 1},
                      "same": {"identical": 1, "changed": 0, "only_in_a": 0, "only_in_b": 0}}
    assert warnings == [NOT_COLLECTED]  # one op changed its IR: the axis did something
    assert ab.validity({"none": {"A": [], "B": [b]}, "same": {"A": [same], "B": [same]}}) == (
        [NOTHING], {"same": {"identical": 1, "changed": 0, "only_in_a": 0, "only_in_b": 0}})
    # Runs that launched no kernel compared nothing: no claim that the axis changed nothing.
    empty = _ir_index(tmp_path / "empty")
    assert ab.validity({"op": {"A": [empty], "B": [empty]}})[0] == []
    assert ab.validity({"op": {"A": [bare], "B": [b]}}) == ([NOT_COLLECTED], {"op": "IR not collected"})


def _fake_python(tmp_path, script: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


def test_a_sides_compiler_key_names_its_interpreter_and_why_it_could_not_be_identified(tmp_path):
    nowhere = str(tmp_path / "nowhere" / "python")
    with pytest.raises(ab.SideUnidentified, match=f"^{nowhere}: "):
        ab.side_compiler_key(ab.Side("B", "", python=nowhere))
    broken = _fake_python(tmp_path, "echo 'Traceback' >&2\necho 'ImportError: no site' >&2\nexit 3")
    with pytest.raises(ab.SideUnidentified, match=f"^{broken} exited 3: ImportError: no site$"):
        ab.side_compiler_key(ab.Side("B", "", python=broken))
    silent = _fake_python(tmp_path, "exit 4")
    with pytest.raises(ab.SideUnidentified, match=f"^{silent} exited 4$"):
        ab.side_compiler_key(ab.Side("B", "", python=silent))
    # A Python without Triton is identified all the same, by its interpreter and switches.
    bare = _fake_python(tmp_path, "echo")
    key = ab.side_compiler_key(ab.Side("B", "", {"X": "1"}, python=bare))
    assert (key["python"], key["triton"], key["env"]) == (str(Path(bare).resolve()), {"path": None}, {"X": "1"})
