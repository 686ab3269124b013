"""An A/B's ab.json read back (`read`): the fields its readers use checked for their types first (an A/B's
--continue, a bisect's --from-ab, a corpus A/B's resume and its corpus report), so a torn or edited
file is refused in one line naming the file and the field, not a KeyError or a TypeError deep in a
reader. The plan in it is checked only as far as a report reads it (its backend and repeats); a reader
that runs it checks it whole as a plan (harness.sessions.ab.plan.plan_from_data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core import bounded
from harness.core.errors import clip
from harness.core.options import AUTO, MAX_REPEATS, is_text, valid_max_repeats

AB_JSON = "ab.json"


# A step's fields and what each must be: (check, what it must be). `running` (the step under way) has
# no outcome yet: what, side, args, run_dir. What a reader only shows (what, side) may be left out.
STEP = {
    "what": (lambda v: v is None or is_text(v), "a string"),
    "side": (lambda v: v is None or is_text(v), "a side's name"),
    "args": (lambda v: isinstance(v, list) and bool(v) and all(is_text(a) for a in v), "a command line (strings)"),
    "run_dir": (lambda v: v is None or is_text(v), "a path or null"),
}
DONE = {
    "exit": (lambda v: v is None or type(v) is int, "an exit code or null"),
    "usable": (lambda v: isinstance(v, bool), "true or false"),
}
# The steps under way: the main thread's (`running`), and those of the threads beside it (a chunk's records
# and B's passes: `running_beside`, then `running_beside_2`, ... one a record job).
RUNNING, BESIDE = "running", "running_beside"


def beside_key(job: int) -> str:
    """The key of the step that record job `job` (0-based) runs beside the main thread's."""
    return BESIDE if job == 0 else f"{BESIDE}_{job + 1}"


def running_keys(state: dict) -> list[str]:
    """The keys of `state`'s steps under way: the main thread's first, then the jobs' beside it in order."""
    beside = sorted((k for k in state if k == BESIDE or (k.startswith(BESIDE + "_") and k[len(BESIDE) + 1:].isdigit())),
                    key=lambda k: 1 if k == BESIDE else int(k[len(BESIDE) + 1:]))
    return [*([RUNNING] if RUNNING in state else []), *beside]


def running_steps(state: dict) -> list[dict]:
    """The steps under way (running_keys), those set."""
    return [state[key] for key in running_keys(state) if state.get(key)]


PLAN = {
    "backend": (is_text, "a backend name"),
    # One a side too: a corpus report pairs an A/B of single runs (its basis says so).
    "repeats": (lambda v: v == AUTO or (type(v) is int and 1 <= v <= MAX_REPEATS), "a count of repeats or auto"),
}


def problem(state: Any, plan_needed: bool = True) -> str | None:
    """What is wrong with an ab.json's content, as `field = value is not WHAT`; None when nothing is.
    Its plan may be left out where `plan_needed` is false (a reader of its steps alone)."""
    if not isinstance(state, dict):
        return f"it is {clip(state)}, not a mapping"
    plan = state.get("plan")
    if plan is None and not plan_needed:
        plan = {"backend": "-", "repeats": 1}
    if not isinstance(plan, dict):
        return f"plan = {clip(plan)} is not a mapping"
    found = bounded.field_problem("plan", plan, PLAN, required=False)
    if found is not None:
        return found
    if plan.get("repeats") == AUTO and not valid_max_repeats(plan.get("max_repeats")):
        return f"plan.max_repeats = {clip(plan.get('max_repeats'))} is not a count of repeats"
    if not is_text(state.get("device_gate", "")):
        return f"device_gate = {clip(state['device_gate'])} is not a path"
    if not isinstance(state.get("complete", False), bool):
        return f"complete = {clip(state['complete'])} is not true or false"
    steps = state.get("steps", [])
    if not isinstance(steps, list):
        return f"steps = {clip(steps)} is not a list"
    checked = [(f"steps[{i}]", s, {**STEP, **DONE}) for i, s in enumerate(steps)]
    checked += [(key, state[key], STEP) for key in running_keys(state) if state.get(key) is not None]
    for where, step, fields in checked:
        if not isinstance(step, dict):
            return f"{where} = {clip(step)} is not a mapping"
        # Steps written before steps carried `usable` count exit 0 alone (reports.corpus).
        found = bounded.field_problem(where, step, {k: v for k, v in fields.items() if k != "usable" or k in step},
                                      required=False)
        if found is not None:
            return found
    return None


def read(path: Path | str, plan_needed: bool = True) -> dict:
    """The ab.json at `path`, read bounded and checked (problem); OSError as open raises it (a missing
    file), bounded.InputRefused (a ValueError, a UsageError: one line, exit 2) when it is no regular file
    or corrupt, json's ValueError when it is not JSON."""
    state = bounded.read_json(path, "ab.json")
    found = problem(state, plan_needed)
    if found is not None:
        raise bounded.InputRefused(f"{path} is corrupt: {found}")
    return state
