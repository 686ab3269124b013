"""What each `python -m harness` command is asked, parsed once, at the door: harness/cli.py turns the
parsed command line into one frozen request per command, made of the option sets harness.core.options
declares, and the session below reads the fields it needs from it (never the argparse namespace).
record and replay are asked by a RunRequest (harness.core.request), the very request a session gives
the child it starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.core.options import BatchOptions, BisectOptions, CorpusOptions, ExperimentOptions, RunOptions


@dataclasses.dataclass(frozen=True)
class Selection:
    """The ops a command line names: --ops, and the corpus options that select and sample
    (--all, --ops-file, --repos, --sample, --sample-seed)."""

    ops: tuple[str, ...] | None = None
    corpus: CorpusOptions = CorpusOptions()

    def given(self) -> bool:
        """Whether the command line names a selection (else a resume runs its stored one)."""
        return bool(self.corpus.all or self.ops or self.corpus.ops_file or self.corpus.repos)


@dataclasses.dataclass(frozen=True)
class BatchRequest:
    """`batch`: how its ops record (`run`), how the batch runs them (`how`), which ops, and where."""

    run: RunOptions = RunOptions()
    how: BatchOptions = BatchOptions()
    selection: Selection = Selection()
    out: Path | None = None
    summarize: Path | None = None  # only regenerate this batch dir's summary

    @property
    def corpus(self) -> CorpusOptions:
        """The selection's and the batch dir's options (--resume, --batch-dir, --executor ...)."""
        return self.selection.corpus


@dataclasses.dataclass(frozen=True)
class ABRequest:
    """`ab`: one A/B of a plan (its file, or --ops), the experiment and run options over the plan's;
    or `compare`, two run dirs compared."""

    plan: Path | None = None
    ops: tuple[str, ...] | None = None
    experiment: ExperimentOptions = ExperimentOptions()
    run: RunOptions = RunOptions()
    continue_from: tuple[Path, ...] = ()  # interrupted A/Bs whose completed steps are taken over
    compare: tuple[Path, Path] | None = None
    out: Path | None = None
    run_dir: Path | None = None  # the A/B dir itself (--run-dir), new or empty
    # (op, dir): each op's own A/B dir besides the A/B's, a single-op A/B's ab.json and report (--op-dir):
    # a corpus A/B's chunk of ops gives each op the dir its status row names.
    op_dirs: tuple[tuple[str, Path], ...] = ()
    # A batch option given makes it a corpus A/B (harness.sessions.corpus_ab.wanted): CorpusABRequest.of.
    corpus: CorpusOptions = CorpusOptions()
    how: BatchOptions = BatchOptions()


@dataclasses.dataclass(frozen=True)
class CorpusABRequest(BatchRequest):
    """`ab` with a batch option: the batch of it, and the A/B each op runs."""

    ab: ABRequest = ABRequest()

    @classmethod
    def of(cls, ab: ABRequest) -> CorpusABRequest:
        return cls(run=ab.run, how=ab.how, selection=Selection(ab.ops, ab.corpus), out=ab.out, ab=ab)


@dataclasses.dataclass(frozen=True)
class InventoryRequest:
    """`inventory-regen`."""

    check: bool = False
    flaggems_dirs: tuple[str, ...] | None = None
    verify_collect: bool = False
    migrate_shapes: Path | None = None
    out: Path | None = None


@dataclasses.dataclass(frozen=True)
class BisectRequest:
    """`bisect`: the builds and rows (`bisect`), each probe's A/B (`experiment`), how the rows record."""

    bisect: BisectOptions = BisectOptions()
    experiment: ExperimentOptions = ExperimentOptions()
    run: RunOptions = RunOptions()
    ops: tuple[str, ...] | None = None
    out: Path | None = None
    run_dir: Path | None = None  # the bisect dir itself (--run-dir)
