"""Which operators a batch runs: its selection from every inventory, and the dtypes each one takes.

The inventories are the committed catalog, a fresh scan of each FlagGems checkout given (that
checkout is what will run) and the operators of --ops-path dirs. A selection is the command line's
`--ops`/`--ops-file`/`--repos`/`--all` (sampled with `--sample`), else a resumed batch's stored one.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

from harness.core.commands import Selection
from harness.core.errors import UsageError
from harness.providers import builtin_scan, catalog, flaggems, flaggems_scan, probe, registry
from harness.providers.catalog import Entry


def select(given: Selection, stored: list[str] | None, ops_paths: list[str], checkouts: dict[str, Path],
           ops: list[str] | None = None) -> tuple[list[Entry], list[tuple[Entry, str]], collections.Counter]:
    """(selected, excluded with reasons, ops per FlagGems repo --all left out), from the command
    line's selection (`given`), else `ops` as if given with --ops (a corpus A/B's plan's), else the one a
    resumed batch stored. A bare op name means one of the inventories that can run here."""
    corpus = given.corpus
    try:
        entries = all_entries(ops_paths, checkouts)
        runnable = {e.repo for e in entries if not catalog.needs_checkout(e.repo) or e.repo in checkouts}
        named = given.given()
        # Nothing named, no plan's ops, no stored selection: the whole inventory, as --all selects it.
        whole = corpus.all or not (named or ops or stored is not None)
        repos, left_out = corpus.repos, collections.Counter()
        if whole and repos is None:
            left_out = collections.Counter(e.repo for e in entries if e.repo not in runnable)
            repos = sorted(runnable)
        if not named:
            specs = list(ops or [])
        else:
            specs = list(given.ops or []) + (catalog.read_ops_file(corpus.ops_file) if corpus.ops_file else [])
        if stored is not None and not (corpus.all or specs or corpus.repos):
            specs = stored
        selected, excluded = catalog.select(entries, specs, whole, repos, catalog.load_dismissed(), runnable)
        if whole and not corpus.all:
            per_repo = collections.Counter(e.repo for e in selected)
            repo_counts = ", ".join(f"{repo} {n}" for repo, n in sorted(per_repo.items()))
            print(f"no selection given: the whole inventory, {len(selected)} ops ({repo_counts}); "
                  "--ops or --ops-file to narrow")
        if corpus.sample is not None and specs is not stored:  # a stored selection is already the sample
            selected = catalog.sample(selected, corpus.sample, corpus.sample_seed)
            print(f"sample: {len(selected)} ops (seed {corpus.sample_seed}) from the selection")
    except (catalog.SelectionError, flaggems.FlagGemsError) as exc:
        raise UsageError(str(exc)) from exc
    require_checkouts(selected, checkouts)
    if left_out:
        # Loud, not silent: --all on a host without FlagGems checkouts screens the built-in corpus.
        print(f"NOTE: {'--all' if corpus.all else 'the whole inventory'} leaves out the FlagGems inventories "
              f"{_counted(left_out)}: their checkouts were not given; to include them add "
              f"{' '.join(f'--flaggems-dir {r}=PATH' for r in sorted(left_out))}")
    return selected, excluded, left_out


def op_dtypes(selected: list[Entry], ops_paths: list[str], timeout: float) -> dict[str, tuple[str, ...]]:
    """The dtypes each built-in and --ops-path op takes. --ops-path modules are user code: they are
    imported in one probe process within `timeout`, never in the batch's own."""
    wanted = [e for e in selected if not catalog.needs_checkout(e.repo)]  # FlagGems' are known only once they run
    if not wanted:
        return {}
    names = sorted({e.op for e in wanted})
    try:
        if ops_paths:
            found, skipped = probe.load(names, ops_paths, probe.budget(timeout))
        else:
            found, skipped = {name: _builtin(name) for name in names}, []
    except registry.OperatorNotFound as exc:
        raise UsageError(str(exc)) from exc
    for line in skipped:
        print(f"warning: {line}", file=sys.stderr)
    for e in wanted:
        if isinstance(found[e.op], registry.OperatorNotFound):
            raise UsageError(str(found[e.op]))
    return {e.id: found[e.op][0].dtypes for e in wanted}


def _builtin(name: str):
    try:
        return registry.load(name, [])
    except registry.OperatorNotFound as exc:
        return exc


def all_entries(ops_paths: list[str], checkouts: dict[str, Path]) -> list[Entry]:
    """Every inventory, plus the operators of --ops-path directories. A FlagGems repo whose
    checkout is given is scanned afresh from it (that checkout is what will run), keeping the
    committed inventory's `collected` values; a committed inventory that differs is reported."""
    entries = [e for e in catalog.load() if e.repo not in checkouts]
    for repo, root in checkouts.items():
        path = catalog.inventory_path(repo)
        committed = catalog.read_csv(path)
        fresh = flaggems_scan.keep_verified(flaggems_scan.scan(root, repo), committed)
        if catalog.to_csv(fresh) != catalog.to_csv(committed):
            ids = {e.id for e in fresh}, {e.id for e in committed}
            print(f"NOTE: {path.name} differs from a scan of {root} ({len(ids[0] - ids[1])} ops only in the "
                  f"checkout, {len(ids[1] - ids[0])} only in the inventory): selecting from the checkout; refresh "
                  f"it with nox -s inventory-regen -- --flaggems-dir {repo}={root}")
        entries += fresh
    for p in ops_paths:
        if Path(p).is_dir():
            entries += builtin_scan.scan_dir(Path(p), catalog.PATH_REPO, Path(p).parent)
    return entries


def require_checkouts(selected: list[Entry], checkouts: dict[str, Path]) -> None:
    """Fail before anything runs when a selected FlagGems op has no checkout to run from."""
    missing = collections.Counter(e.repo for e in selected if catalog.needs_checkout(e.repo)
                                  and e.repo not in checkouts)
    if missing:
        raise UsageError(
            f"the selection includes operators of FlagGems repos whose checkouts were not given: {_counted(missing)}; "
            f"add {' '.join(f'--flaggems-dir {r}=PATH' for r in sorted(missing))}, or leave them out with "
            f"--repos {catalog.BUILTIN}")


def _counted(repos: collections.Counter) -> str:
    return ", ".join(f"{r} ({n} op{'s' * (n != 1)})" for r, n in sorted(repos.items()))
