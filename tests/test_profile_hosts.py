"""tests/gpu/profile_hosts.py and its sitecustomize (tests/gpu/host_profile), the by-hand tool that says where a
measuring host's time goes op by op: run on an A/B the interpreter timed in chunks, and held to the code it
names (a part whose function was renamed would read zero without a word)."""

import importlib.util
import subprocess
import sys

import pytest
from conftest import AB_SHAPES, REPO, harness_env, wait_gone

SCRIPT = REPO / "tests" / "gpu" / "profile_hosts.py"


def _script():
    spec = importlib.util.spec_from_file_location("profile_hosts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_part_of_our_code_it_sums_names_a_function_the_code_defines():
    assert _script().unfound_parts() == []


def test_a_part_naming_a_function_the_code_lost_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    script = _script()
    monkeypatch.setattr(script, "PARTS", (*script.PARTS, ("gone", "harness/measure/timers.py", ("no_such_fn",))))
    with pytest.raises(SystemExit) as stop:
        script.main([str(tmp_path)])
    assert str(stop.value) == ("error: the parts this tool sums name what the code no longer has: "
                               "gone: harness/measure/timers.py defines no no_such_fn()")


@pytest.mark.e2e
def test_each_run_a_chunks_hosts_serve_is_profiled_and_summed_per_op_by_part(tmp_path, capsys):
    shapes, profiles = tmp_path / "shapes.yaml", tmp_path / "profiles"
    shapes.write_text(AB_SHAPES)
    profiles.mkdir()
    env = harness_env(ZL_BENCH_HOST_PROFILE=str(profiles))
    env["PYTHONPATH"] = f"{REPO / 'tests' / 'gpu' / 'host_profile'}:{env['PYTHONPATH']}"
    argv = [sys.executable, "-m", "harness", "ab", "--ops", "add", "softmax", "--backend", "interpreter", "--shapes",
            str(shapes), "--repeats", "2", "--chunk", "2", "--out", str(tmp_path / "runs"), "--color", "never"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert wait_gone(str(tmp_path / "runs")) == []
    # A side a repeat hosts the chunk's two ops: 2 repeats x 2 sides x 2 ops timed runs, each profiled.
    assert len(list(profiles.glob("*.prof"))) == 8
    assert _script().main([str(profiles), "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: list(map(float, line.split()[1:])) for line in lines[1:3]}
    assert sorted(rows) == ["add", "softmax"]
    columns = ["runs", "run", *(part[0] for part in _script().PARTS), "rest"]
    for op, cells in rows.items():
        figures = dict(zip(columns, cells, strict=True))
        assert figures["runs"] == 4, (op, figures)
        # Our own parts were found in the profiles: the run, its timer and its rows written took time.
        assert figures["run"] > 0 and figures["timer"] > 0 and figures["rows written"] > 0, (op, figures)
        assert figures["rest"] >= 0, (op, figures)  # no part holds another's
