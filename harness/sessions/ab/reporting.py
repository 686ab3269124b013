"""The A/B's report: what it can conclude (validity: is the IR the same on both sides?), each op's
runs paired, judged and written (report), and the report's modules imported beside the first steps
(preload_reports)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import threading
import time
from pathlib import Path

import backends
from harness.core import launch, rundir
from harness.core.options import FDR
from harness.measure import ir, precompile

# What the report imports that the A/B's start does not: our report modules (numpy, jinja2: 0.25 s of the
# A/B's 0.44 s of imports on an H200 host, before any worker was begun), its statistics and its plot's
# matplotlib (with the Agg canvas its savefig picks; 1-2.5 s and 0.3-1 s).
REPORT_MODULES = ("reports.ab_report", "reports.corpus", "reports.explain", "scipy.stats", "matplotlib.figure",
                  "matplotlib.ticker", "matplotlib.backends.backend_agg")


# A chunk's ops' own reports, written this many at once, each in a process forked from the A/B: ~1 s an op on an
# H100 host (two matplotlib figures, most of it), one after another with the device idle (docs/performance.md,
# "At chunk 8").
REPORT_JOBS = 4


def preload_reports() -> threading.Thread:
    """The report's modules (REPORT_MODULES), imported in a thread beside the A/B's first steps (its
    record waits for a worker's imports anyway), not before them. Joined before the first timed
    step. A failed import here is the report's to raise when it imports the module itself."""
    thread = threading.Thread(target=_import_quietly, args=REPORT_MODULES, name="preload-reports", daemon=True)
    thread.start()
    return thread


def _import_quietly(*names: str) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # the report's own import raises it, where it is read
            pass


def validity(results: dict[str, dict[str, list[Path]]]) -> tuple[list[str], dict]:
    """Warnings about what the A/B can and cannot conclude, and the IR comparison per op."""
    from reports import compare

    warnings, per_op = [], {}
    for op, runs in results.items():
        if not runs["A"] or not runs["B"]:
            continue
        a, b = compare.profiled_runs(runs)
        if not ir.index_path(a).is_file() or not ir.index_path(b).is_file():
            per_op[op] = "IR not collected"
            continue
        rows = ir.compare(a, b)
        counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("identical", "changed", "only_in_a",
                                                                           "only_in_b")}
        per_op[op] = counts
    compared = {op: c for op, c in per_op.items() if isinstance(c, dict)}
    if compared and all(c["identical"] > 0 and c["identical"] == sum(c.values()) for c in compared.values()):
        warnings.append("the A/B axis changed NOTHING: both sides compiled byte-identical IR at every stage for "
                        "every launched kernel; a switch that no longer exists looks exactly like this")
    if any(c == "IR not collected" for c in per_op.values()):
        warnings.append("IR was not collected on some ops (see run.json observed.ir): cannot tell whether the "
                        "axis changed the generated code there")
    return warnings, per_op


def report(ab_dir: Path, groups: list[dict[str, list[Path]]], context: dict, warnings: list[str],
           backend_names: set[str], expected: int | None = None, fdr: float = FDR, schedule=None) -> int:
    """Pair and compare each group (one op's runs: its A repeats against its B repeats, each side's
    passes run, where it had one, for IR and kernels), then report them all;
    `expected` is the planned repeats per side, so a short side is flagged on every row. Verdicts
    are judged over all the groups' rows at once (compare.judge: calls at `fdr`). On a backend whose
    timings are not performance numbers the pipeline runs all the same, but every report says so at
    its top and calls no verdict. `schedule` (reports.sequential.Schedule): the rows were timed in
    rounds (--repeats auto), `expected` their first round's; judged look by look, each op's rows settled
    alone as the runner settled them (reports.sequential)."""
    from reports import ab_report, compare, corpus, corpus_html, explain, sequential, table

    given_warnings = list(warnings)  # the page finds the calls on identical IR itself

    not_measuring = sorted(n for n in backend_names if not backends.get(n).measures_performance)
    note = table.not_performance_note(", ".join(not_measuring)) if not_measuring else None
    paired = []
    for runs in groups:
        if runs["A"] or runs["B"]:
            profiled = compare.profiled_runs(runs)
            paired.append((*profiled, compare.pair(runs["A"], runs["B"], expected, performance=note is None,
                                                   profiled=profiled)))
    rows = [row for *_, op_rows in paired for row in op_rows]
    sequential.judge(rows, fdr, schedule)
    summary = compare.summarize(rows, fdr)
    if note is None:
        # The IR is compared between each side's profiled run, as the corpus report does.
        identical = corpus.identical_ir_rows([(a, b, op_rows) for a, b, op_rows in paired if a and b])
        calls = [r for r in identical if r.verdict in corpus.CALLS]
        if calls:
            warnings = [*warnings, corpus.identical_ir_line([r.label for r in calls])]
        checked = compare.calibration([r for r in identical if r.in_headline], summary.calls, fdr)
        if checked is not None:
            line, alarming = checked
            if alarming:
                warnings = [*warnings, line]
            else:
                context = {**context, "calibration": line}
    # What the FASTER/SLOWER rows' compiled code changed, between the same runs as the IR.
    what_changed = {key: record for a, b, op_rows in paired if a and b
                    for key, record in explain.for_runs(a, b, op_rows).items()}
    print()
    print(ab_report.render(rows, summary, warnings, context, note=note, what_changed=what_changed))
    files = ab_report.write(ab_dir, rows, summary, warnings, context, note, what_changed)
    # The same rows on the corpus report's page (filter, sort, each row's IR and what changed), offline.
    page = corpus.from_paired([(", ".join(dict.fromkeys(r.op for r in op_rows)), op_rows, a, b)
                               for a, b, op_rows in paired if op_rows], context, given_warnings, note, fdr,
                               schedule)
    files.append(ab_dir / "report.html")
    rundir.atomic_write_text(files[-1], corpus_html.render(page, corpus.headline(page)))
    print("report: " + ", ".join(str(f) for f in files))
    return 0 if rows and summary.headline_rows == summary.rows else 1


def op_reports(jobs: list[tuple[Path, dict[str, list[Path]], dict, list[str]]], backend_names: set[str],
               expected: int | None, fdr: float, schedule=None) -> list[Path]:
    """Each op's own report (its dir, its runs, context and warnings), as `report` writes it, up to REPORT_JOBS
    (and half the host's CPUs) at once, each in a forked process; the dirs whose report failed (its error on
    our stderr). A stop (Ctrl-C) ends those under way."""
    at_once = max(1, min(REPORT_JOBS, precompile.usable_cpus() // 2))
    pending, running, failed = list(jobs), [], []

    def write(op_dir, runs, context, warnings) -> int:
        with contextlib.redirect_stdout(io.StringIO()):  # the A/B's own report said it all
            report(op_dir, [runs], context, warnings, backend_names, expected, fdr, schedule)
        return 0

    try:
        while pending or running:
            while pending and len(running) < at_once:
                op_dir, runs, context, warnings = pending.pop(0)
                child = launch.start([f"report {op_dir}"], own_group=False, with_parent=False,
                                     call=functools.partial(write, op_dir, runs, context, warnings))
                running.append((op_dir, child))
            # Those that ended free their slots: a slow report holds its own, not the next op's.
            ended = [(op_dir, child, code) for op_dir, child in running if (code := child.wait(0)) is not None]
            if not ended:
                time.sleep(launch.FORK_POLL_S)
            for op_dir, child, code in ended:
                running.remove((op_dir, child))
                if code != 0:
                    failed.append(op_dir)
    finally:
        for _, child in running:  # a stop: none left writing
            child.kill()
            child.wait()
    return failed
