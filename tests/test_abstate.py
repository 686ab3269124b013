"""An A/B's ab.json read back (harness.core.abstate): every reader (--continue, a bisect's --from-ab, a
corpus A/B's resume and report) gets it checked, and a torn or edited one is one line naming the file and
the field, exit 2, before anything is claimed or run; a bisect's --from-ab checks report.json's rows too."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

from harness.core import abstate

STEP = {"what": "[1/1 softmax] A records", "step": "softmax/A-record", "side": "A",
        "args": ["record", "softmax", "--backend", "interpreter", "--run-dir", "/r/softmax/A-record/s"],
        "exit": 0, "usable": True, "run_dir": "/r/softmax/A-record/s", "seconds": 4.5}


def state(**over) -> dict:
    """An ab.json as the runner writes it (harness.sessions.ab.runner), with `over` set."""
    return {"plan": {"name": "adhoc", "ops": ["softmax"], "repeats": 2, "backend": "interpreter"},
            "steps": [dict(STEP)], "complete": False, **over}


def harness(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_an_ab_json_as_the_runner_writes_it_reads_back(tmp_path):
    path = tmp_path / "ab.json"
    running = {k: STEP[k] for k in ("what", "side", "args", "run_dir")}
    path.write_text(json.dumps(state(running=running)))
    assert abstate.read(path)["steps"] == [STEP]
    old = {k: v for k, v in STEP.items() if k != "usable"}  # written before steps carried `usable`
    path.write_text(json.dumps(state(steps=[old], plan={"repeats": "auto", "max_repeats": 12, "backend": "cuda"})))
    assert abstate.read(path)["steps"] == [old]


CORRUPT = [
    ([], "it is [], not a mapping"),
    (state(plan=3), "plan = 3 is not a mapping"),
    (state(plan={"repeats": 2}), "plan.backend = None is not a backend name"),
    (state(steps=5), "steps = 5 is not a list"),
    (state(steps=[{**STEP, "run_dir": 5}]), "steps[0].run_dir = 5 is not a path or null"),
    (state(steps=[{**STEP, "args": []}]), "steps[0].args = [] is not a command line (strings)"),
    (state(steps=[{**STEP, "usable": "yes"}]), "steps[0].usable = 'yes' is not true or false"),
    (state(running={"what": "x", "side": "A", "args": "record"}), "running.args = 'record' is not a command line"),
    (state(complete="no"), "complete = 'no' is not true or false"),
    (state(device_gate=["/dev/zero"]), "device_gate = ['/dev/zero'] is not a path"),
]


@pytest.mark.parametrize("content,said", CORRUPT)
def test_a_continue_from_a_corrupt_ab_json_is_one_line_and_claims_no_ab_dir(tmp_path, content, said):
    earlier = tmp_path / "ab_x"
    earlier.mkdir()
    (earlier / "ab.json").write_text(json.dumps(content))
    out = tmp_path / "runs"
    proc = harness("ab", "--continue", earlier, "--ops", "softmax", "--backend", "interpreter", "--repeats", "2",
                   "--out", out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: --continue {earlier}: no readable ab.json ({earlier / 'ab.json'} is corrupt: "
                           f"{said}"), line
    assert not out.exists()  # read before the new A/B's dir is claimed


@pytest.mark.parametrize("name,content,said", [
    ("ab.json", state(steps=[{**STEP, "args": 7}]), "{d}/ab.json is corrupt: steps[0].args = 7 is not a command line"),
    ("report.json", {"rows": 5}, "--from-ab: {d}/report.json is corrupt: rows = 5 is not a report row"),
    ("report.json", {"rows": [{"op": "softmax", "dtype": 1}]},
     "--from-ab: {d}/report.json is corrupt: rows[0] = {{'op': 'softmax', 'dtype': 1}} is not a report row"),
])
def test_a_bisect_from_a_corrupt_ab_dir_is_one_line(tmp_path, name, content, said):
    d = tmp_path / "ab_x"
    d.mkdir()
    (d / "ab.json").write_text(json.dumps(state()))
    (d / "report.json").write_text(json.dumps({"rows": []}))
    (d / name).write_text(json.dumps(content))
    builds = tmp_path / "builds.yaml"
    builds.write_text(json.dumps({"builds": [{"label": "a"}, {"label": "b", "env": {"X": "1"}}]}))
    proc = harness("bisect", "--builds", builds, "--from-ab", d, "--backend", "interpreter", "--out", tmp_path / "o")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: " + said.format(d=d)), line
    assert not (tmp_path / "o").exists()
