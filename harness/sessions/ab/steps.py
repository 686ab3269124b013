"""One step of an A/B (a record or a replay, a process of its own), seen from the runner: its
arguments as a continuation compares them, its progress line per case, whether a failed one still went
through every case, and its interruption."""

from __future__ import annotations

import re
from pathlib import Path

from harness.core import launch, rundir
from harness.core import spec as spec_mod
from harness.core.outcome import Outcome

STEP_GRACE_S = 30  # for an interrupted step to write its results and summary


def same_args(argv: list[str]) -> tuple[str, ...]:
    """A step's arguments less what each A/B names afresh (its run dir, its sides' caches, hosts and device
    gate): equal for the same step of an A/B and of its continuation, down to the record a replay replays and
    its cases."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--run-dir", "--triton-cache", "--measuring-host", "--device-gate"):
            skip = True
        else:
            out.append(arg)
    return tuple(out)


class StepInterrupted(launch.Stopped):
    """A Ctrl-C or a SIGTERM reached the A/B during a step, went on to the step, and the step has
    stopped."""


ROW_LINE = re.compile(r"\[(\d+)/(\d+|\?)\] ")  # a run's line per case as its row lands (results plugin)


def case_progress(line: str) -> None:
    """A step's cases as they land, `1/4 2/4 ...` after its `... A records ...` line: a record or
    replay of big shapes (or on the interpreter) takes minutes, and a silent one looks hung."""
    found = ROW_LINE.match(line)
    if found:
        print(f" {found[1]}/{found[2]}", end="", flush=True)


def went_through(run_dir: Path) -> bool:
    """Whether a run that exited non-zero still ran every case (its outcome COMPLETE): some rows
    failed, and those rows are results an A/B must show, e.g. B computing wrong answers."""
    try:
        outcome = Outcome.from_json(spec_mod.read_run(run_dir)[1].get("outcome"))
    except ValueError:  # a SpecError, or no outcome recorded
        return False
    return outcome.complete and (run_dir / rundir.RESULTS_JSON).is_file()
