"""The A/B report: a terminal table, the same as markdown, CSV and JSON files, and a PNG of
per-row ratios with their intervals grouped by operator.

A side's latency is the geometric mean of its repeats (reports.stats.center): the "A ms" and
"B ms" columns, the B/A ratio and the verdict all come from that one statistic.

`note`, where given, says the timings are not performance numbers (reports.table.not_performance_note):
it heads every one of them, verdicts are n/a (reports.compare.pair), and the text reports and the plot
show no ratio, interval or geomean; the CSV and JSON keep the computed values, for checking the pipeline.
Every row says so itself (a file is often read a row at a time): `measures_performance` false in each
CSV and JSON row, the NOT_PERFORMANCE flag in each table row.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import textwrap
from pathlib import Path

from tabulate import tabulate

from harness.core import rundir
from reports import explain, stats, table
from reports.compare import PairedRow, Summary, factor_line

# 2: a row's comparison carries margin, sd, dof, p and q (format 1: a noise floor); the summary fdr
# and resolution. 3: a row carries process_factor (compare.process_factors). 4: a row carries
# measures_performance. 5: a row carries sequential, the summary sequential (reports.sequential).
REPORT_FORMAT = 5
HEADERS = ["op", "dtype", "shape", "A ms (gm)", "B ms (gm)", "B/A", "95% CI", "verdict", "control B/A", "flags"]


def _shape(row: PairedRow) -> str:
    return "x".join(map(str, row.shape))


def _center(values) -> float | None:
    return stats.center(values) if values else None


def _interval(lo: float, hi: float) -> str:
    """' [lo, hi]', or '' where there is no finite interval (one latency on a side)."""
    return f" [{lo:.4f}, {hi:.4f}]" if math.isfinite(lo) and math.isfinite(hi) and lo > 0 else ""


def _cells(row: PairedRow, performance: bool) -> list:
    c = row.comparison
    control = stats.compare(row.a_control_ms, row.b_control_ms).ratio if row.a_control_ms and row.b_control_ms else None
    flags = (list(row.flags) + (["config_differs"] if row.config_differs else [])
             + ([] if performance else [table.NOT_PERFORMANCE]))
    a, b = _center(row.a_ms), _center(row.b_ms)
    ratio = f"{c.ratio:.4f}" if c else "-"
    interval = (_interval(c.lo, c.hi) if c else "").strip() or "-"
    control_cell = f"{control:.4f}" if control else "-"
    if not performance:
        ratio, interval, control_cell = (stats.NOT_APPLICABLE if c else "-",) * 3
    return [row.op, row.dtype, _shape(row), f"{a:.4f}" if a else "-", f"{b:.4f}" if b else "-",
            ratio, interval, row.verdict, control_cell, ",".join(flags)]


def _gm(gm: tuple[float, float, float], performance: bool) -> str:
    ratio, lo, hi = gm
    if not math.isfinite(ratio) or not performance:
        return stats.NOT_APPLICABLE
    return f"{ratio:.4f}{_interval(lo, hi)} ({stats.describe(ratio)})"


def throttled_lines(rows: list[PairedRow]) -> list[str]:
    """The rows a thermal or power slowdown hit, with the slowdowns per side: those it left out of
    the headline, then those power-capped on every repeat of a side (kept, like for like)."""
    lines = []
    out = [r for r in rows if r.throttled and "clock_throttled" in r.flags]
    kept = [r for r in rows if r.throttled and "clock_throttled" not in r.flags]
    for title, hit in (
            ("CLOCK_THROTTLED rows (a thermal or power slowdown hit their measurement; out of the headline)", out),
            ("CLOCK_THROTTLED rows kept in the headline (the board's power cap on every repeat of the side it hit: "
             "how that side's kernel runs on this board)", kept)):
        if hit:
            lines.append(f"{title}: {len(hit)}")
        for r in hit:
            sides = "; ".join(f"{side.upper()} {', '.join(reasons)}" for side, reasons in sorted(r.throttled.items()))
            lines.append(f"  {r.label}: {sides}")
    return lines


def failed_lines(rows: list[PairedRow]) -> list[str]:
    """The rows that failed on a side (a wrong result, a crash), each with that side's error: what
    an A/B most needs to say when compiler B breaks an operator."""
    hit = [r for r in rows if r.errors]
    lines = [f"rows that FAILED on a side (out of the headline): {len(hit)}"] if hit else []
    for r in hit:
        lines += [f"  {r.label}: {side.upper()} {error}" for side, error in sorted(r.errors.items())]
    return lines


def kernels_table(rows: list[PairedRow], fmt: str) -> str:
    """Each profiled row's top kernels per side (results.json `kernels`), or '' if none was profiled."""
    profiled = [r for r in rows if r.kernels]
    if not profiled:
        return ""
    return tabulate([[r.op, r.dtype, _shape(r), table.kernels_cell(r.kernels.get("a")),
                      table.kernels_cell(r.kernels.get("b"))] for r in profiled],
                    headers=["op", "dtype", "shape", f"A top kernels (share, top {table.TOP_KERNELS})",
                             "B top kernels"], tablefmt=fmt, disable_numparse=True)


def headline(summary: Summary, warnings: list[str], context: dict, note: str | None = None,
             rows: list[PairedRow] = ()) -> list[str]:
    lines = [note] if note else []
    lines.append(f"A/B {context.get('name', '')}: A = {context.get('a', 'A')}, B = {context.get('b', 'B')}; "
                 f"ratio = B latency / A latency (below 1: B faster)")
    lines += [f"WARNING: {w}" for w in warnings]
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(summary.verdicts.items())) or "none"
    lines.append(f"rows: {summary.headline_rows} of {summary.rows} in the headline; verdicts: {verdicts}")
    if note is None:
        lines.append(summary.fdr_line())
        lines += summary.resolution_lines()
        factors = factor_line(list(rows))
        if factors:
            lines.append(factors)
        if context.get("calibration"):
            lines.append(context["calibration"])
    if summary.excluded:
        excluded = ", ".join(f"{k} {v}" for k, v in sorted(summary.excluded.items()))
        lines.append(f"excluded from the headline: {excluded}")
    lines += failed_lines(list(rows))
    lines += throttled_lines(list(rows))
    if summary.config_differs:
        lines.append(f"rows whose sides ran different autotune configs: {summary.config_differs}")
    performance = note is None
    lines.append(f"overall geomean B/A: {_gm(summary.overall, performance)}")
    for op, gm in summary.per_op.items():
        lines.append(f"  {op}: {_gm(gm, performance)}")
    lines.append(f"control (torch baseline) geomean B/A: {_gm(summary.control, performance)} -- should be ~1: it "
                 "does not depend on the compiler under test")
    return lines


def _what_changed(row: PairedRow, what_changed: dict) -> dict | None:
    return what_changed.get((row.op, row.dtype, tuple(row.shape)))


def render(rows: list[PairedRow], summary: Summary, warnings: list[str], context: dict, fmt: str = "simple",
           note: str | None = None, what_changed: dict | None = None) -> str:
    """`what_changed`: (op, dtype, shape) -> the row's what-changed record (reports.explain), for the
    rows that have one; where any names a variant, the table gets a `what changed` column and the shared
    changes follow."""
    cells = [_cells(r, note is None) for r in rows]
    headers = HEADERS
    if any(record["variants"] for record in (what_changed or {}).values()):
        # Before the flags, which stay last.
        cells = [c[:-1] + [explain.cell(_what_changed(r, what_changed)), c[-1]]
                 for c, r in zip(cells, rows, strict=True)]
        headers = [*HEADERS[:-1], "what changed", HEADERS[-1]]
    if any(r.sequential for r in rows):
        # Sequential repeats (reports.sequential): each row's repeats per side and why it stopped there.
        cells = [c[:-1] + [f"{r.sequential.repeats} {r.sequential.reason}" if r.sequential else "-", c[-1]]
                 for c, r in zip(cells, rows, strict=True)]
        headers = [*headers[:-1], "repeats", headers[-1]]
    out = tabulate(cells, headers=headers, tablefmt=fmt, disable_numparse=True)
    kernels = kernels_table(rows, fmt)
    shared = explain.group_lines(explain.groups(
        [{"id": r.label, "verdict": r.verdict, "what_changed": _what_changed(r, what_changed)} for r in rows]
    )) if what_changed else []
    head = headline(summary, warnings, context, note, rows)
    if fmt == "github":
        head = table.markdown_list(head)
    return ("\n".join(head) + "\n\n" + out + "\n"
            + (f"\n{kernels}\n" if kernels else "") + ("\n" + "\n".join(shared) + "\n" if shared else ""))


def write(out_dir: Path, rows: list[PairedRow], summary: Summary, warnings: list[str], context: dict,
          note: str | None = None, what_changed: dict | None = None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    what_changed = what_changed or {}
    md = out_dir / "report.md"
    rundir.atomic_write_text(md, "# A/B report\n\n" + render(rows, summary, warnings, context, "github", note,
                                                               what_changed))
    csv_path = out_dir / "report.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "dtype", "shape", "a_ms_geomean", "b_ms_geomean", "ratio", "ci_lo", "ci_hi", "verdict",
                    "margin", "q", "n_a", "n_b", "flags", "config_differs", "measures_performance"])
        for r in rows:
            c = r.comparison
            q = c.q if c and c.q is not None else ""
            w.writerow([r.op, r.dtype, _shape(r), _center(r.a_ms), _center(r.b_ms), c.ratio if c else "",
                        c.lo if c else "", c.hi if c else "", r.verdict, c.margin if c else "", q,
                        len(r.a_ms), len(r.b_ms), ";".join(r.flags), r.config_differs, note is None])
    js = out_dir / "report.json"
    rundir.atomic_write_json(js, {
        "format": REPORT_FORMAT, "measures_performance": note is None, "note": note, "context": context,
        "warnings": warnings,
        "summary": dataclasses.asdict(summary),
        "rows": [{"op": r.op, "dtype": r.dtype, "shape": list(r.shape), "a_ms": r.a_ms, "b_ms": r.b_ms,
                  "a_control_ms": r.a_control_ms, "b_control_ms": r.b_control_ms, "timers": sorted(r.timers),
                  "flags": r.flags, "configs_a": r.configs_a, "configs_b": r.configs_b,
                  "config_differs": r.config_differs, "throttled": r.throttled, "kernels": r.kernels,
                  "errors": r.errors, "what_changed": _what_changed(r, what_changed),
                  "process_factor": r.process_factor, "measures_performance": note is None,
                  "sequential": r.sequential.to_json() if r.sequential else None,
                  "comparison": dataclasses.asdict(r.comparison) if r.comparison else None} for r in rows]})
    return [md, csv_path, js, plot(out_dir / "ratios.png", rows, context, note)]


def figure(rows: list[PairedRow], context: dict, note: str | None = None):
    """The ratios plot as a matplotlib Figure (drawn with the Agg backend, no display needed)."""
    from matplotlib import ticker
    from matplotlib.figure import Figure

    # Under a note the ratios are not performance numbers: the tables call them n/a, and so does the plot.
    shown = [r for r in rows if r.comparison is not None] if note is None else []
    # Constrained layout makes room for the rotated row labels and the title.
    fig = Figure(figsize=(max(6.0, 0.35 * len(shown) + 2), 4.5), layout="constrained")
    ax = fig.add_subplot()
    colors = {stats.FASTER: "tab:green", stats.SLOWER: "tab:red", stats.SAME: "tab:gray", stats.NOISY: "tab:orange",
              stats.NOT_APPLICABLE: "tab:gray"}
    for i, r in enumerate(shown):
        c = r.comparison
        lo = c.lo if math.isfinite(c.lo) else c.ratio
        hi = c.hi if math.isfinite(c.hi) else c.ratio
        ax.errorbar(i, c.ratio, yerr=[[c.ratio - lo], [hi - c.ratio]], fmt="o", capsize=3,
                    color=colors[c.verdict], markerfacecolor="none" if r.flags else colors[c.verdict])
    if shown:
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(shown)), [r.label for r in shown], rotation=90, fontsize=7)
        ops = [r.op for r in shown]
        for i in range(1, len(ops)):
            if ops[i] != ops[i - 1]:
                ax.axvline(i - 0.5, color="lightgray", linewidth=0.8)
        # A log axis: 2x slower sits as far above 1 as 2x faster below it.
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        # Round ratios as ticks: within a narrow span a log locator would leave only 1 labelled.
        ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=6) if hi / lo < 4 else ticker.LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:.4g}"))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.set_ylabel("B / A latency, log scale (below 1: B faster)")
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no rows to plot" if note is None else "no ratios to plot: see the note above",
                ha="center", va="center", transform=ax.transAxes)
    title = f"A/B {context.get('name', '')}: {context.get('a', 'A')} vs {context.get('b', 'B')}"
    fontsize = 8 if note else 9
    # Layout engines do not wrap a title: one wider than the figure is cut at both edges. Wrap it to
    # the figure's width (a capital is about 0.7 em wide).
    width = int(fig.get_figwidth() * 72 / (0.7 * fontsize))
    lines = [*(textwrap.wrap(note, width) if note else []), *textwrap.wrap(title, width)]
    fig.suptitle("\n".join(lines), fontsize=fontsize)
    return fig


def plot(path: Path, rows: list[PairedRow], context: dict, note: str | None = None) -> Path:
    figure(rows, context, note).savefig(path, dpi=120)
    return path
