"""What a user sees from the nox sessions: no probe noise and no echoed helper scripts before the
session's own command; `nox -l --json` intact (CI builds its matrix from it); the compiler check
imports neither torch nor triton."""

import json
import os
import subprocess
import sys

from conftest import REPO

NOX = [sys.executable, "-m", "nox"]


def nox(*args):
    # UV names a binary that does not exist: nox's uv probe fails on any machine, as it does
    # where uv is not installed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")} | {
        "UV": "zl-no-such-uv"}
    return subprocess.run([*NOX, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_session_shows_only_its_own_command():
    proc = nox("-s", "record", "--", "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nox_lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("nox > ")]
    assert nox_lines[:2] == ["nox > Running session record", "nox > python -m harness record --help"], nox_lines
    assert len(nox_lines) == 3 and nox_lines[2].startswith("nox > Session record was successful"), nox_lines


def test_session_list_as_json():
    proc = nox("-l", "--json")
    assert proc.returncode == 0, proc.stderr
    sessions = {s["session"]: s for s in json.loads(proc.stdout)}
    assert {"record", "replay", "ab", "batch", "inventory-regen", "tests", "lint"} <= set(sessions)
    assert {name for name, s in sessions.items() if "ci" in s["tags"]} == {"tests", "lint"}


def _require_compiler(find_spec=None):
    """Run the noxfile's compiler check in a fresh interpreter (optionally with torch/triton hidden
    from find_spec); its stdout: the error it raised, then the compiler modules it imported."""
    hide = "" if find_spec is None else (
        "import importlib.util as u; real = u.find_spec; "
        f"u.find_spec = lambda name, *a: None if name in {find_spec!r} else real(name, *a); ")
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); {hide}import noxfile\n"
            "class Session:\n    def error(self, msg): print(msg)\n"
            "noxfile._require_compiler(Session())\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout


def test_compiler_check_finds_without_importing():
    assert _require_compiler() == "[]\n"  # no error, and neither torch nor triton imported


def test_compiler_check_names_what_is_missing():
    error, imported = _require_compiler(("torch",)).splitlines()
    assert error.startswith(f"this Python lacks torch or triton (missing torch in {sys.executable}).")
    assert "pip install torch==2.13.0 triton" in error and imported == "[]"
