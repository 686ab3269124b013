"""`nox -s tests` and `nox -s mutants` stopped as `timeout` stops them (SIGTERM to the command and its
group) or as `kill` does (SIGTERM to nox alone) leave nothing running: not the processes a test started
in a session of its own (a test's `python -m harness batch`), not mutmut's fork server and its pytest
processes. Each starts a small stand-in, never the real suite: a pytest run of one test that starts a
detached child and waits, and nox sessions of a fixture noxfile that run such a tree through the
noxfile's own helpers."""

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, pids_mentioning, wait_for, wait_gone

# Starts a child in a session of its own (as a test starts `python -m harness batch`), which sleeps
# under a command line naming MARKER; then waits, redrawing a spinner line as mutmut does, and once it
# drew the first, says so by creating MARKER. MARKER is argv[1].
TREE = textwrap.dedent("""
    import pathlib, subprocess, sys, time
    marker = pathlib.Path(sys.argv[1])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(marker)], start_new_session=True)
    for i in range(6000):
        print(f"\\r\\u280b {i}/6000 mutants", end="", flush=True)
        marker.touch()
        time.sleep(0.1)
""")


def _started(proc, marker) -> bool:
    return marker.exists() or proc.poll() is not None


# As `nox -s tests` runs the suite (over pytest-xdist's workers, each a subreaper of its own), and in one process.
@pytest.mark.parametrize("workers", [["-n", "2"], []], ids=["xdist", "one-process"])
def test_a_test_run_stopped_by_sigterm_ends_what_its_tests_started(tmp_path, workers):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the checkout's options: this is a stand-in run
    (tmp_path / "test_waits.py").write_text(textwrap.dedent(f"""
        import subprocess, sys
        def test_starts_a_detached_child_and_waits():
            subprocess.run([sys.executable, "-c", {TREE!r}, {str(tmp_path / "started")!r}])
    """))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {
        # pytest itself from wherever this run has it (under `nox -s tests`: .nox/deps, on PYTHONPATH)
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH")) if p)}
    # This suite's conftest as a plugin: what it does at a SIGTERM is what is under test.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-p", "no:cacheprovider", *workers,
                             "--rootdir", str(tmp_path), str(tmp_path / "test_waits.py")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    assert wait_for(lambda: _started(proc, tmp_path / "started"), 120), proc.communicate()[0]
    os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` does: the command, and its group
    out, _ = proc.communicate(timeout=60)
    assert "stopped by SIGTERM" in out, out
    assert wait_gone(str(tmp_path / "started")) == []


FIXTURE_NOXFILE = f"""
import os
import signal
import sys

sys.path.insert(0, {str(REPO)!r})
import nox
import noxfile as zl

TREE = {TREE!r}


@nox.session(venv_backend="none")
def tree(session):
    zl._run_as_tree(session, sys.executable, "-c", TREE, *session.posargs)


@nox.session(venv_backend="none")
def spinner(session):
    zl._run_without_spinner(session, sys.executable, "-c", TREE, *session.posargs)


@nox.session(venv_backend="none")
def after(session):
    open(session.posargs[0] + ".after", "w").close()


class StoppedAsItStarts:
    # The session, stopped by a SIGTERM to nox just before its command starts.

    def __init__(self, session):
        self.session = session

    def run(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return self.session.run(*args, **kwargs)

    def log(self, *args):
        self.session.log(*args)


@nox.session(venv_backend="none")
def early(session):
    zl._run_as_tree(StoppedAsItStarts(session), sys.executable, "-c", TREE, *session.posargs)
"""


def _fixture_nox(tmp_path, session: str, marker):
    """`nox -s SESSION after -- MARKER` on the fixture noxfile, in a session of its own. `after` stands for
    the session named after the stopped one (`nox -s tests lint`): it must not start."""
    (tmp_path / "noxfile.py").write_text(FIXTURE_NOXFILE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")} | {
        "UV": "zl-no-such-uv"}
    return subprocess.Popen([sys.executable, "-m", "nox", "-f", str(tmp_path / "noxfile.py"), "-s", session, "after",
                             "--", str(marker)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # bytes: a \r would read as \n in text


@pytest.mark.parametrize("session", ["tree", "spinner"])
@pytest.mark.parametrize("how", ["sigterm-to-nox-and-group", "sigterm-to-nox"])
def test_a_nox_session_stopped_by_sigterm_leaves_nothing_of_its_command(tmp_path, session, how):
    marker = tmp_path / "started"
    proc = _fixture_nox(tmp_path, session, marker)
    assert wait_for(lambda: _started(proc, marker), 120), proc.communicate()[0]
    if how == "sigterm-to-nox":
        os.kill(proc.pid, signal.SIGTERM)  # as `kill PID` does
    else:
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` does
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert not (tmp_path / "started.after").exists() and "Running session after" not in out, out
    assert wait_gone(str(marker)) == [], pids_mentioning(str(marker))
    if session == "spinner":  # not a terminal: no line redrawn in place, no spinner, the status it reached
        assert "\r" not in out and "\u280b" not in out and re.search(r"^\d+/6000 mutants$", out, re.MULTILINE), out


def test_a_sigterm_to_nox_before_its_command_started_stops_the_command_once_it_has(tmp_path):
    """Recorded with no command to pass it to, the stop reaches the command as it starts: it does not run
    whole (here: ten minutes of spinner) before nox exits 143."""
    marker = tmp_path / "started"
    proc = _fixture_nox(tmp_path, "early", marker)
    out = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped by SIGTERM" in out and not (tmp_path / "started.after").exists(), out
    assert wait_gone(str(marker)) == [], pids_mentioning(str(marker))
