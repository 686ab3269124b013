"""A bisect's resume (harness.sessions.bisect.stored): its bisect.json checked field by field before any
of it is used, a refusal in one line naming the field (exit 2), and its log never written through a link."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def bisect_state(d: Path) -> dict:
    """A bisect.json as a finished bisect of two builds leaves it (its probes' dirs not needed by a resume
    that has nothing left to run), for `d`."""
    side = {"label": "", "env": {}, "python": None, "requirements": []}
    build = {"label": "build 0", "env": {}, "python": None, "requirements": [], "commit": None}
    plan = {"name": "bisect", "ops": ["knobbed"], "repeats": 3, "fdr": 0.05, "step_start": "prewarmed",
            "step_passes": "once", "a": side, "b": side, "backend": "interpreter"}
    row = "knobbed fp32 300"
    said = {"verdict": "SAME", "ratio": 1.0, "lo": 0.99, "hi": 1.01, "what_changed": None}
    return {"format": 1, "spec": {"builds": [build, {**build, "label": "build 1"}], "git": None, "ops": ["knobbed"],
                                  "rows": None, "records": {}, "from_ab": None, "plan": plan, "device": None,
                                  "repeats": 2, "max_repeats": 8},
            "builds": {"0": {"ok": True, "reason": None, "python": None},
                       "1": {"ok": True, "reason": None, "python": None}},
            "records": {"knobbed": str(d / "record")}, "rows": [{"id": row, "op": "knobbed", "direction": None}],
            "probes": [{"probe": {"kind": "search", "a": 0, "b": 1, "repeats": 2, "rows": [row]},
                        "dir": str(d / "probe-01"), "verdicts": {row: said}}], "complete": True}


def resume(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "bisect", "--resume", str(d)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_a_bisect_resume_refuses_a_link_planted_at_its_log(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    d = tmp_path / "bisect"
    d.mkdir()
    (d / "bisect.json").write_text(json.dumps(bisect_state(d)))
    (d / "bisect.log").symlink_to(outside)
    proc = resume(d)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"error: refusing to write through a symlink: {d / 'bisect.log'}"]
    assert outside.read_text() == "precious\n"


def _set(state: dict, where: str, value) -> dict:
    *path, last = where.split(".")
    node = state
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return state


DELETE = object()


@pytest.mark.parametrize("where,value,said", [
    ("probes", DELETE, "it has no 'probes'"),
    ("spec.builds", 3, "spec.builds = 3 is not a list of two builds or more"),
    ("spec.repeats", -1, "spec.repeats = -1 is not an integer from 2 to 100"),
    ("builds.7", {"ok": True, "reason": None, "python": None}, "builds has a key '7', not a build index below 2"),
    ("rows.0.direction", "UP", "rows[0].direction = 'UP' is not null or one of FASTER, SLOWER"),
    ("probes.0.probe.b", 5, "probes[0].probe.b = 5 is not a build index below 2"),
    ("probes.0.verdicts.knobbed fp32 300.ratio", "x",
     "probes[0].verdicts.'knobbed fp32 300'.ratio = 'x' is not a ratio (> 0) or null"),
    ("spec.plan.repeats", 1, "spec.plan: plan {BISECT}: 'repeats' must be an integer from 2 to 100"),
])
def test_a_bisect_json_field_of_the_wrong_type_is_refused_in_one_line_naming_it(tmp_path, where, value, said):
    d = tmp_path / "bisect"
    d.mkdir()
    path = d / "bisect.json"
    path.write_text(json.dumps(_set(bisect_state(d), where, value)))
    proc = resume(d)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: --resume: {path} is corrupt: {said.format(BISECT=path)}"), line
    assert sorted(p.name for p in d.iterdir()) == ["bisect.json"]  # nothing ran, nothing written


@pytest.mark.parametrize("make,said", [
    (lambda d: (d / "bisect.json").symlink_to("/dev/zero"),
     "error: --resume: {d}/bisect.json is a symlink to /dev/zero (a character device), not a regular file"),
    (lambda d: (d / "bisect.json").write_text("[]"), "error: {d}/bisect.json: format [], not 1"),
    (lambda d: None, "error: --resume {d}: no bisect.json there (not a bisect dir)"),
])
def test_a_bisect_dir_without_a_readable_bisect_json_says_what_is_there(tmp_path, make, said):
    d = tmp_path / "bisect"
    d.mkdir()
    make(d)
    proc = resume(d)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [said.format(d=d)]), proc.stdout + proc.stderr


def test_a_bisect_resume_of_a_file_says_it_is_one(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x\n")
    proc = resume(f)  # refused at the door by --resume's declared kind (options.path_of), under the usage
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(f"error: argument --resume: {f} is a regular file, not a directory")
