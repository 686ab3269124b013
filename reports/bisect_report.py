"""The bisect report: per group of rows that moved together, the last good build and the first bad
one (with commit, subject and author date where the builds came from git), the B/A each probe saw,
and what the first bad build changed in the code that ran (the confirm's explain, as `ab` reports
it); as markdown, JSON and one offline HTML page.

A group's status says how far the search got:
    found         the confirm A/B (last good vs first bad) called the move
    found among   confirmed, but builds between were skipped: the first bad is one of them or the named one
    unconfirmed   the confirm A/B did not call the move there: a probe was wrong, or the move is spread
    did not move  the rows are SAME at the last build
    undecided     no build left to test, and none seen bad (skipped or NOISY ones in the way)
    open          the search did not finish (interrupted): resume it
"""

from __future__ import annotations

import math
from pathlib import Path

import jinja2
from tabulate import tabulate

from harness.core import rundir
from reports import explain

FORMAT = 1
FOUND, FOUND_AMONG, UNCONFIRMED, DID_NOT_MOVE, UNDECIDED, OPEN = (
    "found", "found among", "unconfirmed", "did not move", "undecided", "open")
SETTLED = (FOUND, FOUND_AMONG, DID_NOT_MOVE)
TEMPLATES = Path(__file__).resolve().parent / "templates"
_JINJA = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                            lstrip_blocks=True)


def _status(row: dict, n: int) -> str:
    moved = row["hi"] < n
    if row["open"] or (moved and row["confirmed"] is None):
        return OPEN
    if moved:
        if not row["confirmed"]:
            return UNCONFIRMED
        return FOUND_AMONG if row["between"] else FOUND
    return DID_NOT_MOVE if row["lo"] == n - 1 else UNDECIDED


def _build(state: dict, k: int | None) -> dict | None:
    if k is None or k >= len(state["spec"]["builds"]):
        return None
    build = state["spec"]["builds"][k]
    return {"index": k, "label": build["label"], "commit": build["commit"]}


def _what_changed(state: dict, row_id: str) -> dict | None:
    """The row's what-changed record from the last confirm A/B that compared it."""
    for done in reversed(state["probes"]):
        if done["probe"]["kind"] == "confirm" and row_id in done["verdicts"]:
            return done["verdicts"][row_id].get("what_changed")
    return None


def build(state: dict, rows: list[dict], skipped: dict[int, str]) -> dict:
    """The report's data, from bisect.json (`state`) and each row's search (search.Row as a dict, with
    `between`: the untested builds inside its interval, and `open`: builds left to test)."""
    n = len(state["spec"]["builds"])
    builds = []
    for k, b in enumerate(state["spec"]["builds"]):
        known = state["builds"].get(str(k))
        status = "not needed" if known is None else "ok" if known["ok"] else "skipped"
        builds.append({"index": k, "label": b["label"], "commit": b["commit"], "status": status,
                       "reason": known["reason"] if known else None})
    groups: dict[tuple, dict] = {}
    for row in rows:
        status = _status(row, n)
        key = (status, row["lo"], row["hi"], row["direction"], tuple(row["between"]))
        group = groups.setdefault(key, {
            "status": status, "direction": row["direction"], "rows": [],
            "last_good": _build(state, row["lo"]), "first_bad": _build(state, row["hi"]),
            "untested_between": [_build(state, k) | {"why": skipped.get(k) or row["untestable"].get(k)}
                                 for k in row["between"]],
            "probes": {}, "what_changed": {}})
        group["rows"].append(row["id"])
        for seen in row["seen"]:
            entry = group["probes"].setdefault(seen["probe"], {k: seen[k] for k in ("probe", "kind", "a", "b",
                                                                                      "repeats")} | {"rows": {}})
            entry["rows"][row["id"]] = {k: seen[k] for k in ("verdict", "ratio", "read_as") if k in seen}
        group["what_changed"][row["id"]] = _what_changed(state, row["id"])
    ordered = sorted(groups.values(), key=lambda g: (g["status"] != FOUND, g["rows"][0]))
    for group in ordered:
        group["probes"] = [group["probes"][k] for k in sorted(group["probes"])]
    return {"format": FORMAT, "complete": state["complete"], "from_ab": state["spec"]["from_ab"],
            "ops": state["spec"]["ops"], "repeats": state["spec"]["repeats"],
            "max_repeats": state["spec"]["max_repeats"], "builds": builds, "groups": ordered,
            "probes": [{"probe": i, **done["probe"], "dir": done["dir"]} for i, done in enumerate(state["probes"], 1)],
            "records": state["records"], "machines": machines(state)}


def machines(state: dict) -> dict[str, list[int]]:
    """Device name -> the probes whose steps ran on it (run.json `observed.device.device_name`, as each
    step's run saw it); a probe on several is listed under each."""
    found: dict[str, list[int]] = {}
    for i, done in enumerate(state["probes"], 1):
        for run_json in sorted(Path(done["dir"]).glob("*/*/*/" + rundir.RUN_JSON)):
            try:
                name = ((rundir.read_json(run_json).get("observed") or {}).get("device") or {}).get("device_name")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(name, str) and i not in found.setdefault(name, []):
                found[name].append(i)
    return found


def mixed_machines(data: dict) -> str | None:
    """The line a bisect whose probes ran on more than one kind of device gets, or None."""
    seen = data.get("machines") or {}
    if len(seen) < 2:
        return None
    said = "; ".join(f"{name}: probe{'s' * (len(p) > 1)} {', '.join(map(str, p))}" for name, p in seen.items())
    return (f"MIXED MACHINES: its probes ran on {len(seen)} kinds of device ({said}): a B/A on one is not the "
            "other's, and a confirm on one may not reproduce a search on the other. Bisect on one machine")


def build_text(build: dict | None) -> str:
    """`3 (a1b2c3d4e5 fix the tiling; 2026-11-30T10:00:00+00:00)`; `-` for none."""
    if build is None:
        return "-"
    commit = build["commit"]
    if commit:
        return f"{build['index']} ({commit['sha'][:10]} {commit['subject']}; {commit['author_date']})"
    return f"{build['index']} ({build['label']})"


def ratio_text(said: dict | None) -> str:
    if said is None:
        return ""
    ratio = said["ratio"]
    shown = f" {ratio:.4f}" if isinstance(ratio, (int, float)) and math.isfinite(ratio) else ""
    # A NOISY probe read by the size of the row's move (harness/sessions/bisect/search.py) says so.
    read_as = f" (read as {said['read_as']})" if said.get("read_as") else ""
    return f"{said['verdict']}{shown}{read_as}"


def _group_lines(group: dict, fmt: str) -> list[str]:
    # Markdown: the group a heading, its facts a list; the terminal: an indented block.
    head, item = ("### ", "- ") if fmt == "github" else ("", "  ")
    lines = [f"{head}{group['status'].upper()}: {len(group['rows'])} row(s)"
             + (f" moved {group['direction']}" if group["direction"] else ""), *([""] if head else []),
             f"{item}last good: {build_text(group['last_good'])}",
             f"{item}first bad: {build_text(group['first_bad'])}"]
    for between in group["untested_between"]:
        lines.append(f"{item}untested between (the first bad may be this one): {build_text(between)}: "
                     f"{between['why']}")
    lines += [f"{item}row: {row}" for row in group["rows"]]
    if group["probes"]:
        headers = ["probe", "kind", "builds (A vs B)", "repeats", *group["rows"]]
        table = [[p["probe"], p["kind"], f"{p['a']} vs {p['b']}", p["repeats"],
                  *(ratio_text(p["rows"].get(r)) for r in group["rows"])] for p in group["probes"]]
        lines += ["", tabulate(table, headers, tablefmt=fmt), ""]
    changed = {r: explain.cell(w) for r, w in group["what_changed"].items() if w}
    lines += [f"{item}what the first bad build changed, {r}: {c}" for r, c in changed.items()]
    return lines


def render_text(data: dict, fmt: str = "simple") -> str:
    head = [f"bisect over {len(data['builds'])} builds of {', '.join(data['ops'])}: {len(data['probes'])} probe(s)"
            + ("" if data["complete"] else " -- INCOMPLETE (interrupted): what was found so far; resume it")]
    skipped = [b for b in data["builds"] if b["status"] == "skipped"]
    item = "- " if fmt == "github" else ""
    head = [item + head[0], *(f"{item}skipped build {b['index']} ({b['label']}): {b['reason']}" for b in skipped)]
    mixed = mixed_machines(data)
    if mixed:
        head.append(item + mixed)
    body = []
    for group in data["groups"]:
        body += ["", *_group_lines(group, fmt)]
    return "\n".join(head + body)


def write(out_dir: Path, data: dict) -> list[Path]:
    md, js, html = out_dir / "bisect.md", out_dir / "bisect_report.json", out_dir / "bisect.html"
    rundir.atomic_write_text(md, "# Bisect report\n\n" + render_text(data, "github") + "\n")
    rundir.atomic_write_json(js, data)
    page = _JINJA.get_template("bisect_report.html.j2").render(
        data=data, build_text=build_text, ratio_text=ratio_text, cell=explain.cell, mixed=mixed_machines(data))
    rundir.atomic_write_text(html, page)
    return [md, js, html]
