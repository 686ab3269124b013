"""Results: one row per measured case into results.json (rewritten after every row, so a crash
keeps the rows before it), a line per row as it lands, and the table at the end."""

from __future__ import annotations

import pytest

from harness.core.results import ResultRow, encode_row, write_results
from harness.providers import shapes
from reports import table

MAX_RAW_SAMPLES = 1000


def make_row(ctx, *, op, dtype, shape, params, case, status, nodeid, measurements=None, timer=None,
             input_sha256=None) -> dict:
    """One results.json row: the case, its baseline/candidate Measurements (either may be absent),
    the digest of its inputs (harness.child.plugins.seeds; None where the inputs were never built), and
    the markers and configs of the case now ending."""
    measurements = measurements or {}
    base, cand = measurements.get("baseline"), measurements.get("candidate")
    row = {"op": op, "dtype": dtype, "shape": shape, "params": params, "case": case, "status": status,
           "baseline_ms": base.latency_ms if base else None, "candidate_ms": cand.latency_ms if cand else None,
           "speedup": base.latency_ms / cand.latency_ms if base and cand and cand.latency_ms > 0 else None,
           "timer": timer, "measures_performance": ctx.backend.measures_performance, "input_sha256": input_sha256}
    if measurements:
        row["samples"] = {side: {**m.summary(), "raw": m.samples_ms[:MAX_RAW_SAMPLES]}
                          for side, m in measurements.items()}
    row.update(markers=list(ctx.markers), configs=dict(ctx.configs), nodeid=nodeid)
    return row


class ResultsPlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hook = None  # pytest's hook relay, set at configure (harness.child.hookspec)
        self._pending: dict | None = None
        self._encoded: list[str] = []  # ctx.rows as written, typed and encoded once each

    def pytest_configure(self, config):
        self.hook = config.hook
        self._flush()

    @pytest.fixture
    def record_row(self):
        def record(timed, metrics):
            self._pending = {"timed": timed, "metrics": metrics}

        return record

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        case = item.callspec.params.get("case") if hasattr(item, "callspec") else None
        if case is not None:
            self.ctx.begin_case(item.config.hook, case.id, shapes.label(case.shape))
        else:
            self.ctx.begin_case(item.config.hook, item.name)
        self._pending = None

    def pytest_runtest_logreport(self, report):
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        if self.ctx.operator is not None:
            self._add_row(report)
        elif not report.passed:
            # A FlagGems benchmark's rows arrive from its own loop (harness.child.plugins.flaggems); what
            # pytest reports here is the case that failed or a test skipped as a whole.
            case = self.ctx.case_id or report.nodeid
            row = make_row(self.ctx, op=self.ctx.spec.op, dtype=None, shape=[case], params={}, case=case,
                           status=self._status(report), nodeid=report.nodeid)
            self.add_row({**row, "error": self._error(report)})

    def _add_row(self, report):
        case = self._case_of(report)
        pending = self._pending if report.passed else None
        timed = pending["timed"] if pending else None
        row = make_row(self.ctx, op=self.ctx.operator.name, dtype=case.dtype if case else None,
                       shape=list(case.shape) if case else None, params=self._params(case),
                       case=case.id if case else report.nodeid, status=self._status(report), nodeid=report.nodeid,
                       measurements=timed.measurements if timed else None, timer=timed.timer if timed else None)
        row.update(pending["metrics"] if pending else {})
        if not report.passed:
            raised = f"{self.ctx.running} raised " if report.failed and self.ctx.running else ""
            row["error"] = raised + self._error(report)
        self.add_row(row)

    def add_row(self, row: dict) -> None:
        with self.ctx.landing():
            self.hook.pytest_zl_row_ready(row=row)
            self.ctx.rows.append(row)
            self.ctx.end_case()
            self._flush(durable=False)  # whole if the process dies; on disk for good as the run ends
        self._print_row(row)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        self._flush()

    def update_rows(self) -> None:
        """Rows already added were enriched in place (FlagGems: upstream metrics per dtype)."""
        self._encoded.clear()
        self._flush()

    def pytest_report_teststatus(self, report, config):
        # Our own line per row replaces pytest's progress letters, which would interleave with it.
        if report.when == "call" or (report.when == "setup" and not report.passed):
            return report.outcome, "", report.outcome.upper()
        return None

    def _case_of(self, report):
        for case in self.ctx.cases:
            if report.nodeid.endswith(f"[{case.id}]"):
                return case
        return None

    def _params(self, case) -> dict:
        if case is None:
            return {}
        dims = self.ctx.operator.dims
        if dims and len(dims) == len(case.shape):
            return dict(zip(dims, case.shape, strict=False))
        return {"shape": shapes.label(case.shape)}

    @staticmethod
    def _status(report) -> str:
        if report.skipped:
            return "SKIPPED"
        if report.passed:
            return "SUCCESS"
        return "FAILED" if report.when == "call" else "ERROR"

    @staticmethod
    def _error(report) -> str:
        if report.skipped and isinstance(report.longrepr, tuple):  # (file, line, "Skipped: reason")
            return str(report.longrepr[2]).removeprefix("Skipped: ")[:2000]
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            return crash.message[:2000]
        return str(report.longrepr)[-2000:]

    def _flush(self, durable: bool = True) -> None:
        # Typed on the way out, so a row a plugin got wrong stops the run here rather than every
        # report that reads it later. The rows stay dicts until then: plugins add to a row while
        # it lands (pytest_zl_row_ready) and FlagGems after it (update_rows, which has them all
        # typed again). Each row is typed and encoded once, not on every rewrite of the file.
        for i in range(len(self._encoded), len(self.ctx.rows)):
            self._encoded.append(encode_row(ResultRow.from_dict(self.ctx.rows[i], f"writing results.json: row {i}")))
        write_results(self.ctx.run_dir, self._encoded, durable)

    def _print_row(self, row) -> None:
        n, total = len(self.ctx.rows), len(self.ctx.cases) or "?"
        if row["status"] == "SUCCESS":
            # A FlagGems benchmark may time one side only (its metrics list decides).
            fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
            # A speedup is a performance claim: where timings are not performance numbers, the timings only.
            speedup = f"{fmt(row['speedup'], '.3f')}x  " if self.ctx.backend.measures_performance else ""
            detail = (f"baseline {fmt(row['baseline_ms'], '.4f')} ms  candidate {fmt(row['candidate_ms'], '.4f')} ms  "
                      f"{speedup}timer={row['timer']}")
        else:
            detail = row.get("error", "").splitlines()[0][:160] if row.get("error") else ""
        lines = [f"[{n}/{total}] {row['op']} {row['case']} {table.paint(row['status'], self.ctx.spec.color)} {detail}"]
        lines += [f"    {marker}" for marker in row["markers"]]
        self.write_lines(lines)

    def write_lines(self, lines: list[str]) -> None:
        """Live to the user (and so into run.log), even from inside a running test."""
        self.ctx.say(*lines)

    def pytest_terminal_summary(self, terminalreporter):
        # Said to the user, not through pytest's reporter (whose output is kept in run.log only).
        context = {"backend": self.ctx.spec.backend, "mode": self.ctx.spec.mode}
        outcome = self.ctx.outcome
        if outcome is not None and not outcome.complete:
            # First in the header: a table over some of the cases must not read as the run's result.
            context = {"run": f"INCOMPLETE {outcome.rows()}", **context}
        self.ctx.say("=" * 30 + " results " + "=" * 30,
                     table.render(self.ctx.rows, color=self.ctx.spec.color, context=context,
                                  performance=self.ctx.backend.measures_performance))
        # A degraded measurement is a number with a marker: a skipped row (its marker says why it was
        # skipped) measured nothing, and is counted apart.
        degraded = sum(1 for r in self.ctx.rows if r["markers"] and r["status"] != "SKIPPED")
        if degraded:
            self.ctx.say(f"{degraded} row(s) carry markers (degraded measurement); see results.json")
