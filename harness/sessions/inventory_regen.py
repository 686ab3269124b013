"""`python -m harness inventory-regen`: rebuild ops/inventory_<repo>.csv from a static scan (the
built-in operators, or FlagGems checkouts), check it, or migrate a shape file to the operators
that exist now."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.core import bounded, rundir
from harness.core.commands import InventoryRequest
from harness.core.errors import UsageError
from harness.core.paths import OPS_DIR
from harness.providers import builtin_scan, catalog, flaggems, flaggems_scan


def migrate_shapes(source: Path, out: Path, entries: list[catalog.Entry], checkouts: dict[str, Path]) -> dict[str, int]:
    """Rewrite a shape file for the operators that exist now.

    Keeps the keys of `source` that still name something: an op_name, a Benchmark class or an op
    of any inventory, or a built-in family key. Adds the keys of each checkout's
    `benchmark/core_shapes.yaml` that `source` lacks and that name an op_name or class of that
    checkout (the first checkout given wins a key). Everything else goes, for review, to
    `<out stem>.unmatched.yaml`.
    """
    data = rundir.read_yaml_mapping(source, catalog.SelectionError, "shape file")
    known = _names(entries) | builtin_scan.builtin_family_keys()
    kept = {k: v for k, v in data.items() if k in known}
    unmatched = {k: v for k, v in data.items() if k not in known}
    merged: dict = {}
    for repo, root in checkouts.items():
        upstream_path = root / "benchmark" / "core_shapes.yaml"
        if not upstream_path.is_file():
            continue
        upstream = rundir.read_yaml_mapping(upstream_path, catalog.SelectionError, "shape file")
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


def _names(entries: list[catalog.Entry]) -> set[str]:
    names = set()
    for e in entries:
        names.add(e.op)
        names.update(n for n in f"{e.op_names};{e.classes}".split(";") if n)
    return names


def _write_yaml(path: Path, header: str, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_text(path, header + yaml.safe_dump(data, default_flow_style=None, sort_keys=False))


# --- the command ---------------------------------------------------------------------------------
def regen_from_args(request: InventoryRequest) -> int:
    """`python -m harness inventory-regen [--check] [--flaggems-dir [NAME=]PATH ...] [--verify-collect]
    [--migrate-shapes IN --out OUT]`"""
    try:
        checkouts = flaggems.parse_dirs(request.flaggems_dirs)
        if request.verify_collect and not checkouts:
            raise catalog.SelectionError("--verify-collect asks pytest about a FlagGems checkout: give --flaggems-dir")
        if (request.migrate_shapes is None) != (request.out is None):
            raise catalog.SelectionError("--migrate-shapes IN and --out OUT go together")
        fresh = _fresh_scans(checkouts, request.verify_collect)
        if request.migrate_shapes is not None:
            everything = [e for e in catalog.load() if e.repo not in fresh] + [e for v in fresh.values() for e in v]
            counts = migrate_shapes(request.migrate_shapes, request.out, everything, checkouts)
            print(f"wrote {request.out}: kept {counts['kept']}, merged {counts['merged']} from the checkouts' "
                  f"core_shapes.yaml; unmatched {counts['unmatched']}, in {request.out.with_suffix('.unmatched.yaml')}")
            return 0
    except (catalog.SelectionError, flaggems.FlagGemsError) as exc:
        raise UsageError(str(exc)) from exc
    if request.check:
        stale = [str(catalog.inventory_path(r)) for r, entries in fresh.items()
                 if not catalog.inventory_path(r).is_file()
                 or bounded.read_text(catalog.inventory_path(r), "inventory") != catalog.to_csv(entries)]
        if stale:
            flags = " ".join(f"--flaggems-dir {r}={p}" for r, p in checkouts.items())
            raise UsageError(f"out of date: {', '.join(stale)}: run nox -s inventory-regen"
                             + (f" -- {flags}" if flags else ""))
        print("up to date: " + ", ".join(str(catalog.inventory_path(r)) for r in fresh))
        return 0
    for repo, entries in fresh.items():
        rundir.atomic_write_text(catalog.inventory_path(repo), catalog.to_csv(entries))
        verified = [e for e in entries if e.collected]
        skipped = sum(1 for e in entries if e.skip)
        print(f"wrote {catalog.inventory_path(repo)} ({len(entries)} operators, {skipped} with an "
              "unconditional skip mark" + (f", {sum(1 for e in verified if e.collected == 'no')} of {len(verified)} "
                                           "verified not collected by pytest" if verified else "") + ")")
    return 0


def _fresh_scans(checkouts: dict[str, Path], verify: bool) -> dict[str, list[catalog.Entry]]:
    """{repo: entries}: the FlagGems checkouts given, else the built-in corpus."""
    if not checkouts:
        return {catalog.BUILTIN: builtin_scan.scan_dir(OPS_DIR, catalog.BUILTIN, OPS_DIR.parent)}
    fresh = {}
    for repo, root in checkouts.items():
        entries = flaggems_scan.scan(root, repo)
        previous = catalog.read_csv(catalog.inventory_path(repo))
        fresh[repo] = (flaggems_scan.verify_collect(root, entries) if verify
                       else flaggems_scan.keep_verified(entries, previous))
    return fresh
