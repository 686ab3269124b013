"""The built-in corpus (and --ops-path directories) scanned statically: `name = Operator(name="...",
...)` in `ops/*.py`, without importing anything (one broken module must not hide the others)."""

from __future__ import annotations

import ast
from pathlib import Path

from harness.core import bounded
from harness.core.paths import OPS_DIR
from harness.providers.catalog import Entry


def scan_module(path: Path, repo: str, root: Path) -> list[Entry]:
    """Operators defined in a module as `name = Operator(name="...", ...)`, found statically."""
    tree = ast.parse(bounded.read_text(path, "Python source"), filename=str(path))
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
        for node in ast.walk(ast.parse(bounded.read_text(path, "Python source"), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Operator":
                for kw in node.keywords:
                    if kw.arg == "shape_keys" and isinstance(kw.value, (ast.Tuple, ast.List)):
                        keys |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
    return keys


def _literal_kw(call: ast.Call, name: str):
    return next((k.value.value for k in call.keywords if k.arg == name and isinstance(k.value, ast.Constant)), None)
