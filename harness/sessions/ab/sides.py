"""A side's interpreter and compiler: the virtual environment built for its pip requirements
(build_side_env), what its compiled kernels depend on (side_compiler_key: the key of its Triton cache)
and the PYTHONPATH its steps run with."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.core import deps, identity, paths
from harness.sessions.ab.plan import Side

SIDE_ENVS = paths.REPO_ROOT / ".nox" / "ab-envs"
_SITE_DIRS = "import json, site; print(json.dumps(site.getsitepackages() + [site.getusersitepackages()]))"


def build_side_env(side: Side, log, root: Path = SIDE_ENVS) -> str:
    """A virtual environment for a side's pip requirement set; returns its interpreter.

    The new env sees the base environment's packages through a .pth file placed after its own
    site-packages, so only what the requirements name (say, another triton) differs from the
    base, and nothing is installed into the base. Envs are cached by base interpreter and
    requirement set; a failed build leaves no env marked complete."""
    import hashlib
    import json

    base = side.python or sys.executable
    key = hashlib.sha256("\n".join([base, *sorted(side.requirements)]).encode()).hexdigest()[:12]
    env_dir = root / key
    python = env_dir / "bin" / "python"
    if (env_dir / ".complete").is_file():
        return str(python)
    shutil.rmtree(env_dir, ignore_errors=True)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"building side {side.name}'s env ({' '.join(side.requirements)}) in {env_dir} ...", flush=True)
    subprocess.run([base, "-m", "venv", str(env_dir)], check=True, stdout=log, stderr=subprocess.STDOUT)
    site_dirs = json.loads(subprocess.run([base, "-c", _SITE_DIRS], check=True, capture_output=True,
                                          text=True).stdout)
    own_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
    # "zz" sorts last: the base's packages, then the PYTHONPATH entries the harness runs with and
    # .nox/deps (the sessions' light packages), come after the side's own. The side runs with only
    # the checkout on PYTHONPATH, which would otherwise shadow what its requirements installed.
    inherited = [p for p in deps.search_path(os.environ.get("PYTHONPATH")) if Path(p).is_dir()]
    (Path(own_site) / "zz_zl_base_env.pth").write_text(
        "\n".join(d for d in [*site_dirs, *inherited] if Path(d).is_dir()) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *side.requirements], check=True, stdout=log, stderr=subprocess.STDOUT)
    (env_dir / ".complete").write_text("\n".join(side.requirements) + "\n")
    return str(python)


_TRITON_DIR = ("import importlib.util; s = importlib.util.find_spec('triton'); "
               "print(s.submodule_search_locations[0] if s else '')")


class SideUnidentified(RuntimeError):
    """The side's Python could not say which Triton it imports."""


def side_compiler_key(side: Side) -> dict:
    """What a side's compiled kernels depend on: its interpreter, the build of the Triton that
    interpreter imports under the side's environment (identity.files_digest: changes on any rebuild
    or reinstall), and that environment (compiler switches). Found without importing Triton."""
    python = side.python or sys.executable
    try:
        probe = subprocess.run([python, "-c", _TRITON_DIR], capture_output=True, text=True, timeout=60,
                               env={**os.environ, **side.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SideUnidentified(f"{python}: {exc}") from exc
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or [""])[-1]
        raise SideUnidentified(f"{python} exited {probe.returncode}" + (f": {last}" if last else ""))
    found = probe.stdout.strip()
    triton = {"path": found, "files_digest": identity.files_digest(Path(found))} if found else {"path": None}
    key = {"python": str(Path(python).resolve()), "triton": triton, "env": dict(sorted(side.env.items()))}
    key["digest"] = hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:16]
    return key


def pythonpath(side: Side) -> str | None:
    """A pip-built side already sees the base env's paths and .nox/deps, after its own (see
    build_side_env): it gets the checkout alone."""
    return str(paths.REPO_ROOT) if side.requirements else None
