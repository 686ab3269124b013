"""`python -m harness` without nox: it finds the light packages a session installed into the
checkout's .nox/deps (its children too), and a package still missing is one line, not a traceback.

Run in a real environment that lacks pyyaml (a venv linking every package this test process sees,
from site-packages and from the nox session's .nox/deps alike, but PyYAML) against a copy of the
checkout, whose .nox/deps the test may fill."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO, run_dir_of

pytestmark = pytest.mark.e2e

# Where this process finds installed distributions: site-packages, and .nox/deps under nox.
SITES = [Path(p) for p in dict.fromkeys([sysconfig.get_path("purelib"), *sys.path])
         if p and Path(p).is_dir() and any(Path(p).glob("*.dist-info"))]
YAML_ENTRIES = ("yaml", "_yaml")


def _is_yaml(name: str) -> bool:
    return name in YAML_ENTRIES or name.lower().startswith("pyyaml-")


@pytest.fixture(scope="module")
def no_yaml_python(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("env")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    own = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip())
    for site in SITES:
        for entry in site.iterdir():
            if not _is_yaml(entry.name) and not (own / entry.name).exists():
                (own / entry.name).symlink_to(entry)
    return python


@pytest.fixture
def checkout(tmp_path) -> Path:
    dest = tmp_path / "checkout"
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".git", ".nox", "runs", "__pycache__", ".*_cache"))
    return dest


def run(python: Path, checkout: Path, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    return subprocess.run([str(python), "-m", "harness", *map(str, args)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_missing_package_is_one_line_naming_it_and_the_fix(no_yaml_python, checkout, tmp_path):
    proc = run(no_yaml_python, checkout, "record", "softmax", "--backend", "interpreter", "--out", tmp_path / "runs")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "error: python -m harness needs pyyaml (missing here); run any nox session once (it installs them into "
        ".nox/deps) or: pip install pyyaml"]
    assert not (tmp_path / "runs").exists()  # nothing started


def test_the_checkouts_nox_deps_serves_the_harness_and_its_children(no_yaml_python, checkout, tmp_path):
    deps = checkout / ".nox" / "deps"
    deps.mkdir(parents=True)
    for site in SITES:
        for entry in site.iterdir():
            if _is_yaml(entry.name) and not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    proc = run(no_yaml_python, checkout, "record", "softmax", "--backend", "interpreter", "--out", tmp_path / "runs")
    # The child (python -m harness.child) imports yaml as well: it must get .nox/deps on its path.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir_of(proc) / "results.json").is_file()
