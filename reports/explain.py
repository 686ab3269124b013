"""What B changed in the code that ran: per launched variant, the statistics of its compiled code
(ttgir/stats.json, harness.measure.kernel_stats) on both sides, field by field, and across a corpus
the calls grouped by the changes they share.

A change reads `wgmma 8 -> 0; mma.sync 0 -> 128; regs 168 -> 248; smem 96 KB -> 64 KB`: only fields
that differ, each with both values. A field neither side could read (`not available`) is left out; a
field one side could not read shows that side as `not available`.
"""

from __future__ import annotations

from pathlib import Path

from harness.core import ir_index
from harness.core.ir_index import BYTE_FIELDS, NOT_AVAILABLE
from reports import stats as verdicts

WIDTH_FIELDS = ("global load widths", "global store widths")
CALLS = (verdicts.FASTER, verdicts.SLOWER)
MAX_CELL_CHANGES = 6  # per row in the compact markdown column; report.json keeps them all
MAX_GROUPS = 10


def value_text(field: str, value) -> str:
    """A value with its unit: `96 KB`, `128 bits`, `168`."""
    if field in BYTE_FIELDS and isinstance(value, int) and value >= 1024:
        return f"{value / 1024:.0f} KB"
    if field in WIDTH_FIELDS and value not in (NOT_AVAILABLE, "none"):
        return f"{value} bits"
    return str(value)


def change_text(change: dict) -> str:
    """`smem 96 KB -> 64 KB`, `global load widths 128 bits -> 32 bits`."""
    field = change["field"]
    return f"{field} {value_text(field, change['a'])} -> {value_text(field, change['b'])}"


# What a compiler engineer reads first: the matrix units and the memory path, then the resources that
# bound occupancy; every other field follows in the record's own order.
LEADING = ("wgmma", "mma.sync", "tcgen05.mma", "mfma", "wmma", "mma layout", "dot ops", "global load widths",
           "global store widths", "TMA", "cp.async", "pipeline buffers", "regs", "spill bytes", "spilled regs",
           "smem", "occupancy")


def delta(a: dict, b: dict) -> list[dict]:
    """The fields whose values differ between two variants' records, LEADING fields first."""
    fields = list(dict.fromkeys([*a, *b]))
    fields.sort(key=lambda f: LEADING.index(f) if f in LEADING else len(LEADING))
    out = []
    for f in fields:
        va, vb = a.get(f, NOT_AVAILABLE), b.get(f, NOT_AVAILABLE)
        if va != vb:
            out.append({"field": f, "a": va, "b": vb})
    return out


def _entry(kernel: str, variant: str, status: str, changes: list[dict]) -> dict:
    text = "; ".join(change_text(c) for c in changes) if changes else {
        "only_in_a": "launched in A only", "only_in_b": "launched in B only",
        "identical": "no statistic changed"}.get(status, "")
    return {"kernel": kernel, "variant": variant, "status": status, "changes": changes, "text": text}


def variant_changes(sides: tuple[dict, dict], stats: tuple[dict | None, dict | None]) -> dict:
    """The what-changed record of one result row: `sides`, both sides' launched variants of the row
    (ir_index.row_variants); `stats`, both runs' ir_index.read_stats. Variants are matched by
    identity (what they are: shape, kernel, dtype, alignment, warps, stages, constexprs)."""
    missing = [s for s, st in zip("AB", stats, strict=True) if st is None]
    if missing:
        return {"variants": [], "text": f"not available (no kernel statistics in {' and '.join(missing)}'s run)"}
    entries = []
    for key in sorted(sides[0].keys() | sides[1].keys()):
        ra, rb = sides[0].get(key), sides[1].get(key)
        row = ra or rb
        kernel, variant = row["kernel"].rsplit(".", 1)[-1], Path(row["file"]).stem
        if ra is None or rb is None:
            entries.append(_entry(kernel, variant, "only_in_b" if ra is None else "only_in_a", []))
            continue
        sa, sb = stats[0].get(ra["hash"]), stats[1].get(rb["hash"])
        if sa is None or sb is None:
            entries.append({"kernel": kernel, "variant": variant, "status": "not_available", "changes": [],
                            "text": "not available (no statistics recorded for this variant)"})
            continue
        changes = delta(sa, sb)
        entries.append(_entry(kernel, variant, "changed" if changes else "identical", changes))
    shown = [e for e in entries if e["status"] != "identical"]
    if not entries:
        text = "no launched variant recorded"
    elif not shown:
        text = "no statistic changed"
    elif len(entries) == 1:
        text = shown[0]["text"]
    else:
        text = " | ".join(f"{e['kernel']}/{e['variant']}: {e['text']}" for e in shown)
    return {"variants": entries, "text": text}


def annotate(rows: list[dict], run_a: Path | None, run_b: Path | None, indexes: tuple) -> None:
    """Add `what_changed` to the corpus report's rows of one operator: for its FASTER/SLOWER rows; None
    on the others (for any row, on demand: compare-ir of its two run dirs)."""
    wanted = {id(r) for r in rows if r["verdict"] in CALLS}
    stats = tuple(ir_index.read_stats(d) if d else None for d in (run_a, run_b)) if wanted else (None, None)
    for r in rows:
        r["what_changed"] = None
        if id(r) in wanted:
            if indexes[0] is None or indexes[1] is None:
                r["what_changed"] = {"variants": [], "text": "not available (IR not collected on a side)"}
            else:
                sides = ir_index.row_variants(indexes, r["dtype"], r["shape"])
                r["what_changed"] = variant_changes(sides, stats)


def for_runs(run_a: Path, run_b: Path, rows) -> dict[tuple, dict]:
    """(op, dtype, shape) -> what-changed record, for the FASTER/SLOWER ones of the paired rows
    (reports.compare.PairedRow) of one op whose sides ran in run_a and run_b (a single-op A/B)."""
    indexes = (ir_index.launched(run_a), ir_index.launched(run_b))
    dicts = [{"verdict": r.verdict, "dtype": r.dtype, "shape": list(r.shape), "op": r.op} for r in rows]
    annotate(dicts, run_a, run_b, indexes)
    return {(d["op"], d["dtype"], tuple(d["shape"])): d["what_changed"] for d in dicts if d["what_changed"]}


def cell(what_changed: dict | None) -> str:
    """The compact `what changed` column: the first MAX_CELL_CHANGES changes of the row."""
    if not what_changed:
        return ""
    changes = [change_text(c) for e in what_changed["variants"] for c in e["changes"]]
    if not changes:
        return what_changed["text"]
    more = len(changes) - MAX_CELL_CHANGES
    return "; ".join(changes[:MAX_CELL_CHANGES]) + (f"; (+{more} more)" if more > 0 else "")


# --- across a corpus -------------------------------------------------------------------------------
def groups(rows: list[dict]) -> list[dict]:
    """The changes shared by several FASTER/SLOWER rows of one verdict (in any of their launched
    variants): rows sharing the same changes form one group, listing those changes; most rows first,
    and only groups of 2 or more rows."""
    by_change: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r["verdict"] not in CALLS or not r.get("what_changed"):
            continue
        texts = dict.fromkeys(change_text(c) for e in r["what_changed"]["variants"] for c in e["changes"])
        for t in texts:
            by_change.setdefault((r["verdict"], t), []).append(r["id"])
    by_rows: dict[tuple[str, tuple], list[str]] = {}
    for (verdict, text), ids in by_change.items():
        if len(ids) > 1:
            by_rows.setdefault((verdict, tuple(sorted(ids))), []).append(text)
    shared = [{"verdict": v, "changes": changes, "rows": len(ids), "ids": list(ids)}
              for (v, ids), changes in by_rows.items()]
    shared.sort(key=lambda g: (-g["rows"], g["verdict"], g["changes"]))
    return shared


def group_lines(shared: list[dict]) -> list[str]:
    """`18 SLOWER rows share: global load widths 128 bits -> 32 bits; ...`, the first MAX_GROUPS groups."""
    lines = []
    for g in shared[:MAX_GROUPS]:
        more = len(g["changes"]) - MAX_CELL_CHANGES
        changes = "; ".join(g["changes"][:MAX_CELL_CHANGES]) + (f"; (+{more} more)" if more > 0 else "")
        lines.append(f"{g['rows']} {g['verdict']} rows share: {changes}")
    if len(shared) > MAX_GROUPS:
        lines.append(f"(+{len(shared) - MAX_GROUPS} more groups of shared changes: report.json "
                     "summary.change_groups)")
    return lines


# --- compare-ir ------------------------------------------------------------------------------------
def compare_ir_lines(run_a: Path, run_b: Path) -> list[str]:
    """`python -m harness compare-ir A B`: per launched variant in both runs whose IR changed, what its
    statistics changed."""
    a, b = ir_index.launched(run_a) or {}, ir_index.launched(run_b) or {}
    stats = (ir_index.read_stats(run_a), ir_index.read_stats(run_b))
    common = sorted(k for k in a.keys() & b.keys() if ir_index.differing_stages(a[k], b[k]))
    if not common:
        return []
    lines = ["what changed (kernel statistics, A -> B):"]
    for key in common:
        record = variant_changes(({key: a[key]}, {key: b[key]}), stats)
        lines.append(f"  {key[0]} {key[1].rsplit('.', 1)[-1]} {Path(b[key]['file']).stem}: {record['text']}")
    return lines
