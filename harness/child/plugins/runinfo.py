"""Run info: merge what this process observed into run.json: the device, versions, compiler
build identity at start; the timers actually used and the outcome at the end."""

from __future__ import annotations

import collections
import datetime as _dt
import platform
import socket
import sys

import pytest

from harness.core import identity, rundir
from harness.core.outcome import COMPLETE, INCOMPLETE, Outcome


class RunInfoPlugin:
    def __init__(self, ctx):
        self.ctx = ctx

    def _merge(self, facts: dict) -> None:
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": facts})

    def pytest_configure(self, config):
        backend = self.ctx.backend
        device = backend.identity() if backend.identity else {}
        self._merge({
            "started": _dt.datetime.now().isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "device": device,
            "versions": identity.versions(),
            "compiler": identity.compiler_identity(),
            "timer_policy": self.ctx.spec.timer if self.ctx.spec.timer != "auto" else backend.default_timer,
        })

    def pytest_sessionfinish(self, session, exitstatus):
        rows = self.ctx.rows
        timers = collections.Counter(r["timer"] for r in rows if r.get("timer"))
        statuses = collections.Counter(r["status"] for r in rows)
        self.ctx.outcome = outcome(self.ctx, session, exitstatus)
        self._merge({
            "finished": _dt.datetime.now().isoformat(timespec="seconds"),
            "exit_status": int(exitstatus),
            "timers_used": dict(timers),
            "statuses": dict(statuses),
            "rows": len(rows),
            "rows_with_markers": sum(1 for r in rows if r.get("markers")),
            "cases_planned": len(self.ctx.planned_ids or ()),
            "outcome": self.ctx.outcome.to_json(),
            "running_case": self.ctx.outcome.running_case,
        })


def outcome(ctx, session, exitstatus) -> Outcome:
    """COMPLETE when every planned case (RunContext.planned_ids: of a replay of some cases, those) reported
    one row, named by its id, and no row is of another case (a FlagGems benchmark's cases are known only
    as they run: there, unless its spec names them, when the session was not cut short), else
    INCOMPLETE and why; `exit_code` is what the run exits with (rundir's EXIT_ codes): the child's
    account, not pytest's exit status."""
    planned_ids = ctx.planned_ids
    planned = len(planned_ids) if planned_ids is not None else None
    done = len(ctx.rows)
    reason, code = ctx.stop_reason, ctx.stop_code
    # Before INTERRUPTED: a plugin that stops the session (a poisoned capture) exits with that status too.
    if reason is None and isinstance(session.shouldstop, str):
        reason = f"stopped: {session.shouldstop}"
    if reason is None and exitstatus == pytest.ExitCode.INTERRUPTED:
        reason = "interrupted"
    if reason is None and exitstatus == pytest.ExitCode.INTERNAL_ERROR:
        reason = "internal error (traceback in run.log)"
    if reason is None and exitstatus == pytest.ExitCode.USAGE_ERROR:
        reason = "pytest refused its arguments (see run.log)"
    if reason is None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        reason = "pytest collected no test (see run.log)"
    if reason is None and planned is not None:
        reason = _unaccounted(planned_ids, [row["case"] for row in ctx.rows])
    complete = reason is None
    if complete:
        # A teardown error fails the session without a row of its own.
        failed = exitstatus == pytest.ExitCode.TESTS_FAILED or any(r["status"] in ("FAILED", "ERROR") for r in ctx.rows)
        code = rundir.EXIT_FAILED_ROWS if failed else 0
    elif code is None:
        code = rundir.EXIT_INCOMPLETE
    return Outcome(COMPLETE if complete else INCOMPLETE, rows_done=done, rows_planned=planned, reason=reason,
                   running_case=None if complete else ctx.running_case, exit_code=code)


def _unaccounted(planned: list[str], reported: list[str]) -> str | None:
    """Why the rows reported (their case ids) are not one per planned case, None when they are. Ids, not
    counts: a case reported twice or under another name must not make up for one never reported."""
    plan, rows = collections.Counter(planned), collections.Counter(reported)
    extra = rows - plan
    problems = [(list(plan - rows), "planned case(s) never reported"),
                ([case for case in extra if case in plan], "case(s) reported more than once"),
                ([case for case in extra if case not in plan], "unplanned case(s) reported")]
    return "; ".join(f"{len(cases)} {what} ({_some(cases)})" for cases, what in problems if cases) or None


def _some(cases: list[str], shown: int = 3) -> str:
    return ", ".join(cases[:shown]) + (", ..." if len(cases) > shown else "")
