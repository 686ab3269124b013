"""The operator inventories (`ops/inventory_<repo>.csv`), the dismiss list, and batch selection.

Inventories come from static scans (no imports: one broken module must not hide the others, and
FlagGems modules need a GPU to import at all):

- the built-in corpus, repo `builtin`: `name = Operator(name="...", ...)` in `ops/*.py`;
- a FlagGems-style checkout given as `--flaggems-dir NAME=PATH`, repo NAME: every module-level
  `def test_<op>` in `PATH/benchmark/test_<file>.py`, also inside `test_`-prefixed subfolders
  (harness.flaggems_scan).

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
from pathlib import Path

import yaml

from harness import flaggems, rundir

OPS_DIR = Path(__file__).resolve().parent.parent / "ops"
DISMISS_FILE = OPS_DIR / "dismiss.txt"
COLUMNS = ("repo", "op", "op_file", "file", "skip", "op_names", "classes", "collected")
BUILTIN, PATH_REPO = flaggems.RESERVED_REPOS  # the built-in corpus; operators found in --ops-path


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
           dismissed: dict[str, str], runnable: set[str] | None = None) -> tuple[list[Entry], list[tuple[Entry, str]]]:
    """(selected, excluded with reasons). Unknown or ambiguous specs raise, listing every one.

    A spec without a repo means an operator of the `runnable` repos (those that can run here: a
    FlagGems inventory only once its checkout is given), so `softmax` is not ambiguous with a
    FlagGems op that could not run anyway; only an op that no runnable repo has is looked up in
    the others (and then needs its checkout). None: every repo can run."""
    pool = [e for e in qualify(entries) if not repos or e.repo in repos]
    if all_ops:
        chosen = list(pool)
    else:
        chosen, bad = [], []
        for spec in specs or []:
            hits = [e for e in pool if _matches(e, spec)]
            if runnable is not None and ":" not in spec:
                hits = [e for e in hits if e.repo in runnable] or hits
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
    from harness import flaggems_scan  # it builds on this module's Entry

    fresh = {}
    for repo, root in checkouts.items():
        entries = flaggems_scan.scan(root, repo)
        previous = read_csv(inventory_path(repo))
        fresh[repo] = (flaggems_scan.verify_collect(root, entries) if verify
                       else flaggems_scan.keep_verified(entries, previous))
    return fresh
