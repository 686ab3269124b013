"""The corpus report as one HTML page that opens offline: CSS and JS inline, the B/A distribution as
a base64 PNG, no external URL. The page's state (filter, sort, open row) lives in the URL's
fragment (`report.html#verdict=SLOWER&sort=ratio&desc=1`), so a view can be linked to and reloaded.

Rows are rendered in the server-side order (worst B/A first); the script only sorts, filters and
opens what is there, so without it the page still shows everything.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import urllib.parse
from pathlib import Path

from reports import explain, stats

VERDICT_COLORS = {stats.SLOWER: "#c62828", stats.FASTER: "#2e7d32", stats.SAME: "#757575", stats.NOISY: "#ef6c00",
                  stats.NOT_APPLICABLE: "#757575", "UNPAIRED": "#6a1b9a", "FAILED": "#b71c1c"}

# Inlined into every page: the report opens offline and travels as one file.
TEMPLATES = Path(__file__).resolve().parent / "templates"


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _q(value: str) -> str:
    """A fragment parameter's value, as the page's script reads it back (URLSearchParams)."""
    return _e(urllib.parse.quote(value, safe=""))


def _num(value, performance: bool, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if performance else stats.NOT_APPLICABLE


def _td(text: str, sort_value=None, cls: str = "") -> str:
    v = "" if sort_value is None else f' data-v="{_e(sort_value)}"'
    c = f' class="{cls}"' if cls else ""
    return f"<td{v}{c}>{text}</td>"


def _verdict(verdict: str) -> str:
    return f'<span class="badge" style="background:{VERDICT_COLORS.get(verdict, "#555")}">{_e(verdict)}</span>'


def _ratio(value, performance: bool, verdict: str = "") -> str:
    """The ratio, coloured only where its verdict called a change (a 0.98 the data cannot tell from 1 is no win)."""
    if value is None or not performance:
        return _e(_num(value, performance))
    cls = {stats.SLOWER: ' class="slower"', stats.FASTER: ' class="faster"'}.get(verdict, "")
    return f'<span{cls} title="{_e(stats.describe(value))}">{value:.4f}</span>'


def plot_png(data: dict) -> str:
    """The B/A distribution of the headline rows, stacked by verdict, as base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r["in_headline"] and r["ratio"]]
    fig, ax = plt.subplots(figsize=(8, 3.2))
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
    title = f"B/A of {len(rows)} headline rows"
    ax.set_title(f"{data['note']}\n{title}" if data["note"] else title, fontsize=8 if data["note"] else 10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _diff(text: str) -> str:
    out = []
    for line in text.splitlines():
        cls = ("hunk" if line.startswith("@@") else "add" if line.startswith("+") and not line.startswith("+++")
               else "del" if line.startswith("-") and not line.startswith("---") else "")
        out.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return '<pre class="diff">' + "\n".join(out) + "</pre>"


def _ir_detail(ir: dict) -> str:
    if ir["status"] != "changed":
        words = {"not_collected": "IR not collected on a side (see its run.json observed.ir)",
                 "none_launched": "no launched variant recorded for this shape",
                 "identical": f"identical at every stage ({ir['identical']} launched variants)"}
        return f"<p>IR: {_e(words[ir['status']])}</p>"
    parts = [f"<p>IR: {len(ir['variants'])} launched variant(s) differ; {ir['identical']} identical</p>"]
    for v in ir["variants"]:
        stages = f"; stages differing: {', '.join(v['stages'])}" if v["stages"] else ""
        parts.append(f"<h4>{_e(v['kernel'])} / {_e(v['variant'])}: {_e(v['status'])}{_e(stages)}</h4>")
        if v["diff"]:
            parts.append(_diff(v["diff"]))
        else:
            parts.append("<p>TTGIR identical: the change is in a later stage</p>")
        if v["diff_truncated"]:
            parts.append(f"<p class=warn>diff cut: full files {_e(v['file_a'])} and {_e(v['file_b'])}</p>")
    return "".join(parts)


def _what_changed(what: dict | None) -> str:
    """The statistics of the row's launched variants that B changed (reports.explain), one table row per
    field: shown above the IR diff, so the named facts come before the ~100 lines they hide in."""
    if not what:
        return ""
    cells = [(f"{v['kernel']} / {v['variant']}", c["field"], explain.value_text(c["field"], c["a"]),
              explain.value_text(c["field"], c["b"])) for v in what["variants"] for c in v["changes"]]
    if not cells:
        return f"<p>what changed: {_e(what['text'])}</p>"
    body = "".join(f"<tr><td>{_e(v)}</td><td>{_e(f)}</td><td>{_e(a)}</td><td>{_e(b)}</td></tr>" for v, f, a, b in cells)
    return ('<table class="what-changed"><thead><tr><th>variant</th><th>what changed</th><th>A</th><th>B</th></tr>'
            f"</thead><tbody>{body}</tbody></table>")


def _side(summary: dict, repeats, performance: bool) -> str:
    if not summary["n"]:
        return "none"
    text = (f"n={summary['n']} geometric mean {_num(summary['gm_ms'], performance)} ms "
            f"(min {_num(summary['min_ms'], performance)}, max {_num(summary['max_ms'], performance)})")
    if repeats and performance:
        text += "; repeats: " + ", ".join(f"{x:.4f}" for x in repeats)
    return _e(text)


def _detail(r: dict, performance: bool, basis_note: str) -> str:
    interval = (f"[{r['lo']:.4f}, {r['hi']:.4f}]" if performance and r["lo"] is not None
                else stats.NOT_APPLICABLE if not performance else "none")
    words = stats.describe(r["ratio"]) if performance and r["ratio"] else ""
    within = " (within-process only)" if r["basis"] == "single_run" else ""
    items = [
        ("B/A", _ratio(r["ratio"], performance, r["verdict"]) + " " + _e(words)),
        ("95% interval", _e(interval + within)),
        ("margin", _e(f"{r['margin']:.2%}" if r["margin"] is not None else "-")),
        ("q (FDR-adjusted)", _e(f"{r['q']:.3g}" if performance and r["q"] is not None else "-")),
        ("basis", _e(basis_note if r["basis"] == "single_run" else "independent repeats")),
        ("A latency", _side(r["a"], r["a_repeats_ms"], performance)),
        ("B latency", _side(r["b"], r["b_repeats_ms"], performance)),
        ("control B/A", _e(_num(r["control_ratio"], performance))),
        ("timers", _e(", ".join(r["timers"]) or "-")),
        ("flags", _e(", ".join(r["flags"]) or "none")),
        *((f"{side.upper()} failed", _e(error)) for side, error in sorted(r["errors"].items())),
        ("configs", _e("differ between A and B" if r["config_differs"] else "the same on both sides")),
        ("run dirs", _e(f"A {r['run_a']}  B {r['run_b']}")),
    ]
    parts = ["<dl>", *(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items), "</dl>"]
    if r["config_differs"]:
        parts.append("<pre>" + _e("A: " + json.dumps(r["configs_a"], indent=1) + "\nB: "
                                   + json.dumps(r["configs_b"], indent=1)) + "</pre>")
    parts.append(_what_changed(r.get("what_changed")))
    parts.append(_ir_detail(r["ir"]))
    return "".join(parts)


ROW_COLUMNS = (("op", "op", "str"), ("dtype", "dtype", "str"), ("shape", "shape", "str"), ("a", "A ms (gm)", "num"),
               ("b", "B ms (gm)", "num"), ("ratio", "B/A", "num"), ("interval", "95% interval", "num"),
               ("verdict", "verdict", "str"), ("control", "control B/A", "num"), ("ir", "IR", "str"),
               ("flags", "flags", "str"))


def _row_html(r: dict, performance: bool, basis_note: str) -> str:
    shape = "x".join(map(str, r["shape"]))
    ir = r["ir"]
    ir_text = (f"changed ({len(ir['variants'])})" if ir["status"] == "changed" else ir["status"].replace("_", " "))
    interval = f"[{r['lo']:.4f}, {r['hi']:.4f}]" if performance and r["lo"] is not None else _num(None, performance)
    flags = r["flags"] + (["config_differs"] if r["config_differs"] else [])
    cells = [_td(_e(r["op_key"])), _td(_e(r["dtype"])), _td(_e(shape)),
             _td(_e(_num(r["a"]["gm_ms"], performance)), r["a"]["gm_ms"], "num"),
             _td(_e(_num(r["b"]["gm_ms"], performance)), r["b"]["gm_ms"], "num"),
             _td(_ratio(r["ratio"], performance, r["verdict"]), r["ratio"], "num"), _td(_e(interval), r["hi"], "num"),
             _td(_verdict(r["verdict"])), _td(_e(_num(r["control_ratio"], performance)), r["control_ratio"], "num"),
             _td(_e(ir_text)), _td(_e(", ".join(flags)))]
    text = " ".join([r["op_key"], r["dtype"], shape, *flags]).lower()
    rid = _e(r["id"])
    return (f'<tbody id="row-{rid}" data-op="{_e(r["op_key"])}" data-verdict="{_e(r["verdict"])}" '
            f'data-ir="{_e(ir["status"])}" data-flagged="{int(not r["in_headline"])}" data-text="{_e(text)}">'
            f'<tr class="main">{"".join(cells)}</tr>'
            f'<tr class="detail" hidden><td colspan="{len(ROW_COLUMNS)}">{_detail(r, performance, basis_note)}</td>'
            "</tr></tbody>")


def _op_html(o: dict, performance: bool) -> str:
    gm = o["geomean"]
    verdicts = " ".join(f"{_verdict(k)}{v}" for k, v in sorted(o["verdicts"].items()))
    interval = f"[{gm['lo']:.4f}, {gm['hi']:.4f}]" if performance and gm["lo"] is not None else "-"
    return ("<tr>" + _td(f'<a href="#op={_q(o["op"])}">{_e(o["op"])}</a>', o["op"])
            + _td(f"{o['headline_rows']}/{o['rows']}", o["headline_rows"], "num")
            + _td(_ratio(gm["ratio"], performance), gm["ratio"], "num") + _td(_e(interval))
            + _td(verdicts, o["verdicts"].get(stats.SLOWER, 0))
            + _td(_ratio(o["worst_ratio"], performance), o["worst_ratio"], "num")
            + _td(str(o["ir_changed_rows"]), o["ir_changed_rows"], "num")
            + _td(str(o["flagged_rows"]), o["flagged_rows"], "num")
            + _td(_e(_num(o["control"], performance)), o["control"], "num")
            + _td(_e("; ".join(o["notes"]))) + "</tr>")


OP_COLUMNS = (("op", "str"), ("rows in headline", "num"), ("geomean B/A", "num"), ("interval", "str"),
              ("verdicts (SLOWER count)", "num"), ("worst B/A", "num"), ("IR changed rows", "num"),
              ("flagged rows", "num"), ("control B/A", "num"), ("notes", "str"))


def render(data: dict, headline: list[str]) -> str:
    performance = data["measures_performance"]
    s = data["summary"]
    title = f"Corpus A/B: {data['context'].get('b', 'B')} vs {data['context'].get('a', 'A')}"
    overall = s["overall"]
    interval = f" [{overall['lo']:.4f}, {overall['hi']:.4f}]" if overall["lo"] is not None else ""
    big = (f"{overall['ratio']:.4f}{interval} over {overall['over']} ({stats.describe(overall['ratio'])})"
           if performance and overall["ratio"] else stats.NOT_APPLICABLE)
    verdicts = " ".join(f"{_verdict(k)}{v}" for k, v in sorted(s["verdicts"].items())) or "none"
    head = ["<div class=headline>", f'<p class="note">{_e(data["note"])}</p>' if data["note"] else "",
            f'<p>overall geomean B/A: <span class="big" id="overall">{_e(big)}</span></p>',
            f"<p>verdicts over {s['headline_rows']} of {s['rows']} rows: {verdicts}</p>",
            *(f"<p>{_e(line)}</p>" for line in headline if not line.startswith(("WARNING", "NOTE"))),
            *(f'<p class="warn">{_e(w)}</p>' for w in data["warnings"]), "</div>"]
    flagged = [r for r in data["rows"] if not r["in_headline"]]
    flagged_html = "".join(
        f'<tr><td><a href="#open={_q(r["id"])}">{_e(r["op_key"])}</a></td><td>{_e(r["dtype"])}</td>'
        f'<td>{_e("x".join(map(str, r["shape"])))}</td><td>{_verdict(r["verdict"])}</td>'
        f'<td>{_e(", ".join(r["flags"]))}</td></tr>' for r in flagged)
    unpaired = "".join(f"<li><b>{_e(u['op'])}</b>: {_e(u['reason'])}</li>" for u in data["unpaired_ops"])
    ir_rows = "".join(f'<li><a href="#open={_q(r["id"])}">{_e(r["id"])}</a>: B/A '
                      f'{_ratio(r["ratio"], performance, r["verdict"])}, {len(r["ir"]["variants"])} variant(s)</li>'
                      for r in data["rows"] if r["ir"]["status"] == "changed")
    verdict_options = "".join(f'<option value="{_e(v)}">{_e(v)}</option>'
                              for v in (stats.SLOWER, stats.FASTER, stats.SAME, stats.NOISY, stats.NOT_APPLICABLE,
                                        "FAILED", "UNPAIRED"))
    body = [
        f"<h1>{_e(title)}</h1>", *head,
        "<h2>Distribution</h2>",
        f'<img alt="B/A distribution" src="data:image/png;base64,{plot_png(data)}">',
        "<h2>Operators (worst B/A first; click a header to sort, an op to see its rows)</h2>",
        '<div class="controls"><input id="opq" placeholder="filter ops"></div>',
        '<table id="ops"><thead><tr>' + "".join(f'<th data-type="{t}">{_e(h)}</th>' for h, t in OP_COLUMNS)
        + "</tr></thead><tbody>" + "".join(_op_html(o, performance) for o in data["ops"]) + "</tbody></table>",
        "<h2>Rows (click a row for its drill-down and IR diff)</h2>",
        '<div class="controls"><input id="q" placeholder="filter op, dtype, shape, flag">'
        f'<select id="verdict"><option value="">any verdict</option>{verdict_options}</select>'
        '<label><input type="checkbox" id="ir"> IR changed</label>'
        '<label><input type="checkbox" id="flagged"> flagged / excluded</label>'
        '<a href="#">reset</a> <span id="shown" class="muted"></span></div>',
        '<table id="rows"><thead><tr>'
        + "".join(f'<th data-key="{k}" data-type="{t}">{_e(h)}</th>' for k, h, t in ROW_COLUMNS) + "</tr></thead>"
        + "".join(_row_html(r, performance, data["basis_note"]) for r in data["rows"]) + "</table>",
        "<h2>Rows whose IR changed</h2>", f"<ul id=ir-changed>{ir_rows or '<li>none</li>'}</ul>",
        "<h2>Flagged and excluded rows</h2>",
        (f'<table id="flagged-rows"><thead><tr><th>op</th><th>dtype</th><th>shape</th><th>verdict</th><th>flags'
         f"</th></tr></thead><tbody>{flagged_html}</tbody></table>" if flagged else "<p>none</p>"),
        "<h2>Operators not compared</h2>", f"<ul id=unpaired>{unpaired or '<li>none</li>'}</ul>",
        f'<p class="muted">sources: {_e(json.dumps(data["sources"]))}; report format {data["format"]}</p>',
    ]
    css, js = ((TEMPLATES / name).read_text() for name in ("corpus_report.css", "corpus_report.js"))
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{css}</style></head><body>\n" + "\n".join(body) + f"\n<script>{js}</script>\n</body></html>\n")
