"""The operator inventories (`ops/inventory_<repo>.csv`), the dismiss list, and batch selection.

Inventories come from static scans (no imports: one broken module must not hide the others, and
FlagGems modules need a GPU to import at all):

- the built-in corpus, repo `builtin`: `name = Operator(name="...", ...)` in `ops/*.py`;
- a FlagGems-style checkout given as `--flaggems-dir NAME=PATH`, repo NAME: every module-level
  `def test_<op>` in `PATH/benchmark/test_<file>.py`, also inside `test_`-prefixed subfolders.

Columns: `op` (the function name minus `test_`), `op_file` (the file's path under `benchmark/`
with each `test_` prefix and `.py` dropped: `test_mm.py` -> `mm`, `test_FLA/test_kda.py` ->
`FLA/kda`), `file` (relative to the checkout), `skip` (the reason of an unconditional skip mark;
`skipif` is conditional and not recorded), `op_names` (the `op_name` literal(s) of the Benchmarks
the function constructs), `classes` (those Benchmarks' class MRO by name: the shape-file keys
FlagGems falls back to after the op_name), `collected` (`yes`/`no` from the last
`--verify-collect`, blank if never verified). Multi-valued cells are `;`-joined.

Selection entries are `[repo:]op[@op_file]`; every unknown or ambiguous entry is reported at
once, before anything runs.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import yaml

from harness import flaggems, rundir

OPS_DIR = Path(__file__).resolve().parent.parent / "ops"
DISMISS_FILE = OPS_DIR / "dismiss.txt"
COLUMNS = ("repo", "op", "op_file", "file", "skip", "op_names", "classes", "collected")
BUILTIN, PATH_REPO = flaggems.RESERVED_REPOS  # the built-in corpus; operators found in --ops-path
COLLECT_TIMEOUT_S = 1800


class SelectionError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Entry:
    repo: str
    op: str
    op_file: str
    file: str
    skip: str = ""  # an unconditional skip mark's reason; such entries never run under --all
    op_names: str = ""
    classes: str = ""
    collected: str = ""
    # Set by `select` when another entry of the same repo has the same op: the key then names
    # the op_file too, so status rows and per-op dirs stay distinct.
    qualified: bool = dataclasses.field(default=False, compare=False)

    @property
    def key(self) -> str:
        """What logs and batch.json show: `repo:op`, or `repo:op@op_file` where `op` alone is ambiguous."""
        return f"{self.repo}:{self.op}@{self.op_file}" if self.qualified else f"{self.repo}:{self.op}"

    @property
    def id(self) -> str:
        """Unique whatever else is loaded: status rows and sharding use it."""
        return f"{self.repo}:{self.op}@{self.op_file}"


def needs_checkout(repo: str) -> bool:
    """FlagGems inventories list operators that run from a checkout given with --flaggems-dir."""
    return repo not in (BUILTIN, PATH_REPO)


# --- the built-in corpus -------------------------------------------------------------------------
def scan_module(path: Path, repo: str, root: Path) -> list[Entry]:
    """Operators defined in a module as `name = Operator(name="...", ...)`, found statically."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or getattr(node.func, "id", None) != "Operator":
            continue
        name = _literal_kw(node, "name")
        if name:
            found.append(Entry(repo, name, path.stem, str(path.relative_to(root)), _literal_kw(node, "skip") or "",
                               name))
    return found


def scan_dir(directory: Path, repo: str, root: Path | None = None) -> list[Entry]:
    root = root or directory.parent
    entries = []
    for path in sorted(directory.glob("*.py")):
        if not path.name.startswith("_"):
            entries += scan_module(path, repo, root)
    return entries


def builtin_family_keys(ops_dir: Path = OPS_DIR) -> set[str]:
    """The shape-file family keys the built-in operators fall back to (`shape_keys=(...)`)."""
    keys = set()
    for path in ops_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Operator":
                for kw in node.keywords:
                    if kw.arg == "shape_keys" and isinstance(kw.value, (ast.Tuple, ast.List)):
                        keys |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
    return keys


def _literal_kw(call: ast.Call, name: str):
    return next((k.value.value for k in call.keywords if k.arg == name and isinstance(k.value, ast.Constant)), None)


# --- FlagGems checkouts --------------------------------------------------------------------------
@dataclasses.dataclass
class _Module:
    classes: dict[str, ast.ClassDef]
    functions: dict[str, ast.FunctionDef]
    imports: dict[str, tuple[Path, str | None]]  # local name -> (module file, attribute or None: the module)
    assigns: dict[str, ast.expr]  # module-level `NAME = expr`: mark aliases, pytestmark


def _parse_module(path: Path, checkout: Path) -> _Module:
    tree = ast.parse(path.read_text(), filename=str(path))
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


def scan_flaggems(checkout: Path, repo: str) -> list[Entry]:
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


# --- files ---------------------------------------------------------------------------------------
def inventory_path(repo: str, ops_dir: Path = OPS_DIR) -> Path:
    return ops_dir / f"inventory_{repo}.csv"


def to_csv(entries: list[Entry]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for e in sorted(entries, key=lambda e: (e.op_file, e.op)):
        w.writerow([getattr(e, c) for c in COLUMNS])
    return out.getvalue()


def read_csv(path: Path) -> list[Entry]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [Entry(**{c: row.get(c, "") or "" for c in COLUMNS}) for row in csv.DictReader(f)]


def load(ops_dir: Path = OPS_DIR) -> list[Entry]:
    entries = []
    for path in sorted(ops_dir.glob("inventory_*.csv")):
        entries += read_csv(path)
    return entries


def load_dismissed(path: Path = DISMISS_FILE) -> dict[str, str]:
    """`[repo:]op[@op_file]  # reason` per line; an entry without a reason is an error."""
    dismissed = {}
    if not path.is_file():
        return dismissed
    for n, line in enumerate(path.read_text().splitlines(), 1):
        body, _, reason = line.partition("#")
        body = body.strip()
        if not body:
            continue
        if not reason.strip():
            raise SelectionError(f"{path}:{n}: '{body}' has no reason (write `op  # why it is dismissed`)")
        dismissed[body] = reason.strip()
    return dismissed


# --- selection -----------------------------------------------------------------------------------
def _matches(entry: Entry, spec: str) -> bool:
    repo, _, rest = spec.rpartition(":")
    op, _, op_file = rest.partition("@")
    return entry.op == op and (not repo or entry.repo == repo) and (not op_file or entry.op_file == op_file)


def qualify(entries: list[Entry]) -> list[Entry]:
    """Mark entries whose `repo:op` is shared with another entry (FlagGems has a few test names
    defined in two files), so their keys carry the op_file."""
    counts: dict[tuple[str, str], int] = {}
    for e in entries:
        counts[(e.repo, e.op)] = counts.get((e.repo, e.op), 0) + 1
    return [dataclasses.replace(e, qualified=counts[(e.repo, e.op)] > 1) for e in entries]


def select(entries: list[Entry], specs: list[str] | None, all_ops: bool, repos: list[str] | None,
           dismissed: dict[str, str]) -> tuple[list[Entry], list[tuple[Entry, str]]]:
    """(selected, excluded with reasons). Unknown or ambiguous specs raise, listing every one."""
    pool = [e for e in qualify(entries) if not repos or e.repo in repos]
    if all_ops:
        chosen = list(pool)
    else:
        chosen, bad = [], []
        for spec in specs or []:
            hits = [e for e in pool if _matches(e, spec)]
            if not hits:
                bad.append(f"'{spec}': unknown")
            elif len(hits) > 1:
                bad.append(f"'{spec}': ambiguous ({', '.join(f'{h.repo}:{h.op}@{h.op_file}' for h in hits)})")
            else:
                chosen.append(hits[0])
        if bad:
            raise SelectionError("bad operator selection: " + "; ".join(bad))
        if not chosen:
            raise SelectionError("nothing selected: give --all, --ops or --ops-file")
    selected, excluded = [], []
    for e in dict.fromkeys(chosen):
        reason = dismissed.get(e.id) or dismissed.get(f"{e.repo}:{e.op}") or dismissed.get(e.op)
        if reason is not None:
            excluded.append((e, f"dismissed: {reason}"))
        elif e.skip and all_ops:
            excluded.append((e, f"skip mark: {e.skip}"))
        elif e.collected == "no" and all_ops:
            excluded.append((e, "pytest did not collect it (inventory-regen --verify-collect)"))
        else:
            selected.append(e)
    return selected, excluded


def read_ops_file(path: Path) -> list[str]:
    if not path.is_file():
        raise SelectionError(f"--ops-file {path} does not exist")
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


# --- shape-file migration ------------------------------------------------------------------------
def migrate_shapes(source: Path, out: Path, entries: list[Entry], checkouts: dict[str, Path]) -> dict[str, int]:
    """Rewrite a shape file for the operators that exist now.

    Keeps the keys of `source` that still name something: an op_name, a Benchmark class or an op
    of any inventory, or a built-in family key. Adds the keys of each checkout's
    `benchmark/core_shapes.yaml` that `source` lacks and that name an op_name or class of that
    checkout (the first checkout given wins a key). Everything else goes, for review, to
    `<out stem>.unmatched.yaml`.
    """
    data = rundir.read_yaml_mapping(source, SelectionError, "shape file")
    known = _names(entries) | builtin_family_keys()
    kept = {k: v for k, v in data.items() if k in known}
    unmatched = {k: v for k, v in data.items() if k not in known}
    merged: dict = {}
    for repo, root in checkouts.items():
        upstream_path = root / "benchmark" / "core_shapes.yaml"
        if not upstream_path.is_file():
            continue
        upstream = rundir.read_yaml_mapping(upstream_path, SelectionError, "shape file")
        names = _names([e for e in entries if e.repo == repo])
        for k, v in upstream.items():
            if k in names and k not in data and k not in merged:
                merged[k] = v
    header = f"# migrated from {source} by `inventory-regen --migrate-shapes`\n"
    _write_yaml(out, header, {**kept, **merged})
    unmatched_path = out.with_suffix(".unmatched.yaml")
    _write_yaml(unmatched_path, f"# keys of {source} that name no operator, Benchmark class or family key\n",
                unmatched)
    return {"kept": len(kept), "merged": len(merged), "unmatched": len(unmatched)}


def _names(entries: list[Entry]) -> set[str]:
    names = set()
    for e in entries:
        names.add(e.op)
        names.update(n for n in f"{e.op_names};{e.classes}".split(";") if n)
    return names


def _write_yaml(path: Path, header: str, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_text(path, header + yaml.safe_dump(data, default_flow_style=None, sort_keys=False))


# --- the command ---------------------------------------------------------------------------------
def regen_from_args(args) -> int:
    """`python -m harness inventory-regen [--check] [--flaggems-dir [NAME=]PATH ...] [--verify-collect]
    [--migrate-shapes IN --out OUT]`"""
    from harness.resolve import UsageError

    try:
        checkouts = flaggems.parse_dirs(args.flaggems_dir)
        if args.verify_collect and not checkouts:
            raise SelectionError("--verify-collect asks pytest about a FlagGems checkout: give --flaggems-dir")
        if (args.migrate_shapes is None) != (args.out is None):
            raise SelectionError("--migrate-shapes IN and --out OUT go together")
        fresh = _fresh_scans(checkouts, args.verify_collect)
        if args.migrate_shapes is not None:
            everything = [e for e in load() if e.repo not in fresh] + [e for v in fresh.values() for e in v]
            counts = migrate_shapes(args.migrate_shapes, args.out, everything, checkouts)
            print(f"wrote {args.out}: kept {counts['kept']}, merged {counts['merged']} from the checkouts' "
                  f"core_shapes.yaml; unmatched {counts['unmatched']}, in {args.out.with_suffix('.unmatched.yaml')}")
            return 0
    except (SelectionError, flaggems.FlagGemsError) as exc:
        raise UsageError(str(exc)) from exc
    if args.check:
        stale = [str(inventory_path(r)) for r, entries in fresh.items()
                 if not inventory_path(r).is_file() or inventory_path(r).read_text() != to_csv(entries)]
        if stale:
            flags = " ".join(f"--flaggems-dir {r}={p}" for r, p in checkouts.items())
            raise UsageError(f"out of date: {', '.join(stale)}: run nox -s inventory-regen"
                             + (f" -- {flags}" if flags else ""))
        print("up to date: " + ", ".join(str(inventory_path(r)) for r in fresh))
        return 0
    for repo, entries in fresh.items():
        rundir.atomic_write_text(inventory_path(repo), to_csv(entries))
        verified = [e for e in entries if e.collected]
        print(f"wrote {inventory_path(repo)} ({len(entries)} operators, {sum(1 for e in entries if e.skip)} with an "
              "unconditional skip mark" + (f", {sum(1 for e in verified if e.collected == 'no')} of {len(verified)} "
                                           "verified not collected by pytest" if verified else "") + ")")
    return 0


def _fresh_scans(checkouts: dict[str, Path], verify: bool) -> dict[str, list[Entry]]:
    """{repo: entries}: the FlagGems checkouts given, else the built-in corpus."""
    if not checkouts:
        return {BUILTIN: scan_dir(OPS_DIR, BUILTIN, OPS_DIR.parent)}
    fresh = {}
    for repo, root in checkouts.items():
        entries = scan_flaggems(root, repo)
        previous = read_csv(inventory_path(repo))
        fresh[repo] = verify_collect(root, entries) if verify else keep_verified(entries, previous)
    return fresh
