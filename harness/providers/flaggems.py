"""FlagGems-style benchmark checkouts as an operator source, driven as they are.

A checkout has `benchmark/` (a pytest package: conftest, base.Benchmark and its subclasses,
`test_<file>.py::test_<op>`) and `src/<package>` (flag_gems, or flaggems_vllm for FlagGems-vllm).
This module resolves what the user named into one pytest node; what the parent records about the
run (level, FlagTune switch, LibTuner cache) is the spec's typed harness.core.spec.FlagGemsOptions;
harness.child.plugins.flaggems does the work inside the child.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import importlib
import os
import sys
from pathlib import Path

from harness.core import bounded, forkserver
from harness.core.options import DEFAULT_REPO, UPSTREAM, split_dir  # what the parser checks
from harness.core.spec import FlagGemsOptions
from harness.providers import catalog

# Repo names of the other operator sources (harness.providers.catalog): the built-in corpus, --ops-path.
RESERVED_REPOS = (catalog.BUILTIN, catalog.PATH_REPO)  # not checkout names
PACKAGES = ("flag_gems", "flaggems_vllm")
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


class FlagGemsError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Target:
    repo: str
    root: str  # the checkout
    test_file: str  # relative to the checkout
    function: str

    @property
    def op(self) -> str:
        return self.function.removeprefix("test_")

    @property
    def node(self) -> str:
        return f"{self.test_file}::{self.function}"


def parse_dirs(items: list[str] | None) -> dict[str, Path]:
    """`--flaggems-dir [NAME=]PATH` values as {name: checkout}."""
    dirs: dict[str, Path] = {}
    for item in items or []:
        name, path = split_dir(item)
        if not name.isidentifier() or not path:
            raise FlagGemsError(f"--flaggems-dir {item}: expected [NAME=]PATH, NAME an identifier (it prefixes "
                                "op names)")
        if name in RESERVED_REPOS:
            raise FlagGemsError(f"--flaggems-dir {item}: NAME '{name}' is reserved; choose another")
        if name in dirs:
            raise FlagGemsError(f"--flaggems-dir: NAME '{name}' given twice ({dirs[name]} and {path}); "
                                "name each checkout with NAME=PATH")
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise FlagGemsError(f"--flaggems-dir {item}: {root} is not a directory")
        if not (root / "benchmark").is_dir():
            raise FlagGemsError(f"--flaggems-dir {item}: {root} has no benchmark/ folder (not a FlagGems checkout?)")
        dirs[name] = root
    return dirs


def is_target(op_arg: str) -> bool:
    """Whether an operator argument names a FlagGems-style benchmark rather than a built-in or
    --ops-path op."""
    return "::" in op_arg or catalog.Selection.parse(op_arg).repo not in (None, *RESERVED_REPOS)


def functions_in(path: Path) -> list[str]:
    tree = ast.parse(bounded.read_text(path, "Python source"), filename=str(path))
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def _file_for(op_file: str) -> str:
    """op_file as the inventory writes it: `softmax`, or `FLA/chunk` for a test_-prefixed subfolder."""
    *folders, stem = op_file.split("/")
    return "/".join(["benchmark", *(f"test_{f}" for f in folders), f"test_{stem}.py"])


def _inventory_file(repo: str, op: str) -> str | None:
    files = [e.file for e in catalog.read_csv(catalog.inventory_path(repo)) if e.op == op]
    return files[0] if len(files) == 1 else None


def resolve_target(op_arg: str, dirs: dict[str, Path]) -> Target:
    """`REPO:OP[@OP_FILE]` or a pytest node `PATH/benchmark/test_x.py::test_op`, checked up front."""
    if "::" in op_arg:
        file_part, _, function = op_arg.partition("::")
        path = Path(file_part).expanduser().resolve()
        if not path.is_file():
            raise FlagGemsError(f"pytest node {op_arg}: {path} does not exist")
        root = next((p.parent for p in path.parents if p.name == "benchmark"), None)
        if root is None:
            raise FlagGemsError(f"pytest node {op_arg}: the file is not under a benchmark/ folder")
        repo = next((name for name, d in dirs.items() if d == root), DEFAULT_REPO)
        target = Target(repo, str(root), str(path.relative_to(root)), function)
    else:
        selection = catalog.Selection.parse(op_arg)
        repo, op, op_file = selection.repo, selection.op, selection.op_file
        if repo not in dirs:
            given = ", ".join(f"{n}={p}" for n, p in dirs.items()) or "none"
            raise FlagGemsError(f"'{op_arg}': no checkout for repo '{repo}'; give --flaggems-dir {repo}=PATH "
                                f"(given: {given})")
        if not op:
            raise FlagGemsError(f"'{op_arg}': no operator name after '{repo}:'")
        root = dirs[repo]
        # test_<op>.py first; else where the repo's inventory says the op lives (test_softmax.py
        # holds softmax_backward too).
        candidates = [_file_for(op_file)] if op_file else [_file_for(op), _inventory_file(repo, op)]
        rel = next((c for c in candidates if c and (root / c).is_file()), candidates[0])
        path = root / rel
        if not path.is_file():
            hint = "" if op_file else f"; if the op lives in another file, give {repo}:{op}@<file> or a pytest node"
            raise FlagGemsError(f"'{op_arg}': benchmark file {path} does not exist{hint}")
        target = Target(repo, str(root), rel, f"test_{op}")
    path = Path(target.root) / target.test_file
    found = functions_in(path)
    if target.function not in found:
        raise FlagGemsError(f"{path} has no function {target.function} (it has: {', '.join(found) or 'none'})")
    return target


def package_dir(root: Path) -> tuple[str, Path] | None:
    """(package name, the folder to put on sys.path) when the checkout carries its package sources."""
    for name in PACKAGES:
        if (root / "src" / name / "__init__.py").is_file():
            return name, root / "src"
    return None


def shapes_source(options: FlagGemsOptions) -> str:
    """The spec's `shapes_source` of a FlagGems run: its shape file, or the checkout's own shapes."""
    return options.shapes_file or f"{UPSTREAM} (level {options.level})"


def libtuner_db_url(choice: str, run_dir: Path) -> str | None:
    """FLAGGEMS_DB_URL for the child; None keeps FlagGems' own (its ~/.flaggems cache)."""
    if choice == "private":
        return f"sqlite:///{run_dir / 'libtuner_cache.db'}"
    if choice == "user":
        return None
    return choice if "://" in choice else f"sqlite:///{Path(choice).expanduser().resolve()}"


# --- a checkout's package imported once by a warm worker (harness.worker) --------------------------
@dataclasses.dataclass(frozen=True)
class Preloaded:
    """A package a warm worker imported for the steps it forks: from which sources, under which
    FlagTune switch (FlagGems reads USE_FLAGTUNE into its config tables as it is imported)."""

    package: str
    src: str
    flagtune: str


PRELOADED: dict[str, Preloaded] = {}  # package -> how this process imported it (the worker's, inherited by its steps)
# package -> its LibTuner instances, made as it was imported: each took its config cache from the LibCache of
# the worker's import (FlagGems: `self.cache = libcache[table]`), which a step's rebind must replace too.
_TUNERS: dict[str, list] = {}
IMPORT_DB = "preload_libtuner_cache.db"  # the LibTuner cache a worker's import opens; each step rebinds it


def preload(root: Path, flagtune: str, vendor: str | None, standing_in, scratch: Path) -> Preloaded:
    """Import `root`'s package here, as a step's child would (its vendor, FlagTune switch and a LibTuner
    cache in `scratch`, which each step then rebinds to its run's: rebind_libtuner_cache), inside
    `standing_in` (Backend.facts_standing_in with the steps' device facts). Any exception: nothing of
    the package is left imported, and the environment and sys.path are as they were."""
    found = package_dir(root)
    if found is None:
        raise FlagGemsError(f"{root}: no src/{' or src/'.join(PACKAGES)} package to import")
    package, src = found
    if package in PRELOADED and PRELOADED[package].src == str(src):
        return PRELOADED[package]
    if package in sys.modules:  # another checkout's, under the same name: its steps' children import their own
        raise FlagGemsError(f"{package} is imported here already, from "
                            f"{getattr(sys.modules[package], '__file__', None)}: one package of a name per worker")
    saved_env = {key: os.environ.get(key) for key in ("GEMS_VENDOR", "USE_FLAGTUNE", "FLAGGEMS_DB_URL")}
    if vendor and "GEMS_VENDOR" not in os.environ:
        os.environ["GEMS_VENDOR"] = vendor
    os.environ["USE_FLAGTUNE"] = flagtune
    os.environ["FLAGGEMS_DB_URL"] = f"sqlite:///{scratch / IMPORT_DB}"
    sys.path.insert(0, str(src))
    try:
        with standing_in:
            importlib.import_module(package)
    except BaseException:
        for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
            del sys.modules[name]
        sys.path.remove(str(src))
        raise
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    PRELOADED[package] = Preloaded(package, str(src), flagtune)
    tuner = getattr(sys.modules.get(f"{package}.utils.libentry"), "LibTuner", None)
    # type(), not isinstance: a module proxy's __class__ can warn (torch.distributed.reduce_op) or raise
    _TUNERS[package] = [o for o in gc.get_objects() if issubclass(type(o), tuner)] if isinstance(tuner, type) else []
    return PRELOADED[package]


def preload_misfit(options: FlagGemsOptions | None) -> str | None:
    """Why a step of `options` cannot run on what this process preloaded (its child must then start
    fresh and import the package itself), or None where it can: another checkout's package or another
    FlagTune switch loaded under the name it imports."""
    if options is None or not PRELOADED:
        return None
    found = package_dir(Path(options.root))
    if found is None:
        return None
    loaded = PRELOADED.get(found[0])
    if loaded is None:
        return None
    if loaded.src != str(found[1]):
        return f"{found[0]} was preloaded from {loaded.src}, this run's checkout is {options.root}"
    if loaded.flagtune != options.flagtune:
        return f"{found[0]} was preloaded with USE_FLAGTUNE={loaded.flagtune}, this run has {options.flagtune}"
    return None


def rebind_libtuner_cache(url: str | None) -> bool:
    """A preloaded package's LibTuner cache pointed at this run's (`url`; None: FlagGems' own), as its
    import would have opened it; whether there was one to rebind. FlagGems' LibCache is one instance,
    read as a module global: it is initialized again in place; and each LibTuner made at the import
    holds a config cache taken from it then: each gets its table's anew, from the rebound one."""
    rebound = False
    for package in PRELOADED:
        libentry = sys.modules.get(f"{package}.utils.libentry")
        cache = getattr(libentry, "libcache", None)
        if cache is None:
            continue
        type(cache).__init__(cache, url)
        for tuner in _TUNERS.get(package, ()):
            table = getattr(tuner, "config_table_name", None)
            if table is not None and hasattr(tuner, "cache"):
                tuner.cache = cache[table]
        rebound = True
    return rebound


def preload_for(ops, flaggems_dirs, flagtune: str | None, device: int | None):
    """What a warm worker whose steps run `ops` preloads (forkserver.Preload): the checkouts those ops
    come from (every one where an op is a pytest node), under the steps' FlagTune switch (as
    harness.sessions.resolve defaults it); None where no op comes from a checkout."""
    dirs = parse_dirs(list(flaggems_dirs))
    wanted = set()
    for op in ops:
        if "::" in op:
            wanted.update(dirs)
        elif (repo := catalog.Selection.parse(op).repo) in dirs:
            wanted.add(repo)
    if not wanted:
        return None
    return forkserver.Preload(tuple(dict.fromkeys(str(dirs[name]) for name in sorted(wanted))),
                              flagtune or os.environ.get("USE_FLAGTUNE", "0"), device)
