"""What a session asks of a `python -m harness record|replay` child: one frozen request, built once
where the session's own input is read (its options, an A/B plan, a run spec), and rendered back
into the command line harness/cli.py parses by `to_argv`. The options a session passes on are one
`RunOptions` (harness.core.options, where each flag is declared); the rest is the run's own."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from harness.core.options import RunOptions, declared
from harness.core.spec import cases_refusal, only_refusal

COMMANDS = ("record", "replay")


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """None leaves an option out: the child then applies the command's own default."""

    command: str
    target: str | None = None  # record: the operator; replay: the run dir
    options: RunOptions = RunOptions()
    sweep_devices: int | None = None  # record only
    ir: bool = True
    only: str | None = None  # a key of spec.ONLY: what the run is for, where not everything
    precompile: bool = True
    color: str | None = None
    out: Path | None = None
    # The run dir itself, which the child claims and the session reads back from (never a search of `out`).
    run_dir: Path | None = None
    triton_cache: Path | None = None  # compile into this dir, kept (None: the run's private one)
    cases: tuple[str, ...] | None = None  # replay: only these cases of the record (RunSpec.cases); None: all
    # Its child runs in the measuring host listening at this socket (an A/B's chunk: harness.child.host),
    # not in a process of its own. How the step runs, not what it measures: its spec does not say it.
    measuring_host: Path | None = None
    # The device gate it shares its device through (RunSpec.device_gate): an A/B's, whose next ops' records
    # and passes run beside its timed repeats.
    device_gate: Path | None = None

    def __post_init__(self) -> None:
        if self.command not in COMMANDS:
            raise ValueError(f"command {self.command!r} is not one of {COMMANDS}")
        if self.command == "replay":
            given = [f.name for f, meta in declared(self.options) if meta.record_only
                     and getattr(self.options, f.name) is not None]
            given += ["sweep_devices"] if self.sweep_devices is not None else []
            if given:
                raise ValueError(f"replay takes no {', '.join(given)}: it keeps the recorded ones")
        refusal = only_refusal(self.only, self.command) or cases_refusal(
            None if self.cases is None else list(self.cases), self.command)
        if refusal is not None:
            raise ValueError(refusal)
        if self.out is not None and self.run_dir is not None:
            raise ValueError("out and run_dir: the run dir is named either under out or exactly, not both")
        if self.options.dtypes is not None and not self.options.dtypes:
            raise ValueError("dtypes: empty; None means the child's default")

    def to_argv(self) -> list[str]:
        """The arguments after `python -m harness`. The order is stable: logs show these lines."""
        argv = [self.command] + ([str(self.target)] if self.target is not None else [])
        argv += self.options.to_argv()
        if self.sweep_devices is not None:
            argv += ["--sweep-devices", str(self.sweep_devices)]
        if not self.ir:
            argv.append("--no-ir")
        if self.only is not None:
            argv.append(f"--{self.only}-only")
        if not self.precompile:
            argv.append("--no-precompile")
        for case in self.cases or ():
            argv += ["--case", case]
        for flag, value in (("--color", self.color), ("--out", self.out), ("--run-dir", self.run_dir),
                            ("--triton-cache", self.triton_cache), ("--measuring-host", self.measuring_host),
                            ("--device-gate", self.device_gate)):
            if value is not None:
                argv += [flag, str(value)]
        return argv

    def command_line(self, python: str | None = None) -> list[str]:
        """The whole command: `python -m harness` (this interpreter unless another is named) and to_argv."""
        return [python or sys.executable, "-m", "harness", *self.to_argv()]
