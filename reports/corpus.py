"""The corpus A/B report: many operators' A/B results in one report.json (schema:
reports/schema/corpus_report.schema.json), report.csv, report.md and a self-contained report.html.

Two sources, one data dict:

- `from_ab_dirs`: one single-op A/B dir per operator (harness.sessions.ab: ab.json's steps name the
  replays that completed); each row has N independent repeats per side.
- `from_batch_pair`: two batch dirs (the corpus screened under compiler A, then under B), paired per
  operator and row. Each side ran each operator once: one process per side.

Rows are paired and compared by reports.compare and reports.stats. A row compared from ONE run per
side (`basis` `single_run`) is labelled so, and its verdict accounts for it: its samples all come
from one process, so their interval measures only the noise inside that process; what differs
between two processes (clocks, memory placement, code layout) is unknown with one run. Such a
row's verdict therefore uses a margin of compare.SINGLE_RUN_MARGIN in place of stats.MARGIN, and the
headline interval is taken over operators (one independent process pair each), not over rows (rows
of one operator share their processes). Verdicts are judged over the whole corpus at once
(compare.judge): the variance prior is learnt from all its rows, and the FDR holds over the report.

Each row carries its IR comparison: the launched variants of its shape matched between A's and
B's run dirs (by what they are, as `python -m harness compare-ir` does), with a unified diff of A's
and B's TTGIR for every variant that changed: the "why" next to the number.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import io
import math
from pathlib import Path

from tabulate import tabulate

import backends
from harness.core import abstate, batchdir, bounded, ir_index, rundir
from harness.core.errors import UsageError
from reports import corpus_html, explain, sequential, stats, table
from reports.compare import (
    SINGLE_RUN_MARGIN,
    PairedRow,
    aggregate,
    calibration,
    pair,
    passes_key,
    profiled_runs,
    summarize,
)

# 2: rows carry margin, q and sd (format 1: floor); the summary fdr, resolution, calibration.
# 3: rows carry process_factor. 4: rows and ops carry measures_performance.
REPORT_FORMAT = 4
# A FASTER or SLOWER row whose launched kernels have byte-identical IR on both sides at every hashed stage
# (ir_index.HASHED_STAGES): unless the change lies below the IR (the assembler, the launch path), the
# device ran the same code and the difference is between the sides' processes. Listed apart; the verdict
# stands as the data gave it.
IDENTICAL_IR_NOTE = ("FASTER/SLOWER rows whose kernels' IR is byte-identical on both sides, TTIR to PTX/AMDGCN "
                     "(unless the change lies below the IR: a difference between processes, not in the code)")

# Identical-IR rows needed before their spread is shown (3 sd over fewer would say little).
MIN_IDENTICAL_ROWS = 5
SINGLE_RUN, REPEATS = "single_run", "repeats"
BASIS_NOTES = {
    SINGLE_RUN: (f"one run per side: a row's samples come from one process each, so they are not independent "
                 f"repeats; verdicts need a change beyond a margin of {SINGLE_RUN_MARGIN:.0%} "
                 f"(the interval shown is within-process only), and the overall interval is taken over "
                 f"operators, not rows"),
    REPEATS: ("independent repeats per side (one process each): 95% intervals over repeats, each row's variance "
              "moderated by a prior learnt from the corpus's rows of similar latency; calls need the interval "
              f"beyond a {stats.MARGIN:.1%} margin and must survive the report's FDR"),
}
# The IR files a run dir holds (harness.measure.ir writes them; reports reads them as files).
MAX_DIFF_LINES = 400  # per variant; a longer diff is cut, and says so and where the full files are


def _num(x) -> float | None:
    """JSON has no NaN or infinity: an unknown or unbounded value is null."""
    return float(x) if x is not None and math.isfinite(x) else None


def _bounds(lo: float | None, hi: float | None) -> tuple[float | None, float | None]:
    """A ratio's interval, or (None, None) when it has no finite positive bounds (a side with a
    single latency gives lo 0 and hi infinity): never one bound without the other."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi) and lo > 0):
        return None, None
    return float(lo), float(hi)


def _gm(gm: tuple[float, float, float], over: str) -> dict:
    lo, hi = _bounds(gm[1], gm[2])
    return {"ratio": _num(gm[0]), "lo": lo, "hi": hi, "over": over}


def _side_summary(values: list[float]) -> dict:
    # The geometric mean: the statistic the ratio divides (reports.stats.center).
    return {"n": len(values), "gm_ms": stats.center(values) if values else None, "min_ms": min(values, default=None),
            "max_ms": max(values, default=None)}


def _performance(backend_names: set[str]) -> str | None:
    """The note for backends whose timings are not performance numbers, or None."""
    not_measuring = sorted(n for n in backend_names if not backends.get(n).measures_performance)
    return table.not_performance_note(", ".join(not_measuring)) if not_measuring else None


# --- IR ---------------------------------------------------------------------------------------------
def _ttgir(run_dir: Path, row: dict | None) -> list[str]:
    if not row:
        return []
    return bounded.read_text(run_dir / ir_index.IR_DIR / row["file"], "IR file").splitlines(keepends=True)


def _variant_diff(run_a: Path, run_b: Path, ra: dict | None, rb: dict | None) -> dict:
    stages = sorted(ir_index.differing_stages(ra, rb)) if ra and rb else []
    status = "only_in_b" if ra is None else "only_in_a" if rb is None else "changed" if stages else "identical"
    entry = {"kernel": (ra or rb)["kernel"], "variant": Path((ra or rb)["file"]).stem, "status": status,
             "stages": stages, "file_a": str(run_a / ir_index.IR_DIR / ra["file"]) if ra else None,
             "file_b": str(run_b / ir_index.IR_DIR / rb["file"]) if rb else None, "diff": "", "diff_truncated": False}
    if status != "identical":
        lines = list(difflib.unified_diff(_ttgir(run_a, ra), _ttgir(run_b, rb), "A.ttgir", "B.ttgir"))
        entry["diff_truncated"] = len(lines) > MAX_DIFF_LINES
        entry["diff"] = "".join(line if line.endswith("\n") else line + "\n" for line in lines[:MAX_DIFF_LINES])
    return entry


def row_ir(indexes: tuple, run_a: Path | None, run_b: Path | None, dtype: str, shape: tuple) -> dict:
    """The row's launched variants compared: status `not_collected`, `none_launched`, `identical` or
    `changed`, with an entry (and TTGIR diff) per variant that is not identical."""
    if run_a is None or run_b is None or indexes[0] is None or indexes[1] is None:
        return {"status": "not_collected", "identical": 0, "variants": []}
    sides = ir_index.row_variants(indexes, dtype, shape)
    keys = sorted(sides[0].keys() | sides[1].keys())
    if not keys:
        return {"status": "none_launched", "identical": 0, "variants": []}
    entries = [_variant_diff(run_a, run_b, sides[0].get(k), sides[1].get(k)) for k in keys]
    changed = [e for e in entries if e["status"] != "identical"]
    return {"status": "changed" if changed else "identical", "identical": len(entries) - len(changed),
            "variants": changed}


CALLS = (stats.FASTER, stats.SLOWER)


def _call_on_identical_ir(verdict: str, ir_status: str) -> bool:
    return verdict in CALLS and ir_status == "identical"


def identical_ir_rows(groups: list[tuple[Path, Path, list[PairedRow]]]) -> list[PairedRow]:
    """The compared rows whose launched kernels' IR is identical on both sides; `groups`: (A's run,
    B's run, their paired rows) per op."""
    found = []
    for run_a, run_b, rows in groups:
        compared = [r for r in rows if r.comparison is not None]
        if compared:
            indexes = (ir_index.launched(run_a), ir_index.launched(run_b))
            found += [r for r in compared
                      if row_ir(indexes, run_a, run_b, r.dtype, r.shape)["status"] == "identical"]
    return found


def identical_ir_line(names: list[str]) -> str:
    """The report line naming calls on identical IR (the first 10)."""
    return (f"{IDENTICAL_IR_NOTE}: {len(names)} ({', '.join(names[:10])}"
            + (", ...)" if len(names) > 10 else ")"))


# --- assembling the report ---------------------------------------------------------------------------
@dataclasses.dataclass
class _OpResult:
    key: str
    rows: list[PairedRow]
    run_a: Path | None  # the run dirs the IR is compared between
    run_b: Path | None
    notes: list[str]
    single: bool  # one run per side: compare.pair took each run's raw samples as repeats
    status_a: str = ""
    status_b: str = ""


def _row_dict(op: _OpResult, r: PairedRow, basis: str, ir_indexes: tuple, performance: bool) -> dict:
    c = r.comparison
    control = stats.compare(r.a_control_ms, r.b_control_ms).ratio if r.a_control_ms and r.b_control_ms else None
    lo, hi = _bounds(c.lo, c.hi) if c else (None, None)
    return {
        "id": f"{op.key}|{r.dtype}|{'x'.join(map(str, r.shape))}", "op_key": op.key, "op": r.op, "dtype": r.dtype,
        "shape": list(r.shape), "basis": basis, "a": _side_summary(r.a_ms), "b": _side_summary(r.b_ms),
        "a_repeats_ms": r.a_ms if basis == REPEATS else None, "b_repeats_ms": r.b_ms if basis == REPEATS else None,
        "ratio": _num(c.ratio) if c else None, "lo": lo, "hi": hi,
        "margin": c.margin if c else None, "q": _num(c.q) if c and c.q is not None else None,
        "sd": _num(c.sd) if c else None, "process_factor": _num(r.process_factor),
        "verdict": r.verdict, "control_ratio": _num(control),
        "flags": list(r.flags), "errors": dict(r.errors), "in_headline": r.in_headline,
        "config_differs": r.config_differs,
        "configs_a": r.configs_a, "configs_b": r.configs_b, "timers": sorted(r.timers),
        "run_a": str(op.run_a) if op.run_a else None, "run_b": str(op.run_b) if op.run_b else None,
        "ir": row_ir(ir_indexes, op.run_a, op.run_b, r.dtype, r.shape), "measures_performance": performance}


def _assemble(kind: str, ops: list[_OpResult], unpaired: list[dict], context: dict, warnings: list[str],
              note: str | None, sources: dict, fdr: float, schedule: sequential.Schedule | None = None) -> dict:
    rows, per_op = [], []
    all_paired = []
    # Over the whole corpus: the more rows of a latency, the better their prior (fixed repeats; sequential
    # ones settle each op's rows alone, as the runner did); and the FDR holds over the report.
    sequential.judge([r for op in ops for r in op.rows], fdr, schedule)
    for op in ops:
        indexes = tuple(ir_index.launched(d) if d else None for d in (op.run_a, op.run_b))
        basis = SINGLE_RUN if op.single else REPEATS
        op_rows = [_row_dict(op, r, basis, indexes, note is None) for r in op.rows]
        explain.annotate(op_rows, op.run_a, op.run_b, indexes)
        rows += op_rows
        all_paired += op.rows
        per_op.append((op, op_rows))
    summary = summarize(all_paired, fdr)
    identical = [p for p, r in zip(all_paired, [r for _, op_rows in per_op for r in op_rows], strict=True)
                 if r["in_headline"] and r["ir"]["status"] == "identical"]
    checked = calibration(identical, summary.calls, fdr) if note is None else None
    if checked is not None and checked[1]:
        warnings.append(checked[0])
    head = [r for r in rows if r["in_headline"]]
    single = any(r["basis"] == SINGLE_RUN for r in head)
    op_entries = [_op_entry(op, op_rows, single, note is None) for op, op_rows in per_op]
    if single:
        # Rows of one operator share their two processes: the independent units are the operators.
        op_gms = [e["geomean"]["ratio"] for e in op_entries if e["geomean"]["ratio"] is not None]
        controls = [e["control"] for e in op_entries if e["control"] is not None]
        overall, control = (_gm(stats.geomean(op_gms), f"{len(op_gms)} ops"),
                            _gm(stats.geomean(controls), f"{len(controls)} ops"))
    else:
        overall = _gm(summary.overall, f"{len(head)} rows")
        control = _gm(summary.control, f"{sum(1 for r in head if r['control_ratio'] is not None)} rows")
    if single and note is None and control["ratio"] is not None:  # interpreter timings vary by anything
        controls = [r["control_ratio"] for r in head if r["control_ratio"]]
        # The control's spread over rows is an A/A between the sides' processes.
        spread = stats.spread(controls)
        if spread > SINGLE_RUN_MARGIN:
            warnings.append(f"the control (torch baseline, which the compiler does not move) varies by "
                            f"{spread:.1%} between the two sides' processes (3 sd over rows), more than the "
                            f"{SINGLE_RUN_MARGIN:.0%} single-run margin: verdicts may call run-to-run noise a change")
    # Worst regressions first: the largest B/A leads; rows left out of the headline (a degraded
    # measurement's ratio is no regression) and operators with nothing to compare go last.
    op_entries.sort(key=lambda e: -(e["geomean"]["ratio"] or -math.inf))
    rows.sort(key=lambda r: (not r["in_headline"], -(r["ratio"] if r["ratio"] is not None else -math.inf)))
    return {
        "format": REPORT_FORMAT, "kind": kind, "context": context, "sources": sources,
        "measures_performance": note is None, "note": note,
        "basis": SINGLE_RUN if single else REPEATS, "basis_note": BASIS_NOTES[SINGLE_RUN if single else REPEATS],
        "margin": stats.MARGIN, "same_margin": stats.SAME_MARGIN, "single_run_margin": SINGLE_RUN_MARGIN,
        "fdr": fdr, "warnings": warnings,
        "summary": {"rows": summary.rows, "headline_rows": summary.headline_rows, "excluded": summary.excluded,
                    "verdicts": summary.verdicts, "overall": overall, "control": control,
                    "config_differs": summary.config_differs, "ops": len(ops) + len(unpaired),
                    "ops_compared": len(ops), "ir_changed_rows": sum(r["ir"]["status"] == "changed" for r in rows),
                    "ir_not_collected_rows": sum(r["ir"]["status"] == "not_collected" for r in rows),
                    "calls_on_identical_ir": [r["id"] for r in rows
                                              if _call_on_identical_ir(r["verdict"], r["ir"]["status"])],
                    "identical_ir_spread": _identical_ir_spread(head), "change_groups": explain.groups(rows),
                    "calls": summary.calls, "fdr_line": summary.fdr_line(),
                    "resolution": summary.resolution, "resolution_lines": summary.resolution_lines(),
                    "calibration": checked[0] if checked else None},
        "ops": op_entries, "unpaired_ops": unpaired, "rows": rows}


def _identical_ir_spread(head: list[dict]) -> dict | None:
    """The B/A spread (3 sd on the log scale, stats.spread) of the headline rows whose IR is
    identical on both sides: what the same code shows between the sides' processes on this machine at
    these repeats, an A/A inside the corpus A/B. None under MIN_IDENTICAL_ROWS such rows."""
    ratios = [r["ratio"] for r in head if r["ir"]["status"] == "identical" and r["ratio"] is not None]
    if len(ratios) < MIN_IDENTICAL_ROWS:
        return None
    return {"rows": len(ratios), "spread": round(stats.spread(ratios), 4)}


def _op_entry(op: _OpResult, rows: list[dict], single: bool, performance: bool) -> dict:
    head = [r for r in rows if r["in_headline"]]
    ratios = [r["ratio"] for r in head if r["ratio"] is not None]
    if single:
        gm = (stats.geomean(ratios)[0], math.nan, math.nan)  # rows of one process pair: no interval over them
    else:
        gm = aggregate([r.comparison for r in op.rows if r.in_headline])
    controls = [r["control_ratio"] for r in head if r["control_ratio"] is not None]
    verdicts: dict[str, int] = {}
    for r in head:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
    return {"op": op.key, "rows": len(rows), "headline_rows": len(head), "geomean": _gm(gm, f"{len(ratios)} rows"),
            "control": _num(stats.geomean(controls)[0]) if controls else None, "verdicts": verdicts,
            "worst_ratio": max(ratios, default=None), "flagged_rows": sum(1 for r in rows if r["flags"]),
            "config_differs": sum(1 for r in rows if r["config_differs"]),
            "ir_changed_rows": sum(1 for r in rows if r["ir"]["status"] == "changed"),
            "status_a": op.status_a, "status_b": op.status_b, "notes": op.notes,
            "run_a": str(op.run_a) if op.run_a else None, "run_b": str(op.run_b) if op.run_b else None,
            "measures_performance": performance}


# --- sources ----------------------------------------------------------------------------------------
def from_ab_dirs(items: list[tuple[str, Path]], context: dict, fdr: float = stats.FDR) -> dict:
    """One single-op A/B dir per operator (op key, ab dir), as harness.sessions.ab writes it: the
    replays its ab.json lists as completed are paired, with the plan's repeats expected per side.
    An operator whose A/B left nothing to pair is listed with the reason, never dropped."""
    found, unpaired, warnings, backend_names, schedules = [], [], [], set(), set()
    for key, ab_dir in items:
        ab_dir = Path(ab_dir)
        try:
            state = abstate.read(ab_dir / abstate.AB_JSON)
        except (OSError, ValueError) as exc:
            unpaired.append({"op": key, "reason": f"no readable ab.json in {ab_dir}: {exc}"})
            continue
        runs: dict[str, list[Path]] = {"record": [], "A": [], "B": []}
        for step in state.get("steps", []):
            # ab.json files written before steps carried `usable` (a resumed corpus A/B's older ops)
            # counted exit 0 alone.
            step.setdefault("usable", step["exit"] == 0 and bool(step.get("run_dir")))
            if step["usable"]:
                run, record = Path(step["run_dir"]), step["args"][0] == "record"
                if record:
                    runs["record"].append(run)
                # A's record carries A's passes where the passes run once (older A/Bs: a step of their own).
                if step.get("passes"):
                    runs.setdefault(passes_key(step["side"]), []).append(run)
                elif not record:
                    runs.setdefault(step["side"], []).append(run)
        notes = [f"step failed (exit {s['exit']}): {s['what']}" for s in state.get("steps", []) if not s["usable"]]
        if not state.get("complete"):
            notes.insert(0, "INCOMPLETE: the A/B stopped before its last step")
        if not runs["A"] or not runs["B"]:
            missing = " and ".join(s for s in ("A", "B") if not runs[s])
            unpaired.append({"op": key, "reason": "; ".join([f"no completed replay of side {missing}", *notes])})
            continue
        backend_names.add(state["plan"]["backend"])  # resolved by the A/B before it ran
        schedule = sequential.Schedule.from_plan(state["plan"])
        schedules.add(schedule)
        # Under --repeats auto a row is asked for the first round's repeats, then as long as it stays open.
        found.append((key, runs, schedule.first if schedule else int(state["plan"]["repeats"]), notes))
    if len(schedules) > 1:  # one corpus A/B's ops share its plan: these dirs come from several
        raise UsageError("these A/B dirs were timed under different repeats (fixed and --repeats auto, or two "
                         "schedules): one report judges them under one rule")
    note = _performance(backend_names)
    ops = []
    for key, runs, repeats, notes in found:
        single = len(runs["A"]) == 1 and len(runs["B"]) == 1
        profiled = profiled_runs(runs)
        ops.append(_OpResult(key, pair(runs["A"], runs["B"], repeats, performance=note is None, profiled=profiled),
                             *profiled, notes, single))
    sources = {"a": None, "b": None, "ab_dirs": {key: str(d) for key, d in items}}
    return _assemble("ab_dirs", ops, unpaired, dict(context), warnings, note, sources, fdr,
                     next(iter(schedules), None))


def from_paired(items: list[tuple[str, list[PairedRow], Path | None, Path | None]], context: dict, warnings: list[str],
                note: str | None, fdr: float = stats.FDR, schedule: sequential.Schedule | None = None) -> dict:
    """One A/B's ops (key, its paired rows, the runs its IR is compared between), as harness.sessions.ab
    paired them, as a report's data: the page a single A/B writes beside its report.md, judged by the
    same rule over the same rows."""
    ops = [_OpResult(key, rows, run_a, run_b, [], any(r.single for r in rows)) for key, rows, run_a, run_b in items]
    sources = {"a": None, "b": None, "ab_dirs": {}}
    return _assemble("ab", ops, [], dict(context), list(warnings), note, sources, fdr, schedule)


def _batch_status(batch_dir: Path) -> tuple[dict, dict[str, batchdir.StatusRow]]:
    """(batch.json, ops_status rows by repo:op@op_file) of a batch dir, or UsageError."""
    if not batchdir.is_batch_dir(batch_dir):
        raise UsageError(f"{batch_dir} is not a batch dir (it has no {batchdir.BATCH_JSON})")
    try:
        meta = rundir.read_json(batch_dir / batchdir.BATCH_JSON)
        status = batchdir.read_status(batch_dir, missing_ok=False)
    except (OSError, ValueError, UsageError) as exc:
        raise UsageError(f"batch dir {batch_dir} is unreadable: {exc}") from exc
    return meta, status


def from_batch_pair(batch_a: Path, batch_b: Path, context: dict, fdr: float = stats.FDR) -> dict:
    """Two batch dirs, paired per operator (repo:op@op_file) and row. One run per side: every row is
    `single_run` (see the module's docstring). An operator without a run dir on a side is listed
    with both sides' statuses and notes."""
    batch_a, batch_b = Path(batch_a), Path(batch_b)
    (meta_a, status_a), (meta_b, status_b) = _batch_status(batch_a), _batch_status(batch_b)
    warnings = []
    if meta_a.get("backend") != meta_b.get("backend"):
        warnings.append(f"the batches ran on different backends (A {meta_a.get('backend')}, B "
                        f"{meta_b.get('backend')}): the comparison mixes hardware with the compiler")
    note = _performance({m["backend"] for m in (meta_a, meta_b) if m.get("backend")})
    ids = list(dict.fromkeys([*status_a, *status_b]))
    short = [i.split("@", 1)[0] for i in ids]
    ops, unpaired, moved = [], [], []
    for op_id, name in zip(ids, short, strict=True):
        key = name if short.count(name) == 1 else op_id
        sa, sb = status_a.get(op_id), status_b.get(op_id)
        run_a = batch_a / sa.run_dir if sa and sa.run_dir else None
        run_b = batch_b / sb.run_dir if sb and sb.run_dir else None
        notes = [f"{side}: {s.notes}" for side, s in (("A", sa), ("B", sb)) if s and s.notes]
        states = tuple(s.status if s else "absent" for s in (sa, sb))
        if not (run_a and (run_a / "results.json").is_file() and run_b and (run_b / "results.json").is_file()):
            unpaired.append({"op": key, "reason": "; ".join([f"status A {states[0]}, B {states[1]}: "
                                                             "a side has no results", *notes])})
            continue
        if sa.device != sb.device:
            moved.append(key)
        ops.append(_OpResult(key, pair([run_a], [run_b], performance=note is None), run_a, run_b, notes, True,
                             *states))
    if moved:
        warnings.append(f"{len(moved)} op(s) ran on another device in B than in A: {', '.join(moved)}")
    sources = {"a": str(batch_a), "b": str(batch_b), "ab_dirs": None}
    context = {"a": str(batch_a), "b": str(batch_b), **context}
    return _assemble("batch_pair", ops, unpaired, context, warnings, note, sources, fdr)


# --- output -----------------------------------------------------------------------------------------
def fmt_gm(gm: dict, performance: bool) -> str:
    """`0.9731 [0.9602, 0.9862] over 12 ops (1.028x faster)`; n/a where nothing can be said."""
    if not performance or gm["ratio"] is None:
        return stats.NOT_APPLICABLE
    interval = f" [{gm['lo']:.4f}, {gm['hi']:.4f}]" if gm["lo"] is not None else " (no interval)"
    return f"{gm['ratio']:.4f}{interval} over {gm['over']} ({stats.describe(gm['ratio'])})"


def headline(data: dict) -> list[str]:
    """The report's first lines, as the terminal shows them."""
    s, ctx, performance = data["summary"], data["context"], data["measures_performance"]
    lines = [data["note"]] if data["note"] else []
    what = "A/B" if data["kind"] == "ab" else "corpus A/B"
    lines.append(f"{what}: A = {ctx.get('a', 'A')}, B = {ctx.get('b', 'B')}; "
                 "ratio = B latency / A latency (below 1: B faster)")
    lines.append(f"basis: {data['basis_note']}")
    lines += [f"WARNING: {w}" for w in data["warnings"]]
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(s["verdicts"].items())) or "none"
    lines.append(f"ops: {s['ops_compared']} of {s['ops']} compared; rows: {s['headline_rows']} of {s['rows']} in the "
                 f"headline; verdicts: {verdicts}")
    if performance:
        lines += [s["fdr_line"], *s["resolution_lines"]]
        if s["calibration"] and s["calibration"] not in data["warnings"]:
            lines.append(s["calibration"])
    if s["excluded"]:
        lines.append("excluded from the headline: " + ", ".join(f"{k} {v}" for k, v in sorted(s["excluded"].items())))
    if data["unpaired_ops"]:
        lines.append("ops not compared: " + ", ".join(u["op"] for u in data["unpaired_ops"]))
    if s["config_differs"]:
        lines.append(f"rows whose sides ran different autotune configs: {s['config_differs']}")
    lines.append(f"rows whose IR changed: {s['ir_changed_rows']}; IR not collected: {s['ir_not_collected_rows']}")
    if s["identical_ir_spread"]:
        spread = s["identical_ir_spread"]
        lines.append(f"rows whose IR is identical on both sides: {spread['rows']}; their B/A spread (3 sd) "
                     f"{spread['spread']:.1%}: what the same code shows between processes here, at these repeats")
    if s["calls_on_identical_ir"]:
        lines.append(identical_ir_line([r.replace("|", " ") for r in s["calls_on_identical_ir"]]))
    lines += explain.group_lines(s["change_groups"])
    lines.append(f"overall geomean B/A: {fmt_gm(s['overall'], performance)}")
    lines.append(f"control (torch baseline) geomean B/A: {fmt_gm(s['control'], performance)} -- should be ~1: "
                 "it does not depend on the compiler under test")
    return lines


def _shape(row: dict) -> str:
    return "x".join(map(str, row["shape"]))


def _cell(value, performance: bool) -> str:
    return f"{value:.4f}" if performance and value is not None else stats.NOT_APPLICABLE if value else "-"


def markdown(data: dict) -> str:
    performance = data["measures_performance"]
    ops = [[o["op"], f"{o['headline_rows']}/{o['rows']}", _cell(o["geomean"]["ratio"], performance),
            ", ".join(f"{k} {v}" for k, v in sorted(o["verdicts"].items())), _cell(o["worst_ratio"], performance),
            o["ir_changed_rows"], o["flagged_rows"], _cell(o["control"], performance)] for o in data["ops"]]
    flagged = [[r["op_key"], r["dtype"], _shape(r), r["verdict"], ",".join(r["flags"])]
               for r in data["rows"] if not r["in_headline"]]
    parts = ["# Corpus A/B report", "", *table.markdown_list(headline(data)), "", "## Operators (worst B/A first)", "",
             tabulate(ops, headers=["op", "rows in headline", "geomean B/A", "verdicts", "worst B/A", "IR changed",
                                    "flagged", "control B/A"], tablefmt="github", disable_numparse=True)]
    calls = [[r["op_key"], r["dtype"], _shape(r), r["verdict"], _cell(r["ratio"], performance),
              explain.cell(r["what_changed"])] for r in data["rows"] if r["what_changed"]]
    if calls:
        parts += ["", "## FASTER and SLOWER rows: what changed in their compiled code", "",
                  tabulate(calls, headers=["op", "dtype", "shape", "verdict", "B/A", "what changed"],
                           tablefmt="github", disable_numparse=True)]
    if flagged:
        parts += ["", "## Flagged and excluded rows", "",
                  tabulate(flagged, headers=["op", "dtype", "shape", "verdict", "flags"], tablefmt="github")]
    if data["unpaired_ops"]:
        parts += ["", "## Operators not compared", "", *(f"- {u['op']}: {u['reason']}" for u in data["unpaired_ops"])]
    parts += ["", "Per-row drill-down and the TTGIR diffs of rows whose IR changed: report.html.", ""]
    return "\n".join(parts)


CSV_COLUMNS = ("op_key", "op", "dtype", "shape", "basis", "a_gm_ms", "b_gm_ms", "ratio", "ci_lo", "ci_hi",
               "margin", "q", "verdict", "n_a", "n_b", "control_ratio", "in_headline", "flags", "config_differs",
               "ir_status", "ir_changed_variants", "run_a", "run_b", "measures_performance")


def to_csv(data: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in data["rows"]:
        w.writerow([r["op_key"], r["op"], r["dtype"], _shape(r), r["basis"], r["a"]["gm_ms"], r["b"]["gm_ms"],
                    r["ratio"], r["lo"], r["hi"], r["margin"], r["q"], r["verdict"], r["a"]["n"], r["b"]["n"],
                    r["control_ratio"], r["in_headline"], ";".join(r["flags"]), r["config_differs"],
                    r["ir"]["status"], len(r["ir"]["variants"]), r["run_a"], r["run_b"], r["measures_performance"]])
    return out.getvalue()


def write(out_dir: Path, data: dict) -> list[Path]:
    """report.json, report.csv, report.md and report.html (self-contained: opens offline) in out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ("report.json", "report.csv", "report.md", "report.html")]
    rundir.atomic_write_json(paths[0], data)
    rundir.atomic_write_text(paths[1], to_csv(data))
    rundir.atomic_write_text(paths[2], markdown(data))
    rundir.atomic_write_text(paths[3], corpus_html.render(data, headline(data)))
    return paths
