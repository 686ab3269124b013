"""The corpus report as one HTML page that opens offline: CSS and JS inline, the B/A distribution as
a base64 PNG, no external URL. The page's state (filter, sort, open row) lives in the URL's
fragment (`report.html#verdict=SLOWER&sort=ratio&desc=1`), so a view can be linked to and reloaded.

Rows are rendered in the server-side order (worst B/A first); the script only sorts, filters and
opens what is there, so without it the page still shows everything. The markup is
templates/corpus_report.html.j2; this module turns the report's data into the text it shows.
"""

from __future__ import annotations

import base64
import io
import json
import math
import urllib.parse
from pathlib import Path

import jinja2
import markupsafe

from reports import explain, stats, table

VERDICT_COLORS = {stats.SLOWER: "#c62828", stats.FASTER: "#2e7d32", stats.SAME: "#757575", stats.NOISY: "#ef6c00",
                  stats.NOT_APPLICABLE: "#757575", "UNPAIRED": "#6a1b9a", "FAILED": "#b71c1c"}

# Inlined into every page: the report opens offline and travels as one file.
TEMPLATES = Path(__file__).resolve().parent / "templates"
# Autoescaping on for every template: op names, errors and IR text are data, never markup.
_JINJA = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                            undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_JINJA.filters["verdict_color"] = lambda verdict: VERDICT_COLORS.get(verdict, "#555")
# A fragment parameter's value, as the page's script reads it back (URLSearchParams).
_JINJA.filters["fragment"] = lambda value: urllib.parse.quote(str(value), safe="")


def _num(value, performance: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if performance else stats.NOT_APPLICABLE


def _ms(value) -> str:
    """A latency, shown whatever the backend, as every other report shows it: a timing is what was
    measured; the row's NOT_PERFORMANCE flag says when it is no performance number."""
    return "-" if value is None else f"{value:.4f}"


def _latency(value) -> dict:
    """A latency cell, sorted by its value."""
    return {"text": _ms(value), "v": value}


def _sortable(value, performance: bool) -> dict:
    """A number cell: its text, and the value the page sorts it by: none where the text says n/a, so
    such cells sort last instead of by a number the page does not show."""
    return {"text": _num(value, performance), "v": value if performance else None}


def _ratio(value, performance: bool, verdict: str = "") -> dict:
    """The ratio, coloured only where its verdict called a change (a 0.98 the data cannot tell from 1 is no win)."""
    if value is None or not performance:
        return {**_sortable(value, performance), "cls": "", "title": ""}
    cls = {stats.SLOWER: "slower", stats.FASTER: "faster"}.get(verdict, "")
    return {"text": f"{value:.4f}", "v": value, "cls": cls, "title": stats.describe(value)}


def _counts(verdicts: dict) -> list[tuple[str, int]]:
    return sorted(verdicts.items())


def figure(data: dict):
    """The B/A distribution of the headline rows, stacked by verdict, as a matplotlib Figure. Where the
    timings are not performance numbers the tables call every ratio n/a, and nothing is plotted. Its
    title counts the headline rows as the headline does, and says which of them it could not plot."""
    from matplotlib.figure import Figure

    headline = [r for r in data["rows"] if r["in_headline"]]
    rows = [r for r in headline if r["ratio"]] if data["measures_performance"] else []
    fig = Figure(figsize=(8, 3.2), layout="tight")
    ax = fig.add_subplot()
    if rows:
        logs = [math.log2(r["ratio"]) for r in rows]
        lo, hi = min(logs + [-0.05]), max(logs + [0.05])
        bins = [lo + (hi - lo) * i / 40 for i in range(41)]
        verdicts = sorted({r["verdict"] for r in rows})
        ax.hist([[math.log2(r["ratio"]) for r in rows if r["verdict"] == v] for v in verdicts], bins=bins,
                stacked=True, label=verdicts, color=[VERDICT_COLORS.get(v, "#555") for v in verdicts])
        ax.legend(fontsize=8)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ticks = ax.get_xticks()
        ax.set_xticks(ticks, [f"{2 ** t:.3g}" for t in ticks])
        ax.set_xlabel("B / A latency, log scale (below 1: B faster)")
        ax.set_ylabel("rows")
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no rows to plot" if data["measures_performance"] else "no ratios to plot: see the note",
                ha="center", va="center", transform=ax.transAxes)
    title = plot_title(len(rows), len(headline), data["measures_performance"])
    ax.set_title(f"{data['note']}\n{title}" if data["note"] else title, fontsize=8 if data["note"] else 10)
    return fig


def plot_title(plotted: int, headline: int, performance: bool) -> str:
    """`B/A of 6 headline rows`; one that plots fewer than the headline's rows says how many and why."""
    if not performance:
        return f"B/A of {headline} headline rows: not plotted, the timings are not performance numbers"
    if plotted < headline:
        return f"B/A of {plotted} of {headline} headline rows ({headline - plotted} without a ratio)"
    return f"B/A of {headline} headline rows"


def plot_png(data: dict) -> str:
    """figure(data) as base64 PNG, for a data: URL."""
    buf = io.BytesIO()
    figure(data).savefig(buf, format="png", dpi=110)
    return base64.b64encode(buf.getvalue()).decode()


def _diff(text: str) -> list[tuple[str, str]]:
    """(class, line) per line of a unified diff: hunk headers, added and removed lines told apart."""
    return [("hunk" if line.startswith("@@") else "add" if line.startswith("+") and not line.startswith("+++")
             else "del" if line.startswith("-") and not line.startswith("---") else "", line)
            for line in text.splitlines()]


IR_WORDS = {"not_collected": "IR not collected on a side (see its run.json observed.ir)",
            "none_launched": "no launched variant recorded for this shape"}


def _ir_detail(ir: dict) -> dict:
    if ir["status"] != "changed":
        words = IR_WORDS.get(ir["status"]) or f"identical at every stage ({ir['identical']} launched variants)"
        return {"variants": None, "words": words}
    return {"identical": ir["identical"], "variants": [
        {"kernel": v["kernel"], "variant": v["variant"], "status": v["status"],
         "stages": f"; stages differing: {', '.join(v['stages'])}" if v["stages"] else "",
         "diff": _diff(v["diff"]) if v["diff"] else [], "truncated": v["diff_truncated"],
         "file_a": v["file_a"], "file_b": v["file_b"]} for v in ir["variants"]]}


def _what_changed(what: dict | None) -> dict | None:
    """The statistics of the row's launched variants that B changed (reports.explain), one table row per
    field: shown above the IR diff, so the named facts come before the ~100 lines they hide in."""
    if not what:
        return None
    cells = [(f"{v['kernel']} / {v['variant']}", c["field"], explain.value_text(c["field"], c["a"]),
              explain.value_text(c["field"], c["b"])) for v in what["variants"] for c in v["changes"]]
    return {"cells": cells, "text": what["text"]}


def _side(summary: dict, repeats) -> str:
    if not summary["n"]:
        return "none"
    text = (f"n={summary['n']} geometric mean {_ms(summary['gm_ms'])} ms "
            f"(min {_ms(summary['min_ms'])}, max {_ms(summary['max_ms'])})")
    if repeats:
        text += "; repeats: " + ", ".join(f"{x:.4f}" for x in repeats)
    return text


def _detail(r: dict, performance: bool, basis_note: str) -> list[dict]:
    """The drill-down's (term, text) items; the B/A one leads with the coloured ratio."""
    interval = (f"[{r['lo']:.4f}, {r['hi']:.4f}]" if performance and r["lo"] is not None
                else stats.NOT_APPLICABLE if not performance else "none")
    words = stats.describe(r["ratio"]) if performance and r["ratio"] else ""
    within = " (within-process only)" if r["basis"] == "single_run" else ""
    items = [
        ("95% interval", interval + within),
        ("margin", f"{r['margin']:.2%}" if r["margin"] is not None else "-"),
        ("q (FDR-adjusted)", f"{r['q']:.3g}" if performance and r["q"] is not None else "-"),
        ("basis", basis_note if r["basis"] == "single_run" else "independent repeats"),
        ("A latency", _side(r["a"], r["a_repeats_ms"])),
        ("B latency", _side(r["b"], r["b_repeats_ms"])),
        ("control B/A", _num(r["control_ratio"], performance)),
        ("timers", ", ".join(r["timers"]) or "-"),
        ("flags", ", ".join(r["flags"]) or "none"),
        *((f"{side.upper()} failed", error) for side, error in sorted(r["errors"].items())),
        ("configs", "differ between A and B" if r["config_differs"] else "the same on both sides"),
        ("run dirs", f"A {r['run_a']}  B {r['run_b']}"),
    ]
    return [{"key": "B/A", "ratio": _ratio(r["ratio"], performance, r["verdict"]), "text": words},
            *({"key": k, "ratio": None, "text": v} for k, v in items)]


ROW_COLUMNS = (("op", "op", "str"), ("dtype", "dtype", "str"), ("shape", "shape", "str"), ("a", "A ms (gm)", "num"),
               ("b", "B ms (gm)", "num"), ("ratio", "B/A", "num"), ("interval", "95% interval", "num"),
               ("verdict", "verdict", "str"), ("control", "control B/A", "num"), ("ir", "IR", "str"),
               ("flags", "flags", "str"))


def _row(r: dict, performance: bool, basis_note: str) -> dict:
    shape = "x".join(map(str, r["shape"] or ()))
    ir = r["ir"]
    flags = (r["flags"] + (["config_differs"] if r["config_differs"] else [])
             + ([] if performance else [table.NOT_PERFORMANCE]))
    interval = f"[{r['lo']:.4f}, {r['hi']:.4f}]" if performance and r["lo"] is not None else _num(None, performance)
    configs = ("A: " + json.dumps(r["configs_a"], indent=1) + "\nB: " + json.dumps(r["configs_b"], indent=1)
               if r["config_differs"] else "")
    return {"id": r["id"], "op_key": r["op_key"], "dtype": r["dtype"], "shape": shape, "verdict": r["verdict"],
            "ir_status": ir["status"], "flagged": int(not r["in_headline"]),
            # A benchmark whose inputs carry no dtype (integer or index inputs) has rows without one.
            "text": " ".join([r["op_key"], r["dtype"] or "", shape, *flags]).lower(),
            "a": _latency(r["a"]["gm_ms"]), "b": _latency(r["b"]["gm_ms"]),
            "ratio": _ratio(r["ratio"], performance, r["verdict"]),
            "interval": {"text": interval, "v": r["hi"] if performance else None},
            "control": _sortable(r["control_ratio"], performance),
            "ir_text": (f"changed ({len(ir['variants'])})" if ir["status"] == "changed"
                        else ir["status"].replace("_", " ")),
            "flags": ", ".join(flags), "detail": _detail(r, performance, basis_note), "configs": configs,
            "what_changed": _what_changed(r.get("what_changed")), "ir": _ir_detail(ir)}


def _op(o: dict, performance: bool) -> dict:
    gm = o["geomean"]
    return {"op": o["op"], "rows": o["rows"], "headline_rows": o["headline_rows"],
            "geomean": _ratio(gm["ratio"], performance),
            "interval": f"[{gm['lo']:.4f}, {gm['hi']:.4f}]" if performance and gm["lo"] is not None else "-",
            "verdicts": _counts(o["verdicts"]), "slower": o["verdicts"].get(stats.SLOWER, 0),
            "worst": _ratio(o["worst_ratio"], performance), "ir_changed_rows": o["ir_changed_rows"],
            "flagged_rows": o["flagged_rows"], "control": _sortable(o["control"], performance),
            "notes": "; ".join(o["notes"])}


OP_COLUMNS = (("op", "str"), ("rows in headline", "num"), ("geomean B/A", "num"), ("interval", "str"),
              ("verdicts (SLOWER count)", "num"), ("worst B/A", "num"), ("IR changed rows", "num"),
              ("flagged rows", "num"), ("control B/A", "num"), ("notes", "str"))
VERDICT_OPTIONS = (stats.SLOWER, stats.FASTER, stats.SAME, stats.NOISY, stats.NOT_APPLICABLE, "FAILED", "UNPAIRED")


def render(data: dict, headline: list[str]) -> str:
    """The page; `headline` is the report's headline (reports.corpus.headline), shown as it is, once."""
    performance = data["measures_performance"]
    css, js = ((TEMPLATES / name).read_text() for name in ("corpus_report.css", "corpus_report.js"))
    return _JINJA.get_template("corpus_report.html.j2").render(
        title=f"{'A/B' if data['kind'] == 'ab' else 'Corpus A/B'}: {data['context'].get('a', 'A')} vs "
              f"{data['context'].get('b', 'B')}",
        # Our own files, inlined as they are.
        css=markupsafe.Markup(css), js=markupsafe.Markup(js),
        headline=[("note" if line == data["note"] else "warn" if line.startswith("WARNING") else "", line)
                  for line in headline],
        plot=plot_png(data), op_columns=OP_COLUMNS,
        ops=[_op(o, performance) for o in data["ops"]], verdict_options=VERDICT_OPTIONS, row_columns=ROW_COLUMNS,
        rows=[_row(r, performance, data["basis_note"]) for r in data["rows"]],
        ir_changed=[{"id": r["id"], "ratio": _ratio(r["ratio"], performance, r["verdict"]),
                     "variants": len(r["ir"]["variants"])} for r in data["rows"] if r["ir"]["status"] == "changed"],
        flagged=[{"id": r["id"], "op_key": r["op_key"], "dtype": r["dtype"], "shape": "x".join(map(str, r["shape"])),
                  "verdict": r["verdict"], "flags": ", ".join(r["flags"])} for r in data["rows"]
                 if not r["in_headline"]],
        unpaired=data["unpaired_ops"], sources=json.dumps(data["sources"]), format=data["format"])
