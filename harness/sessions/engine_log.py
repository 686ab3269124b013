"""The engines' own lines (submitit's, Ray's) go to the batch's log, not to the terminal.

A batch's terminal shows zl_bench's lines only; what an executor's engine says about itself (its
retries of a status query, its banners) is kept in `batch.log` at the top of the batch dir, where
a person debugging the cluster side finds it.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

BATCH_LOG = "batch.log"  # at the top of a batch dir (each op's dir has its own)


@contextlib.contextmanager
def to_batch_log(batch_dir: Path, *loggers: str):
    """Within it, the named loggers write to the batch's log only (their own handlers are set
    aside, and put back after)."""
    handler = logging.FileHandler(batch_dir / BATCH_LOG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved = []
    for name in loggers:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False
    try:
        yield handler
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers = handlers
            logger.propagate = propagate
        handler.close()


def note(batch_dir: Path, line: str) -> None:
    """One line of the driver's own into the batch's log (a job submitted, a cancel)."""
    with open(batch_dir / BATCH_LOG, "a") as f:
        f.write(line.rstrip("\n") + "\n")
