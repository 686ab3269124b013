"""What a session asks of a `python -m harness record|replay` child: one frozen request, built once
where the session's own input is read (its options, an A/B plan, a run spec), and rendered back
into the command line harness/cli.py parses by `to_argv`, the one place that knows those flags."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

COMMANDS = ("record", "replay")
# Options only `record` takes (a replay keeps the recorded ones).
RECORD_ONLY = ("seed", "timer", "l2", "warmup_ms", "rep_ms", "sweep_devices")
# How a record measures: batch and A/B pass these to the records they start.
MEASUREMENT = ("seed", "timer", "l2", "warmup_ms", "rep_ms")
# How an A/B starts each step: forked by its side's warm worker (harness.core.forkserver), or fresh.
STEP_STARTS = ("fork", "fresh")
# Where an A/B's one-off passes (IR, per-kernel attribution) run: one untimed step per side, or every step.
STEP_PASSES = ("once", "every")


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """None (or empty) leaves an option out: the child then applies the command's own default."""

    command: str
    target: str | None = None  # record: the operator; replay: the run dir
    backend: str | None = None
    device: int | None = None
    shapes: Path | None = None
    dtypes: tuple[str, ...] | None = None
    ops_paths: tuple[str, ...] = ()
    flaggems_dirs: tuple[str, ...] = ()  # [NAME=]PATH
    level: str | None = None
    flagtune: str | None = None
    libtuner_cache: str | None = None
    seed: int | None = None
    timer: str | None = None
    l2: str | None = None
    warmup_ms: float | None = None
    rep_ms: float | None = None
    sweep_devices: int | None = None
    ir: bool = True
    timing_only: bool = False
    precompile: bool = True
    color: str | None = None
    out: Path | None = None
    # The run dir itself, which the child claims and the session reads back from (never a search of `out`).
    run_dir: Path | None = None
    triton_cache: Path | None = None  # compile into this dir, kept (None: the run's private one)

    def __post_init__(self) -> None:
        if self.command not in COMMANDS:
            raise ValueError(f"command {self.command!r} is not one of {COMMANDS}")
        if self.command == "replay":
            given = [name for name in RECORD_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(f"replay takes no {', '.join(given)}: it keeps the recorded ones")
        if self.out is not None and self.run_dir is not None:
            raise ValueError("out and run_dir: the run dir is named either under out or exactly, not both")
        if self.dtypes is not None and not self.dtypes:
            raise ValueError("dtypes: empty; None means the child's default")
        # Lists handed in become tuples: the request stays hashable and unchangeable.
        for name in ("dtypes", "ops_paths", "flaggems_dirs"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def to_argv(self) -> list[str]:
        """The arguments after `python -m harness`. The order is stable: logs show these lines."""
        argv = [self.command] + ([str(self.target)] if self.target is not None else [])
        # FlagGems' options lead, right after the target they qualify.
        for flag, value in (("--level", self.level), ("--flagtune", self.flagtune),
                            ("--libtuner-cache", self.libtuner_cache), ("--backend", self.backend),
                            ("--shapes", self.shapes)):
            if value is not None:
                argv += [flag, str(value)]
        if self.dtypes:
            argv += ["--dtypes", ",".join(self.dtypes)]
        for path in self.ops_paths:
            argv += ["--ops-path", path]
        for checkout in self.flaggems_dirs:
            argv += ["--flaggems-dir", checkout]
        for flag, value in (("--seed", self.seed), ("--timer", self.timer), ("--l2", self.l2),
                            ("--warmup-ms", self.warmup_ms),
                            ("--rep-ms", self.rep_ms), ("--sweep-devices", self.sweep_devices),
                            ("--device", self.device)):
            if value is not None:
                argv += [flag, str(value)]
        if not self.ir:
            argv.append("--no-ir")
        if self.timing_only:
            argv.append("--timing-only")
        if not self.precompile:
            argv.append("--no-precompile")
        for flag, value in (("--color", self.color), ("--out", self.out), ("--run-dir", self.run_dir),
                            ("--triton-cache", self.triton_cache)):
            if value is not None:
                argv += [flag, str(value)]
        return argv

    def command_line(self, python: str | None = None) -> list[str]:
        """The whole command: `python -m harness` (this interpreter unless another is named) and to_argv."""
        return [python or sys.executable, "-m", "harness", *self.to_argv()]
