"""What a batch runs its ops with, resolved once its command line (or its batch.json) is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.core import batchdir
from harness.core.options import RunOptions, split_dir


@dataclasses.dataclass(frozen=True)
class Options:
    """What a batch runs its ops with, resolved: the backend's name, absolute paths, each FlagGems
    checkout as NAME=PATH. `run` is what each op's record is given (its device is the op's shard's);
    a replay from --replay-root keeps its record's."""

    run: RunOptions
    devices: list[int]
    op_timeout: float = batchdir.DEFAULT_OP_TIMEOUT
    replay_root: Path | None = None
    triage: bool = True  # rerun a failing FlagGems op as the bare upstream node
    op_start: str = "fork"  # a key of harness.core.options.OP_STARTS

    @property
    def backend(self) -> str:
        return self.run.backend

    @property
    def checkouts(self) -> dict[str, str]:
        """The FlagGems checkouts given, repo -> checkout."""
        return dict(split_dir(item) for item in self.run.flaggems_dirs)
