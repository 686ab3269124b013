"""How a nox session gets its light packages: a line saying what it installs and roughly how much
before pip runs (pip's own progress on a terminal only), and no copy in .nox/deps of a package the
environment has since gained (`pip install -e .`), which the session's PYTHONPATH would put first.

The noxfile's helper runs against a stand-in session whose requests to `python -m harness.core.deps`
run for real in this Python; only pip is not run."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

import noxfile
from harness.core import deps


class Session:
    def __init__(self):
        self.env: dict[str, str] = {}
        self.said: list[tuple[str, ...]] = []  # what it logged and ran, in order

    def log(self, message: str) -> None:
        self.said.append(("log", message))

    def run(self, *args, silent=False, log=True):
        self.said.append(("run", *args))
        if "harness.core.deps" not in args:
            return True  # pip: not run
        # This Python's environment, its packages included wherever they lie: under `nox -s tests` (CI) the
        # light packages are on PYTHONPATH (the checkout's .nox/deps), not in the environment itself.
        outer = os.environ.get("PYTHONPATH")
        env = {**self.env, "PATH": "/usr/bin:/bin",
               "PYTHONPATH": os.pathsep.join(p for p in (self.env.get("PYTHONPATH"), outer) if p)}
        return subprocess.run([sys.executable, *args[1:]], cwd=REPO, env=env, capture_output=True, text=True,
                              check=True).stdout


@pytest.fixture
def deps_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(noxfile, "DEPS_DIR", tmp_path / "deps")
    monkeypatch.setattr(noxfile, "_python", lambda: sys.executable)
    (tmp_path / "deps").mkdir()  # as pip leaves it, which is not run here
    return tmp_path / "deps"


@pytest.mark.parametrize("terminal", [True, False])
def test_an_install_is_said_with_its_rough_size_before_pip_runs(deps_dir, monkeypatch, terminal):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    session = Session()
    noxfile._light_deps(session, "tests", "zl-no-such-dist", "submitit-zl-absent")
    said = [entry for entry in session.said if entry[0] == "log" or "pip" in entry]
    pip = ("run", sys.executable, "-m", "pip", "install", *(() if terminal else ("--quiet", "--progress-bar", "off")),
           "--disable-pip-version-check", "--target", str(deps_dir), "--upgrade", "zl-no-such-dist",
           "submitit-zl-absent")
    assert said == [("log", f"installing into {deps_dir}: "
                            f"{deps.install_line(['zl-no-such-dist', 'submitit-zl-absent'])}"), pip]


def test_the_install_line_sums_what_it_knows_and_says_what_it_does_not():
    assert deps.install_line(["ray", "submitit", "jsonschema", "zl-x"]) == (
        "4 packages, ~586 MB with what they pull in (rough; 1 of unknown size): ray ~580 MB, submitit ~1 MB, "
        "jsonschema ~5 MB, zl-x (size unknown)")
    assert deps.install_line(["tabulate"]) == "1 package, <1 MB with what they pull in (rough): tabulate <1 MB"


def test_a_package_the_environment_gained_leaves_nox_deps(deps_dir):
    # tabulate is in this environment (a light package); zl_only_here is not.
    for name, files in (("tabulate-0.9.0", ["tabulate.py"]), ("zl_only_here-1.0", ["zl_only_here.py"])):
        info = deps_dir / f"{name}.dist-info"
        info.mkdir()
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
        for f in files:
            (deps_dir / f).write_text("")
    session = Session()
    noxfile._light_deps(session, "tests")
    assert sorted(p.name for p in deps_dir.iterdir()) == ["zl_only_here-1.0.dist-info", "zl_only_here.py"]
    assert session.env["PYTHONPATH"] == str(deps_dir)
