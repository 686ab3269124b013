"""The human results table: columns that hold one value across every row are folded into a
legend line above the table, so the table shows only what varies."""

from __future__ import annotations

from tabulate import tabulate

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"
STATUS_COLOR = {"SUCCESS": GREEN, "FAILED": RED, "ERROR": RED, "SKIPPED": YELLOW}

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
)
FOLDABLE = ("op", "dtype", "shape", "timer", "status")
# Derived from timings as if they were performance numbers: left out where they are not.
PERFORMANCE_ONLY = ("speedup", "gbps", "tflops")


def not_performance_note(backend: str) -> str:
    """Said once at the top of every report on a backend whose timings are not performance numbers."""
    return (f"NOTE: backend '{backend}' exercises the pipeline only: its timings are not performance numbers "
            "(no speedups, bandwidths or verdicts)")


def _cell(row: dict, field: str):
    value = row.get(field)
    if field == "shape":
        return "x".join(str(d) for d in value) if value else ""
    if field == "markers":
        return len(value) if value else ""
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
    if len(rows) > 1:
        for field in FOLDABLE:
            values = {str(_cell(r, field)) for r in rows}
            if len(values) == 1:
                legend[field] = values.pop()
                columns = [c for c in columns if c[0] != field]
    table = []
    for row in rows:
        cells = [_cell(row, f) for f, _ in columns]
        if color and "status" in [f for f, _ in columns]:
            i = [f for f, _ in columns].index("status")
            cells[i] = f"{STATUS_COLOR.get(row['status'], '')}{cells[i]}{RESET}"
        table.append(cells)
    out = tabulate(table, headers=[h for _, h in columns], disable_numparse=True)
    if legend:
        out = "  ".join(f"{k}={v}" for k, v in legend.items()) + "\n" + out
    return note + out
