"""The human results table: columns that hold one value across every row are folded into a
legend line above the table, so the table shows only what varies. Where any row did not succeed,
the status stays a column and an error column says why. Rows profiled per kernel (results.json
`kernels`) get their top kernels in a second table below."""

from __future__ import annotations

import collections

from tabulate import tabulate

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"
STATUS_COLOR = {"SUCCESS": GREEN, "FAILED": RED, "ERROR": RED, "SKIPPED": YELLOW}



def paint(status: str, color: bool) -> str:
    """A row status in its colour, on a terminal that wants colour."""
    return f"{STATUS_COLOR.get(status, '')}{status}{RESET}" if color and status in STATUS_COLOR else status


COLUMNS = (
    ("status", "status"),
    ("op", "op"),
    ("dtype", "dtype"),
    ("shape", "shape"),
    ("baseline_ms", "baseline ms"),
    ("candidate_ms", "candidate ms"),
    ("speedup", "speedup"),
    ("gbps", "GB/s"),
    ("tflops", "TFLOP/s"),
    ("timer", "timer"),
    ("markers", "markers"),
    ("error", "error"),
)
FOLDABLE = ("op", "dtype", "shape", "timer", "status")
# Derived from timings as if they were performance numbers: left out where they are not.
PERFORMANCE_ONLY = ("speedup", "gbps", "tflops")
ERROR_WIDTH = 60
TOP_KERNELS = 3
KERNEL_NAME_WIDTH = 40


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def marker_names(markers: list[str]) -> str:
    """Markers by name, their details left to results.json: 'TIMER_FALLBACK, AUTOTUNE_REPLAY_FALLBACK x2'."""
    counts = collections.Counter(m.split()[0].rstrip(":") for m in markers if m.strip())
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


def kernels_cell(kernels: list[dict] | None, top: int = TOP_KERNELS) -> str:
    """The top kernels by share of the profiled time: 'softmax_kernel 91% (x2), elementwise 9%'
    (xN: launches per call, when not 1), '+N more' for the rest."""
    if not kernels:
        return ""
    parts = []
    for k in kernels[:top]:
        launches = k.get("launches_per_call")
        calls = f" (x{launches:g})" if launches not in (None, 1) else ""
        parts.append(f"{_clip(str(k['name']), KERNEL_NAME_WIDTH)} {100 * k['share']:.0f}%{calls}")
    if len(kernels) > top:
        parts.append(f"+{len(kernels) - top} more")
    return ", ".join(parts)


# The flag on every table row whose timings are not performance numbers (with the note atop the table):
# a row copied out of a report still says so.
NOT_PERFORMANCE = "NOT_PERFORMANCE"


def not_performance_note(backend: str) -> str:
    """Said once at the top of every report on a backend whose timings are not performance numbers."""
    return (f"NOTE: backend '{backend}' exercises the pipeline only: its timings are not performance numbers "
            "(no speedups, bandwidths or verdicts)")


def markdown_list(lines: list[str]) -> list[str]:
    """Terminal lines as a Markdown list, one item each: CommonMark joins adjacent plain lines into one
    paragraph. A line indented under the one before (`  softmax: ...`) becomes a nested item."""
    return [f"{line[:len(line) - len(line.lstrip())]}- {line.lstrip()}" for line in lines]


def _cell(row: dict, field: str):
    value = row.get(field)
    if field == "shape":
        return "x".join(str(d) for d in value) if value else ""
    if field == "markers":
        return marker_names(value) if value else ""
    if field == "error":
        return _clip(str(value).strip().splitlines()[0], ERROR_WIDTH) if value and str(value).strip() else ""
    if field == "speedup" and value is not None:
        return f"{value:.3f}x"
    if isinstance(value, float):
        return f"{value:.4f}" if field.endswith("_ms") else f"{value:.1f}"
    return "" if value is None else value


def render(rows: list[dict], color: bool = False, context: dict | None = None, performance: bool = True) -> str:
    """`performance`: whether the backend's timings are performance numbers; if not, a note says so
    and no column derived from them (speedup, GB/s, TFLOP/s) is shown."""
    note = "" if performance else not_performance_note((context or {}).get("backend", "?")) + "\n"
    if not rows:
        return note + "no rows"
    columns = [c for c in COLUMNS if any(_cell(r, c[0]) != "" for r in rows)
               and (performance or c[0] not in PERFORMANCE_ONLY)]
    legend = dict(context or {})
    # A run with a row that did not succeed keeps its status column, even if every row shares it.
    foldable = FOLDABLE if all(r.get("status") == "SUCCESS" for r in rows) else tuple(
        f for f in FOLDABLE if f != "status")
    if len(rows) > 1:
        for field in foldable:
            values = {str(_cell(r, field)) for r in rows}
            if len(values) == 1:
                legend[field] = values.pop()
                columns = [c for c in columns if c[0] != field]
    if "status" in legend:  # folded: a clean run's one status, coloured in the legend
        legend["status"] = paint(legend["status"], color)
    table = []
    for row in rows:
        cells = [_cell(row, f) for f, _ in columns]
        if "status" in [f for f, _ in columns]:
            i = [f for f, _ in columns].index("status")
            cells[i] = paint(cells[i], color)
        table.append(cells)
    out = tabulate(table, headers=[h for _, h in columns], disable_numparse=True)
    if legend:
        out = "  ".join(f"{k}={v}" for k, v in legend.items()) + "\n" + out
    profiled = [r for r in rows if r.get("kernels")]
    if profiled:
        out += "\n\n" + tabulate([[r.get("case") or _cell(r, "shape"), kernels_cell(r["kernels"])] for r in profiled],
                                 headers=["case", f"top kernels (share of profiled time, top {TOP_KERNELS})"],
                                 disable_numparse=True)
    return note + out
