"""The engines' own lines (submitit's, Ray's) go to the batch's log, not to the terminal.

A batch's terminal shows zl_bench's lines only; what an executor's engine says about itself (its
retries of a status query, its banners) is kept in `batch.log` at the top of the batch dir, where
a person debugging the cluster side finds it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path

from harness.core import rundir

BATCH_LOG = "batch.log"  # at the top of a batch dir (each op's dir has its own)


@contextlib.contextmanager
def to_batch_log(batch_dir: Path, *loggers: str):
    """Within it, the named loggers ("" for the root) write to the batch's log only: their own
    handlers are set aside, and those they had before are put back after (any an engine added
    meanwhile go). Yields the log's stream, for what an engine prints to stderr itself."""
    stream = rundir.open_write(batch_dir / BATCH_LOG)
    stream.reconfigure(line_buffering=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved = []
    for name in loggers:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False
    try:
        yield stream
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers = handlers
            logger.propagate = propagate
        stream.close()


class _ByThread:
    """A stdout or stderr that passes on what the thread it was made in writes (ours: the batch's
    lines) and sends what any other thread writes (an engine's background printer) to the log."""

    def __init__(self, ours, log):
        self._ours, self._log, self._thread = ours, log, threading.current_thread()

    def _target(self):
        return self._ours if threading.current_thread() is self._thread else self._log

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name):  # isatty, fileno, encoding...: the terminal's
        return getattr(self._ours, name)


@contextlib.contextmanager
def other_threads_to(log):
    """Within it, what threads other than this one print goes to `log` (Ray's driver prints the
    errors its cluster publishes, a node marked dead say, from a thread of its own)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ByThread(sys.stdout, log), _ByThread(sys.stderr, log)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def note(batch_dir: Path, line: str) -> None:
    """One line of the driver's own into the batch's log (a job submitted, a cancel)."""
    with rundir.open_write(batch_dir / BATCH_LOG) as f:
        f.write(line.rstrip("\n") + "\n")
