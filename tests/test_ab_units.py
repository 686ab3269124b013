"""The single-op A/B's parts that run in this process (harness.sessions.ab): how a side describes
itself, the command line over a plan, KEY=VAL pairs, and whether a failed run still went through every
case. The A/B's steps themselves are end to end in tests/test_ab.py."""

import json
import os
import sys

import pytest

from harness import cli
from harness.core.errors import UsageError
from harness.core.spec import RunSpec
from harness.sessions import ab


def _args(*argv):
    return cli.build_parser().parse_args(["ab", *argv])


def test_a_side_describes_its_label_switches_python_and_requirements():
    side = ab.Side("B", "ieee", {"X": "1", "Y": "a b"}, "/envs/b/bin/python", ["triton==3.1", "numpy"])
    assert side.describe() == "ieee X=1 Y=a b python=/envs/b/bin/python pip: triton==3.1 numpy"
    assert ab.Side("A", "").describe() == "as is"  # nothing set: the environment this runs in
    assert ab.Side("A", "", {"X": "1"}).describe() == "X=1"
    assert ab.Side("A", "", python="/p").describe() == "python=/p"


def test_env_pairs_are_key_value_split_at_the_first_equals_sign():
    assert ab._env_pairs(["A=1", "B=x=y", "C="], "--a-env") == {"A": "1", "B": "x=y", "C": ""}
    assert ab._env_pairs(None, "--a-env") == {}
    for bad in ("novalue", "=1"):
        with pytest.raises(UsageError, match=f"^--b-env '{bad}': expected KEY=VAL$"):
            ab._env_pairs([bad], "--b-env")


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


def test_an_ab_whose_sides_do_not_differ_says_it_is_an_a_a_run(capsys):
    plan = ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter"))
    assert (plan.name, plan.ops, plan.a.describe(), plan.b.describe()) == ("adhoc", ["add"], "as is", "as is")
    assert "note: sides A and B are identical: this is an A/A run (measures noise)" in capsys.readouterr().out
    ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--b-env", "X=1"))
    assert "A/A" not in capsys.readouterr().out


def test_a_command_line_the_ab_cannot_run_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match=r"^--repeats must be >= 2: a row's spread between repeats is its noise$"):
        ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--repeats", "1"))
    missing = tmp_path / "no_python"
    with pytest.raises(UsageError, match=f"^--a-python {missing} does not exist$"):
        ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--a-python", str(missing)))
    with pytest.raises(UsageError, match=r"^--fdr 1.5: must lie between 0 and 1"):
        ab.resolve_plan(_args("--ops", "add", "--backend", "interpreter", "--fdr", "1.5"))
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
