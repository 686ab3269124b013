"""Find operators: the built-in corpus (`ops/<name>.py`) and user directories or modules given
with --ops-path, in the same form. Only the module that defines the asked-for operator is needed;
a name defined twice is an error, never a silent overwrite.

A user module that fails to import (syntax error, missing dependency...) breaks only the runs
that need it: the others go on and say in one warning line which module was skipped and why; an
operator found nowhere names every such failure, since the broken module may be its home."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.core.paths import OPS_DIR
from ops import Operator

BUILTIN_DIR = OPS_DIR


class OperatorNotFound(LookupError):
    pass


class ImportFailed(OperatorNotFound):
    """A module that raised while importing: `where` is the module, `line` the one-line story
    `<file>:<line>: <Type>: <message>`, located in the module's own code."""

    def __init__(self, where: str, line: str):
        super().__init__(line)
        self.where = where
        self.line = line


# Per process: a broken module is imported (and reported) once, however many operators are looked up.
_failed: dict[str, ImportFailed] = {}
_warned: set[str] = set()


def _operators_in(module) -> list[Operator]:
    # One object bound to two names (an alias) is one operator.
    return list({id(v): v for v in vars(module).values() if isinstance(v, Operator)}.values())


def describe_failure(exc: BaseException, roots: tuple[Path, ...]) -> str:
    """`<file>:<line>: <Type>: <first line of message>` at the user's code: for a SyntaxError
    where the parser stopped, else the deepest frame under one of `roots` (the user's module or
    package), else the deepest frame outside the import machinery."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: {type(exc).__name__}: {exc.msg}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    mine = [f for f in frames if any(Path(f.filename).resolve().is_relative_to(r) for r in roots)]
    frame = (mine or frames or [None])[-1]
    message = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"{frame.filename}:{frame.lineno}: {text}" if frame else text


def _interrupted(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _exec(name: str, where: str, roots: tuple[Path, ...], importer: Callable[[], object]):
    if where in _failed:
        raise _failed[where]
    try:
        return importer()
    except KeyboardInterrupt:
        raise  # a Ctrl-C, not the module's failure: the run stops as a Ctrl-C stops it
    except BaseException as exc:  # whatever a user module raises at import (sys.exit too), in one line
        sys.modules.pop(name, None)  # a half-run module must not be found later as if it were whole
        if _interrupted(exc):
            # A Ctrl-C that struck inside a library's import, which then failed otherwise on its way
            # out (torch: "cannot load module more than once"): the Ctrl-C is what happened.
            raise KeyboardInterrupt from exc
        _failed[where] = ImportFailed(where, describe_failure(exc, roots))
        raise _failed[where] from exc


def _import_file(path: Path):
    # Deterministic module names: autotune records key kernels by module, so the same file must
    # get the same name in the record run and the replay run. A second file with the stem of one
    # already loaded gets its path's digest appended (the same --ops-path list loads them in the
    # same order in both runs).
    path = path.resolve()
    name = f"zl_ops_path.{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and Path(loaded.__file__).resolve() != path:
        name = f"{name}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded

    def run():
        # Its folder's other files (helpers such as `_common.py`) import by name; appended, so
        # they never shadow an installed module.
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return _exec(name, str(path), (path.resolve().parent,), run)


def _import_name(name: str):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:  # a parent package that does not import, or a bad name
        spec, reason = None, str(exc)
    else:
        reason = "no such module"
    if spec is None:
        raise OperatorNotFound(f"--ops-path {name}: not a directory, .py file or importable module ({reason})")
    roots = tuple(Path(p).resolve() for p in spec.submodule_search_locations or ()) or (
        (Path(spec.origin).resolve().parent,) if spec.origin else ())
    return _exec(name, name, roots, lambda: importlib.import_module(name))


def user_modules(ops_path: str) -> Iterator[tuple[str, Callable[[], object]]]:
    """(where, importer) per module of one --ops-path entry; importing is left to the caller so
    that one module's failure does not stop the others."""
    path = Path(ops_path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        if not files:
            raise OperatorNotFound(f"--ops-path {ops_path}: no operator modules (*.py) in it")
        for f in files:
            yield str(f), lambda f=f: _import_file(f)
    elif path.suffix == ".py":
        if not path.is_file():
            raise OperatorNotFound(f"--ops-path {ops_path}: no such file")
        yield str(path), lambda: _import_file(path)
    else:
        yield ops_path, lambda: _import_name(ops_path)


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.py") if not p.name.startswith("_"))


def op_file(name: str, provider: str) -> str:
    """The FILE of `[REPO:]OP[@FILE]` for operator `name` as `load` found it at `provider`: its module's name
    (a built-in operator's module is named after it)."""
    if provider == "builtin":
        return name
    return Path(provider).stem if provider.endswith(".py") else provider.rpartition(".")[2]


def _warn_stderr(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def load(name: str, ops_paths: list[str] = (),
         warn: Callable[[str], None] = _warn_stderr) -> tuple[Operator, str]:
    """(operator, provider): provider is 'builtin' or the --ops-path entry that defined it.
    `warn` gets one line per user module skipped because it does not import (once per process)."""
    found: list[tuple[Operator, str]] = []
    failed: list[ImportFailed] = []
    for entry in ops_paths:
        for where, importer in user_modules(entry):
            try:
                module = importer()
            except ImportFailed as exc:
                failed.append(exc)
                continue
            found += [(op, where) for op in _operators_in(module) if op.name == name]
    if name in builtin_names():
        module = _exec(f"ops.{name}", str(BUILTIN_DIR / f"{name}.py"), (BUILTIN_DIR,),
                       lambda: importlib.import_module(f"ops.{name}"))
        found += [(op, "builtin") for op in _operators_in(module) if op.name == name]
    if not found and failed:
        stories = "; ".join(f.line for f in failed)
        raise OperatorNotFound(f"{stories} (operator '{name}' is defined nowhere else: "
                               f"{'that module' if len(failed) == 1 else 'one of those modules'} may be its home)")
    if not found:
        known = ", ".join(builtin_names())
        close = difflib.get_close_matches(name, builtin_names(), n=3)
        guess = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise OperatorNotFound(f"unknown operator '{name}'{guess}; built-in: {known}; add your own with --ops-path DIR")
    found = list({id(op): (op, where) for op, where in found}.values())  # one file reached twice
    if len(found) > 1:
        places = "; ".join(where for _, where in found)
        raise OperatorNotFound(f"operator '{name}' is defined more than once: {places}")
    for f in failed:
        if f.where not in _warned:
            _warned.add(f.where)
            warn(f"skipped operator module {f.where}, which does not import: {f.line}")
    return found[0]
