"""What a finished (or killed) attempt left to read: its run's rows and recorded outcome, whether it
rejected the dtypes asked for, the error line of its log, upstream pytest's one line, where a timed-out
one was. A rejection is a fact, not log text: our own is the exit code of DtypeRejected, FlagGems' is
run.json's `observed.dtype_rejected` (see `dtype_rejected`)."""

from __future__ import annotations

from pathlib import Path

from harness.core import bounded, rundir
from harness.core.errors import DtypeRejected
from harness.core.outcome import Outcome
from harness.core.results import read_results


def run_facts(run_dir: Path | None) -> dict:
    if run_dir is None or not (run_dir / rundir.RESULTS_JSON).is_file():
        return {"rows": 0, "timer": "", "timer_fallback_rows": 0, "replay_fallback_rows": 0, "statuses": {},
                "skip_reason": ""}
    rows = read_results(run_dir)
    timers = sorted({r.timer for r in rows if r.timer})
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {"rows": len(rows), "timer": "+".join(timers),
            "timer_fallback_rows": sum(1 for r in rows if any(m.startswith("TIMER_FALLBACK") for m in r.markers)),
            "replay_fallback_rows": sum(1 for r in rows
                                        if any(m.startswith("AUTOTUNE_REPLAY_FALLBACK") for m in r.markers)),
            "statuses": statuses,
            "skip_reason": next((r.error for r in rows if r.status == "SKIPPED" and r.error), "")}

def recorded_outcome(run_dir: Path) -> Outcome | None:
    """The outcome the run recorded in its run.json, or None (no run dir, none recorded)."""
    try:
        return Outcome.from_json(rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {}).get("outcome"))
    except (OSError, ValueError, AttributeError):
        return None


def dtype_rejected(code: int, run_dir: Path | None) -> bool:
    """Whether the attempt failed because the op does not take the dtypes asked for: ours is said
    by DtypeRejected's exit code (before any run dir exists), FlagGems' own by the child in its
    run.json (`observed.dtype_rejected`)."""
    if code == DtypeRejected.exit_code:
        return True
    if run_dir is None:
        return False
    try:
        return rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {}).get("dtype_rejected") is True
    except (OSError, ValueError):
        return False


def error_line(log_path: Path) -> str:
    """The `error: ...` line the last attempt printed into the op's log (what refused it), else a
    pointer to the log. Each attempt's output starts at its `$ command` line (launch.start)."""
    lines = bounded.read_tail(log_path).splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith("$ ")), default=-1)
    found = next((line for line in reversed(lines[last + 1:]) if line.startswith("error: ")), None)
    return found[len("error: "):].strip()[:300] if found else f"see {log_path.name}"


def pytest_line(log_path: Path, code: int) -> str:
    """What a pytest log says in one line: its first error (an `E   ` line, else a FAILED or ERROR
    summary line) when it failed, its final summary line (`1 passed in 0.1s`) when it passed."""
    lines = [line.strip() for line in bounded.read_tail(log_path).splitlines() if line.strip()]
    if code != 0:
        for prefix in ("E ", "FAILED ", "ERROR "):
            found = next((line for line in lines if line.startswith(prefix)), None)
            if found:
                return found[1:].strip() if prefix == "E " else found
    return lines[-1].strip("= ") if lines else f"pytest exited {code}"


def killed_during(run_dir: Path) -> str:
    """Where a timed-out attempt was when it was killed, from its run.json: `observed.running_case`,
    which the child sets as each case starts and clears once it finished normally (or the same in
    the outcome it wrote as it stopped)."""
    if not (run_dir / rundir.RUN_JSON).is_file():
        return "before its run dir was written (the op never started a case)"
    observed = rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {})
    case = observed.get("running_case") or (observed.get("outcome") or {}).get("running_case")
    if case:
        return f"during case {case}"
    rows = run_facts(run_dir)["rows"]
    return f"with no case running ({rows} row{'s' * (rows != 1)} done)" if rows else "before its first case started"


def killed_note(run_dir: Path, log_path: Path, what: str) -> None:
    """Say in the op's batch.log, and in the killed run's own run.log, why it stopped there."""
    run_log = run_dir / rundir.RUN_LOG
    for log in [log_path, *([run_log] if run_log.is_file() else [])]:
        with rundir.open_write(log) as f:
            f.write(f"\nkilled by the batch's --op-timeout: {what}\n")
