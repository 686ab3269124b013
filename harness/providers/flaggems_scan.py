"""The static scan of a FlagGems-style checkout into inventory entries, and pytest's collection
check of it (see harness.providers.catalog for the columns). Nothing is imported from the checkout:
FlagGems modules need a GPU to import at all, and one broken module must not hide the others."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

from harness.core import bounded
from harness.providers.catalog import Entry, SelectionError

COLLECT_TIMEOUT_S = 1800

@dataclasses.dataclass
class _Module:
    classes: dict[str, ast.ClassDef]
    functions: dict[str, ast.FunctionDef]
    imports: dict[str, tuple[Path, str | None]]  # local name -> (module file, attribute or None: the module)
    assigns: dict[str, ast.expr]  # module-level `NAME = expr`: mark aliases, pytestmark


def _parse_module(path: Path, checkout: Path) -> _Module:
    tree = ast.parse(bounded.read_text(path, "Python source"), filename=str(path))
    mod = _Module({}, {}, {}, {})
    for node in tree.body:  # later definitions win, as at import time
        if isinstance(node, ast.ClassDef):
            mod.classes[node.name] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.functions[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            mod.assigns[node.targets[0].id] = node.value
        elif isinstance(node, ast.ImportFrom):
            target = _import_target(path, node, checkout)
            for alias in node.names if target else []:
                sub = target / f"{alias.name}.py"
                mod.imports[alias.asname or alias.name] = (sub, None) if sub.is_file() else (_module_file(target),
                                                                                             alias.name)
    return mod


def _import_target(path: Path, node: ast.ImportFrom, checkout: Path) -> Path | None:
    """The module or package path (no suffix) a `from X import ...` reads, when X lies in the
    checkout: relative imports, and `benchmark.*` (the suite's subfolders import it that way)."""
    if node.level:
        base = path.parents[node.level - 1]
    elif (node.module or "").split(".")[0] == "benchmark":
        base = checkout
    else:
        return None
    return base.joinpath(*node.module.split(".")) if node.module else base


def _module_file(target: Path) -> Path:
    as_file = target.with_name(target.name + ".py")
    return as_file if as_file.is_file() else target / "__init__.py"


class _Scanner:
    """Resolves Benchmark classes statically across the suite's modules (test modules, base.py)."""

    def __init__(self, checkout: Path):
        self.checkout = checkout
        self.modules: dict[Path, _Module | None] = {}
        self.mros: dict[ast.ClassDef, list[str]] = {}

    def module(self, path: Path) -> _Module | None:
        if path not in self.modules:
            try:
                self.modules[path] = _parse_module(path, self.checkout) if path.is_file() else None
            except SyntaxError:
                self.modules[path] = None
        return self.modules[path]

    def resolve(self, path: Path, expr: ast.expr) -> tuple[Path, ast.ClassDef] | str | None:
        """A class reference: (module file, its definition) when defined in the checkout, the bare
        name when it is not (e.g. `object`, a torch class), None for any other expression."""
        mod = self.module(path)
        if mod is None:
            return None
        if isinstance(expr, ast.Name):
            return self._resolve_name(path, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            target = mod.imports.get(expr.value.id)
            if target and target[1] is None:
                return self._resolve_name(target[0], expr.attr)
            return expr.attr
        return None

    def _resolve_name(self, path: Path, name: str, depth: int = 0) -> tuple[Path, ast.ClassDef] | str:
        mod = self.module(path)
        if mod is not None and name in mod.classes:
            return (path, mod.classes[name])
        target = mod.imports.get(name) if mod is not None else None
        if target and target[1] and depth < 8:  # re-export chains are short; deeper is a cycle
            return self._resolve_name(target[0], target[1], depth + 1)
        return name

    def mro(self, ref: tuple[Path, ast.ClassDef] | str, seen: frozenset = frozenset()) -> list[str]:
        """The class's MRO by name; bases resolve in its module's scope (also for a class defined
        inside a test function, as several FlagGems benchmarks are)."""
        if isinstance(ref, str):
            return [ref]
        path, node = ref
        if node in self.mros:
            return self.mros[node]
        if node in seen:
            return [node.name]
        bases = [b for b in (self.resolve(path, e) for e in node.bases) if b is not None]
        linear = [self.mro(b, seen | {node}) for b in bases]
        result = [node.name, *_c3_merge([*linear, [b if isinstance(b, str) else b[1].name for b in bases]])]
        self.mros[node] = result
        return result

    def default_op_name(self, ref: tuple[Path, ast.ClassDef], depth: int = 0) -> str | None:
        """The op_name literal a class passes up in its `__init__` (`super().__init__("x", ...)`),
        for benchmarks constructed without one; a class without `__init__` inherits its base's."""
        path, node = ref
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            base = next((b for b in (self.resolve(path, e) for e in node.bases) if isinstance(b, tuple)), None)
            return self.default_op_name(base, depth + 1) if base and depth < 8 else None
        for call in ast.walk(init):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__":
                arg = _op_name_arg(call)
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    return arg.value
        return None


def _c3_merge(seqs: list[list[str]]) -> list[str]:
    """Python's MRO merge; an inconsistent hierarchy (Python would refuse it) degrades to
    left-to-right order rather than stopping the scan."""
    seqs = [list(s) for s in seqs if s]
    out: list[str] = []
    while seqs:
        head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None)
        if head is None:
            head = seqs[0][0]
        out.append(head)
        seqs = [[x for x in s if x != head] for s in seqs]
        seqs = [s for s in seqs if s]
    return out


def _mark(expr: ast.expr, mod: _Module, depth: int = 0) -> tuple[str, ast.Call | None] | None:
    """(`pytest.mark.<name>`, its call if called) for a decorator or pytestmark item."""
    if isinstance(expr, ast.Name) and expr.id in mod.assigns and depth < 4:
        return _mark(mod.assigns[expr.id], mod, depth + 1)
    call = expr if isinstance(expr, ast.Call) else None
    target = call.func if call else expr
    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
            and target.value.attr == "mark"):
        return target.attr, call
    return None


def _skip_reason(marks: list[ast.expr], mod: _Module) -> str:
    """The reason of an unconditional skip among `marks`: `skip`, or `skipif` on a literal True."""
    for expr in marks:
        found = _mark(expr, mod)
        if found is None or found[0] not in ("skip", "skipif"):
            continue
        name, call = found
        args = list(call.args) if call else []
        if name == "skipif":
            if not (args and isinstance(args[0], ast.Constant) and args[0].value is True):
                continue
            args = args[1:]
        reason = next((k.value for k in call.keywords if k.arg == "reason"), None) if call else None
        reason = reason or (args[0] if args else None)
        if isinstance(reason, ast.Constant) and isinstance(reason.value, str) and reason.value:
            return reason.value
        return "skip mark without a literal reason"
    return ""


def _op_file(rel: Path) -> str:
    return "/".join(part.removeprefix("test_") for part in rel.with_suffix("").parts)


def _benchmarks(scanner: _Scanner, path: Path, fn: ast.FunctionDef, bindings: dict[str, str],
                seen: set[str]) -> tuple[list[str], list[str]]:
    """(op_names, class MRO names) of the Benchmarks `fn` constructs, following calls into the
    module's own helper functions, whose literal arguments bind the helper's parameters."""
    mod = scanner.module(path)
    local = {n.name: n for n in ast.walk(fn) if isinstance(n, ast.ClassDef)}
    op_names: list[str] = []
    classes: list[str] = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in mod.functions and node.func.id not in seen:
            helper = mod.functions[node.func.id]
            names, mro = _benchmarks(scanner, path, helper, _bind(helper, node, bindings), seen | {node.func.id})
            op_names += names
            classes += mro
            continue
        if isinstance(node.func, ast.Name) and node.func.id in local:
            ref = (path, local[node.func.id])
        else:
            ref = scanner.resolve(path, node.func)
        if not isinstance(ref, tuple) or "Benchmark" not in scanner.mro(ref):
            continue
        classes += [c for c in scanner.mro(ref) if c != "object"]
        arg = _op_name_arg(node)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            op_names.append(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in bindings:
            op_names.append(bindings[arg.id])
        elif arg is None and (default := scanner.default_op_name(ref)):
            op_names.append(default)
    return op_names, classes


def _op_name_arg(call: ast.Call) -> ast.expr | None:
    """`op_name=`, else the first positional argument (Benchmark's first parameter)."""
    return next((k.value for k in call.keywords if k.arg == "op_name"), call.args[0] if call.args else None)


def _bind(helper: ast.FunctionDef, call: ast.Call, outer: dict[str, str]) -> dict[str, str]:
    """The helper's parameters that the call passes string literals (or bound names) to."""
    params = [a.arg for a in helper.args.posonlyargs + helper.args.args]
    pairs = list(zip(params, call.args, strict=False)) + [(k.arg, k.value) for k in call.keywords if k.arg]
    bound = {}
    for name, value in pairs:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            bound[name] = value.value
        elif isinstance(value, ast.Name) and value.id in outer:
            bound[name] = outer[value.id]
    return bound


def scan(checkout: Path, repo: str) -> list[Entry]:
    """One entry per module-level `def test_*` of the checkout's benchmark suite."""
    bench = checkout / "benchmark"
    scanner = _Scanner(checkout)
    entries = []
    for path in sorted(bench.rglob("test_*.py")):
        rel = path.relative_to(bench)
        if not all(part.startswith("test_") for part in rel.parts[:-1]):
            continue  # pytest runs of the suite never reach helper folders (models_benchmark/ ...)
        mod = scanner.module(path)
        if mod is None:
            raise SelectionError(f"{path}: not valid Python; fix it or the inventory would silently lose its ops")
        module_marks = mod.assigns.get("pytestmark")
        module_marks = (list(module_marks.elts) if isinstance(module_marks, (ast.List, ast.Tuple))
                        else [module_marks] if module_marks is not None else [])
        for name, fn in mod.functions.items():
            if not name.startswith("test_"):
                continue
            op_names, classes = _benchmarks(scanner, path, fn, {}, {name})
            entries.append(Entry(
                repo=repo, op=name.removeprefix("test_"), op_file=_op_file(rel),
                file=str(path.relative_to(checkout)),
                skip=_skip_reason([*fn.decorator_list, *module_marks], mod),
                op_names=";".join(dict.fromkeys(op_names)), classes=";".join(dict.fromkeys(classes))))
    return entries


def verify_collect(checkout: Path, entries: list[Entry]) -> list[Entry]:
    """Entries with `collected` set from `pytest --collect-only` run in the checkout (its own
    pytest config and conftest), in a subprocess: what the scan found and pytest did not
    collect (import error, no such device) is marked `no`."""
    files = sorted({e.file for e in entries})
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "--rootdir", str(checkout), "--continue-on-collection-errors", *files]
    try:
        proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=COLLECT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise SelectionError(f"--verify-collect: pytest did not finish collecting {checkout} in "
                             f"{COLLECT_TIMEOUT_S} s") from exc
    collected = set()
    for line in proc.stdout.splitlines():
        file, sep, rest = line.strip().partition("::")
        if sep and "::" not in rest:  # methods of test classes are not inventory entries
            collected.add((file, rest.split("[")[0]))
    # Exit 3/4 (internal or usage error, e.g. the conftest fails to import) says nothing per file:
    # writing `no` everywhere would record the environment, not the suite.
    if proc.returncode in (3, 4) or (not collected and proc.returncode != 5):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SelectionError(f"--verify-collect: pytest could not collect in {checkout} "
                             f"(exit {proc.returncode}):\n{tail}")
    return [dataclasses.replace(e, collected="yes" if (e.file, f"test_{e.op}") in collected else "no")
            for e in entries]


def keep_verified(fresh: list[Entry], previous: list[Entry]) -> list[Entry]:
    """Fresh scan entries with the `collected` value of the same op in the previous inventory."""
    known = {(e.op_file, e.op): e.collected for e in previous}
    return [dataclasses.replace(e, collected=known.get((e.op_file, e.op), "")) for e in fresh]


