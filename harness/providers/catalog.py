"""The operator inventories (`ops/inventory_<repo>.csv`), the dismiss list, and batch selection.

Inventories come from static scans (no imports: one broken module must not hide the others, and
FlagGems modules need a GPU to import at all):

- the built-in corpus, repo `builtin`: `name = Operator(name="...", ...)` in `ops/*.py`;
- a FlagGems-style checkout given as `--flaggems-dir NAME=PATH`, repo NAME: every module-level
  `def test_<op>` in `PATH/benchmark/test_<file>.py`, also inside `test_`-prefixed subfolders
  (harness.providers.flaggems_scan).

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

import csv
import dataclasses
import difflib
import io
import random
from pathlib import Path

from harness.core import bounded
from harness.core.errors import clip_text
from harness.core.paths import OPS_DIR

DISMISS_FILE = OPS_DIR / "dismiss.txt"
COLUMNS = ("repo", "op", "op_file", "file", "skip", "op_names", "classes", "collected")
BUILTIN, PATH_REPO = "builtin", "path"  # the built-in corpus; operators found in --ops-path


# The most bad specs one error lists (a whole --ops-file of typos is one line, not thousands).
MAX_LISTED = 20


class SelectionError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Selection:
    """One operator named as `[REPO:]OP[@FILE]`: the one grammar of every command that names operators
    (record, ab --ops and plans, batch and corpus A/B selections, ops/dismiss.txt). A part not given
    is None: any repo, any file."""

    op: str
    repo: str | None = None
    op_file: str | None = None

    @classmethod
    def parse(cls, text: str) -> Selection:
        repo, _, rest = text.strip().rpartition(":")
        op, _, op_file = rest.partition("@")
        return cls(op, repo or None, op_file or None)

    def matches(self, entry: Entry) -> bool:
        return (entry.op == self.op and self.repo in (None, entry.repo)
                and self.op_file in (None, entry.op_file))


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
    rows = csv.DictReader(io.StringIO(bounded.read_text(path, "inventory"), newline=""))
    return [Entry(**{c: row.get(c, "") or "" for c in COLUMNS}) for row in rows]


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
    for n, line in enumerate(bounded.read_text(path, "dismiss list").splitlines(), 1):
        body, _, reason = line.partition("#")
        body = body.strip()
        if not body:
            continue
        if not reason.strip():
            raise SelectionError(f"{path}:{n}: '{body}' has no reason (write `op  # why it is dismissed`)")
        dismissed[body] = reason.strip()
    return dismissed


# --- selection -----------------------------------------------------------------------------------
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
            selection = Selection.parse(spec)
            hits = [e for e in pool if selection.matches(e)]
            if runnable is not None and selection.repo is None:
                hits = [e for e in hits if e.repo in runnable] or hits
            if not hits:
                bad.append(f"'{spec}': unknown{_nearest(selection, pool, runnable)}")
            elif len(hits) > 1:
                bad.append(f"'{spec}': ambiguous ({', '.join(f'{h.repo}:{h.op}@{h.op_file}' for h in hits)})")
            else:
                chosen.append(hits[0])
        if bad:
            more = f"; and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
            raise SelectionError("bad operator selection: " + "; ".join(map(clip_text, bad[:MAX_LISTED])) + more
                                 + _known_here([e for e in pool if runnable is None or e.repo in runnable]))
        if not chosen:
            raise SelectionError("nothing selected: give --all, --ops or --ops-file")
    selected, excluded = [], []
    for e in dict.fromkeys(chosen):
        reason = next((why for spec, why in dismissed.items() if Selection.parse(spec).matches(e)), None)
        if reason is not None:
            excluded.append((e, f"dismissed: {reason}"))
        elif e.skip and all_ops:
            excluded.append((e, f"skip mark: {e.skip}"))
        elif e.collected == "no" and all_ops:
            excluded.append((e, "pytest did not collect it (inventory-regen --verify-collect)"))
        else:
            selected.append(e)
    return selected, excluded


def _nearest(selection: Selection, pool: list[Entry], runnable: set[str] | None) -> str:
    """` (did you mean softmax?)`: the ops nearest the unknown one, in its repo, else in those that run here."""
    ops = {e.op for e in pool
           if (e.repo == selection.repo if selection.repo else runnable is None or e.repo in runnable)}
    close = difflib.get_close_matches(selection.op, sorted(ops), n=3)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _known_here(here: list[Entry]) -> str:
    """`; known here: builtin: add, gelu, ...`, each repo's ops, or how many there are when too many to list."""
    if len(here) > MAX_LISTED:
        return f"; {len(here)} ops known here (ops/inventory_*.csv, --ops-path, --flaggems-dir)"
    by_repo: dict[str, set[str]] = {}
    for e in here:
        by_repo.setdefault(e.repo, set()).add(e.op)
    return "; known here: " + "; ".join(f"{repo}: {', '.join(sorted(ops))}" for repo, ops in sorted(by_repo.items()))


def sample(selected: list[Entry], n: int, seed: int) -> list[Entry]:
    """A seeded random sample of n entries, kept in inventory order (sharding and logs stay stable):
    the same seed over the same inventory picks the same ops on any machine."""
    if n < 1:
        raise SelectionError(f"--sample {n}: give a positive number of operators")
    if n >= len(selected):
        return list(selected)
    picked = set(random.Random(seed).sample(range(len(selected)), n))
    return [e for i, e in enumerate(selected) if i in picked]


def read_ops_file(path: Path) -> list[str]:
    try:
        return bounded.read_lines(path, "ops file")
    except bounded.InputRefused as exc:
        raise SelectionError(f"--ops-file {exc}") from exc
