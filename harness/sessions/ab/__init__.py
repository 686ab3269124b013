"""The A/B experiment: side A records once (carrying A's IR and per-kernel attribution), B replays A's
configs once, untimed, for B's (its passes step), then both sides replay A's configs in separate
processes, interleaved A B A B ... for N repeats, so drift and heat hit both sides alike.

A side differs from the other by environment variables (a compiler switch) and/or a Python
interpreter (a second compiler build installed side by side). Every step's output goes to
ab.log; ab.json says what completed, so an interrupted A/B still reports what it has.

plan: the plan and its file; sides: a side's env and compiler key; steps: one step's process seen
from outside; runner: the steps of an A/B; reporting: its report; session: `python -m harness ab`.
Their public names are re-exported here, for `from harness.sessions import ab`.
"""

from harness.sessions.ab.plan import Plan, PlanError, Side, load_plan, plan_from_data
from harness.sessions.ab.reporting import preload_reports, report, validity
from harness.sessions.ab.runner import LOG_FILE, PREWARM_MAX_PER_SIDE, Runner
from harness.sessions.ab.session import resolve_plan, run_from_args, say_if_a_a
from harness.sessions.ab.sides import SideUnidentified, build_side_env, side_compiler_key
from harness.sessions.ab.steps import STEP_GRACE_S, StepInterrupted, went_through

__all__ = [
    "LOG_FILE", "PREWARM_MAX_PER_SIDE", "STEP_GRACE_S", "Plan", "PlanError", "Runner", "Side", "SideUnidentified",
    "StepInterrupted", "build_side_env", "load_plan", "plan_from_data", "preload_reports", "report", "resolve_plan",
    "run_from_args", "say_if_a_a", "side_compiler_key", "validity", "went_through",
]
