"""The ordered builds a bisect searches: a list of ready builds (a YAML file, each build a side of an
A/B plan: a Python interpreter, env switches, or pip requirements built into a kept env), or a git
range of a compiler checkout built commit by commit with the user's build command.

A git build goes into a kept dir keyed by its commit and the build command (`<cache>/<key>/`): a venv
that sees the harness's environment (so torch and the harness's packages are there) and, first, what
the build command installs into it. A complete build is never built again, by a rerun or a resume; a
failed one is not retried either (its `.failed` says why), as the build would fail the same way.

A build that does not build, or whose Python cannot import torch and triton under its env, is skipped
by the search (`git bisect skip`), and the report says which and why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from harness.core import bounded, deps, paths, rundir
from harness.core.errors import UsageError
from harness.sessions.ab.plan import PlanError, Side, _side

BUILD_CACHE = paths.REPO_ROOT / ".nox" / "bisect-builds"
IMPORT_CHECK = "import torch, triton"
IMPORT_TIMEOUT_S = 600  # a first import of a fresh build compiles its bytecode
COMPLETE, FAILED = ".complete", ".failed"
_SITE_DIRS = "import json, site; print(json.dumps(site.getsitepackages() + [site.getusersitepackages()]))"


class BuildFailed(RuntimeError):
    """The build cannot be tested: it did not build, or it does not import."""


@dataclasses.dataclass(frozen=True)
class Build:
    """One build of the list. `commit` (sha, subject, author_date) where it came from git; its
    `python` is then the kept venv's, set once built."""

    label: str
    env: dict = dataclasses.field(default_factory=dict)
    python: str | None = None
    requirements: tuple[str, ...] = ()
    commit: dict | None = None

    def side(self, name: str) -> Side:
        return Side(name, self.label, dict(self.env), self.python, list(self.requirements))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "requirements": list(self.requirements)}

    @classmethod
    def from_dict(cls, data: dict) -> Build:
        return cls(data["label"], dict(data["env"]), data["python"], tuple(data["requirements"]), data["commit"])


def from_file(path: Path) -> list[Build]:
    """The builds a YAML file lists, in order: `builds:` a list of sides (label, env, python,
    requirements; paths relative to the file), checked as an A/B plan's sides are."""
    data = rundir.read_yaml_mapping(path, UsageError, "builds file")
    unknown = set(data) - {"builds"}
    if unknown:
        raise UsageError(f"builds file {path}: unknown fields {sorted(unknown)} (allowed: ['builds'])")
    entries = data.get("builds")
    if not isinstance(entries, list) or len(entries) < 2:
        raise UsageError(f"builds file {path}: 'builds' must list at least two builds, the good one first")
    builds = []
    for i, entry in enumerate(entries):
        try:
            side = _side(entry or {}, f"build {i}", str(path), path.parent)
        except PlanError as exc:
            raise UsageError(str(exc)) from exc
        builds.append(Build(side.label or f"build {i}", side.env, side.python, tuple(side.requirements)))
    return builds


def _git(checkout: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UsageError(f"git {' '.join(args)} in {checkout}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc.stdout


def from_git(checkout: Path, span: str) -> list[Build]:
    """The commits of `GOOD..BAD` in the checkout, GOOD first, then each commit after it on BAD's
    first-parent line, oldest first (as `git bisect` walks a merge-heavy history)."""
    good, sep, bad = span.partition("..")
    if not sep or not good or not bad:
        raise UsageError(f"--git-range {span!r}: expected GOOD..BAD")
    shas = [_git(checkout, "rev-parse", "--verify", f"{good}^{{commit}}").strip()]
    shas += _git(checkout, "rev-list", "--reverse", "--first-parent", f"{good}..{bad}").split()
    if len(shas) < 2:
        raise UsageError(f"--git-range {span}: no commit after {good} on {bad}'s first-parent line")
    builds = []
    for sha in shas:
        _, subject, date = _git(checkout, "show", "-s", "--format=%H%x00%s%x00%aI", sha).rstrip("\n").split("\0")
        builds.append(Build(f"{sha[:10]} {subject}", commit={"sha": sha, "subject": subject, "author_date": date}))
    return builds


def build_key(commit: str, build_cmd: str) -> str:
    return hashlib.sha256(f"{commit}\0{build_cmd}".encode()).hexdigest()[:16]


def build_commit(build: Build, checkout: Path, build_cmd: str, cache: Path, log) -> Build:
    """The commit built into its kept dir (or found there built), as a build with its venv's Python.
    BuildFailed where the build command failed, now or when it was first run."""
    home = cache / build_key(build.commit["sha"], build_cmd)
    python = home / "venv" / "bin" / "python"
    if (home / FAILED).is_file():
        raise BuildFailed(bounded.read_text(home / FAILED, "completion marker").strip())  # ours: one short line
    if not (home / COMPLETE).is_file():
        _build(build.commit["sha"], checkout, build_cmd, home, log)
    return dataclasses.replace(build, python=str(python))


def _build(sha: str, checkout: Path, build_cmd: str, home: Path, log) -> None:
    shutil.rmtree(home, ignore_errors=True)  # a build interrupted before it was marked complete
    (home / "src").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(checkout), "archive", "--format=tar", sha], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(home / "src", filter="data")
    venv = home / "venv"
    print(f"building {sha[:10]} into {home} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, stdout=log,
                   stderr=subprocess.STDOUT)
    # The harness's environment after the venv's own packages (ab.build_side_env does the same for a
    # side's requirements): the build installs only the compiler, and pip comes from there too.
    site_dirs = json.loads(subprocess.run([sys.executable, "-c", _SITE_DIRS], check=True, capture_output=True,
                                          text=True).stdout)
    own_site = subprocess.run([str(venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    inherited = [p for p in deps.search_path(os.environ.get("PYTHONPATH")) if Path(p).is_dir()]
    (Path(own_site) / "zz_zl_base_env.pth").write_text(
        "\n".join(d for d in [*site_dirs, *inherited] if Path(d).is_dir()) + "\n")
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    log.write(f"\n$ (in {home / 'src'}) {build_cmd}\n")
    log.flush()
    proc = subprocess.run(build_cmd, shell=True, cwd=home / "src", env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        reason = f"the build command exited {proc.returncode} (its output: {log.name})"
        (home / FAILED).write_text(reason + "\n")
        raise BuildFailed(reason)
    (home / COMPLETE).write_text(f"{sha}\n{build_cmd}\n")


def check_imports(build: Build, child_env: dict) -> None:
    """BuildFailed unless the build's Python imports torch and triton under its env (and the backend's
    child env): a build the harness could not even start in is skipped, not probed."""
    python = build.python or sys.executable
    env = {**os.environ, **build.env, **child_env}
    try:
        proc = subprocess.run([python, "-c", IMPORT_CHECK], capture_output=True, text=True, env=env,
                              timeout=IMPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildFailed(f"{python}: {exc}") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise BuildFailed(f"does not import ({IMPORT_CHECK}): {last}")
