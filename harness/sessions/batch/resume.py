"""What a batch stores in batch.json for its resume, and how a resume reads it back: the stored
options with what the command line gives over them (`replace(stored, **given)`), and its selection."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.core import batchdir
from harness.core.commands import Selection
from harness.core.errors import UsageError
from harness.core.options import BatchOptions, RunOptions
from harness.providers.catalog import Entry
from harness.sessions.batch.options import Options

# batch.json written before its options took their fields' names (2026-12): read under the new ones.
RENAMED = {"ops_path": "ops_paths", "flaggems_dir": "flaggems_dirs"}

# What batch.json's request holds beside the options (which check themselves: harness.core.options).
STORED_CHECKS = {"selection": (batchdir.is_strings, "a list of [repo:]op[@op_file]")}


def resumed(stored: dict, given: RunOptions, given_batch: BatchOptions,
             where: Path) -> tuple[RunOptions, BatchOptions, str]:
    """The options a resume runs with: those stored in batch.json, with what the command line gives
    over them; and the line saying which came from where."""
    def refuse(name, value, what) -> UsageError:
        return batchdir.corrupt_field(where, name, value, what)

    kept, kept_batch = RunOptions.from_dict(stored, refuse), BatchOptions.from_dict(stored, refuse)
    names = {**given.given(), **given_batch.given()}
    from_file = kept.flags(but=names) + kept_batch.flags(but=names)
    from_cli = given.flags() + given_batch.flags()
    return (dataclasses.replace(kept, **given.given()), dataclasses.replace(kept_batch, **given_batch.given()),
            f"options from {batchdir.BATCH_JSON}: {' '.join(from_file) or 'none'}; "
            f"from the command line: {' '.join(from_cli) or 'none'}")


def stored_selection(given: Selection, stored: dict) -> str:
    n = len(stored.get("selection") or [])
    if given.given():
        return (f"the selection given on the command line ({batchdir.BATCH_JSON} keeps its {n} ops, and adds any "
                "new: a plain --resume runs those not done)")
    return f"the selection stored in {batchdir.BATCH_JSON} ({n} op{'s' * (n != 1)})"


# --- what a batch stores for its resume -----------------------------------------------------------
def stored_request(opts: Options, selected: list[Entry], triages: bool = True) -> dict:
    """The options and selection this batch ran with, as a resume reads them back (`resumed`);
    `triages`: whether the job takes --triage at all."""
    how = BatchOptions(devices=",".join(map(str, opts.devices)), op_timeout=opts.op_timeout,
                       replay_root=opts.replay_root,
                       triage=False if triages and not opts.triage else None,  # on, the default, is stored as null
                       op_start=None if opts.op_start == Options.op_start else opts.op_start)  # likewise
    return {**opts.run.to_dict(), **how.to_dict(), "selection": [e.id for e in selected]}
