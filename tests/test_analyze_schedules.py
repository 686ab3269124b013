"""tests/gpu/analyze_schedules.py, the offline tool that weighs sequential schedules on an A/B's fixed repeats,
on an A/B the interpreter timed (its host timings taken as performance numbers, as the bisect tests do:
knobbed's one row runs twice as slow on B, the other as fast)."""

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO, harness_env, load

SCRIPT = REPO / "tests" / "gpu" / "analyze_schedules.py"
MEASURING = REPO / "tests" / "resources" / "bisect"


def _script():
    spec = importlib.util.spec_from_file_location("analyze_schedules", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclass finds its module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ab_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("schedules")
    argv = [sys.executable, str(MEASURING / "measuring_harness.py"), "ab", "--ops", "knobbed", "--ops-path",
            str(MEASURING / "knobbed.py"), "--backend", "interpreter", "--repeats", "4", "--b-env",
            "ZL_TEST_SLOW_SMALL=1", "--out", str(out)]
    proc = subprocess.run(argv, cwd=REPO, env=harness_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next(out.glob("ab_*"))


@pytest.mark.e2e
def test_fixed_repeats_are_judged_as_the_ab_reported_them_and_a_first_look_at_two_settles_there(ab_dir, capsys):
    code = _script().main([str(ab_dir), "--fixed", "4", "--band", "0:1000000", "--schedule", "3:4:obf",
                           "--schedule", "2:4:hsd:0"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    verdicts = [r["comparison"]["verdict"] for r in load(ab_dir / "report.json")["rows"]]
    assert sorted(verdicts) == ["SAME", "SLOWER"]
    assert out[1] == "fixed 4: called 1, SAME 1"  # the report's own verdicts, from the same run dirs
    # Both rows are plain at any look: the rule's first look (3) settles them there; a first look at 2
    # that spends a sixth of the error rate (hsd:0) settles them at 2. Both resolve 1% (one called, one SAME).
    assert out[2].startswith("3:4:obf (looks 3: ")
    assert out[2].endswith("called 1, SAME 1, 3.00 repeats a side (75% of fixed 4's); rows of 0-1e+06 us: 2 of 2 "
                           "resolved"), out[2]
    assert out[3].endswith("called 1, SAME 1, 2.00 repeats a side (50% of fixed 4's); rows of 0-1e+06 us: 2 of 2 "
                           "resolved"), out[3]


def test_a_cap_beyond_the_repeats_there_are_is_refused(ab_dir, capsys):
    assert _script().main([str(ab_dir), "--schedule", "3:12:obf"]) == 2
    assert "4 repeats a side in its op dirs" in capsys.readouterr().out
