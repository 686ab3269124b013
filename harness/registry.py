"""Find operators: the built-in corpus (`ops/<name>.py`) and user directories or modules given
with --ops-path, in the same form. Only the module that defines the asked-for operator is needed;
a name defined twice is an error, never a silent overwrite."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ops import Operator

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "ops"


class OperatorNotFound(LookupError):
    pass


def _operators_in(module) -> list[Operator]:
    return [v for v in vars(module).values() if isinstance(v, Operator)]


def _import_file(path: Path):
    # Deterministic module names: autotune records key kernels by module, so the same file must
    # get the same name in the record run and the replay run.
    name = f"zl_ops_path.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _user_modules(ops_path: str):
    path = Path(ops_path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        if not files:
            raise OperatorNotFound(f"--ops-path {ops_path}: no operator modules (*.py) in it")
        for f in files:
            yield str(f), _import_file(f)
    elif path.suffix == ".py":
        if not path.is_file():
            raise OperatorNotFound(f"--ops-path {ops_path}: no such file")
        yield str(path), _import_file(path)
    else:
        try:
            yield ops_path, importlib.import_module(ops_path)
        except ImportError as exc:
            raise OperatorNotFound(
                f"--ops-path {ops_path}: not a directory, .py file or importable module ({exc})") from exc


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.py") if not p.name.startswith("_"))


def load(name: str, ops_paths: list[str] = ()) -> tuple[Operator, str]:
    """(operator, provider): provider is 'builtin' or the --ops-path entry that defined it."""
    found: list[tuple[Operator, str]] = []
    for entry in ops_paths:
        for where, module in _user_modules(entry):
            found += [(op, where) for op in _operators_in(module) if op.name == name]
    if name in builtin_names():
        module = importlib.import_module(f"ops.{name}")
        found += [(op, "builtin") for op in _operators_in(module) if op.name == name]
    if not found:
        known = ", ".join(builtin_names())
        raise OperatorNotFound(f"unknown operator '{name}'; built-in: {known}; add your own with --ops-path DIR")
    if len(found) > 1:
        places = "; ".join(where for _, where in found)
        raise OperatorNotFound(f"operator '{name}' is defined more than once: {places}")
    return found[0]
