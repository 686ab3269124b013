"""The child's two output streams. Lines for the user (rows, markers, sweeps, the results table,
one-line errors) go to the user stream, which the parent shows and logs; everything else written
to stdout or stderr (pytest's own reporting, tracebacks, compiler chatter) goes to the parent on
stderr and is kept in run.log only, so the terminal carries our words, not pytest's."""

from __future__ import annotations

import os
import sys
from typing import TextIO


class Console:
    def __init__(self, stream: TextIO):
        self.stream = stream

    @classmethod
    def split_stdout(cls) -> Console:
        """Keep a private handle on stdout for the user's lines, then point file descriptor 1 at
        stderr. Done at the level of descriptors, so pytest's output capture (which swaps fds 1
        and 2 around each test) never holds back a row line printed while a test runs."""
        user = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
        os.dup2(2, 1)
        return cls(user)

    def say(self, *lines: str) -> None:
        for line in lines:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """The user stream's descriptor released: a measuring host's next run must not keep this run's
        step waiting for the end of its output (harness.child.host)."""
        if self.stream not in (None, sys.stdout, sys.stderr):
            self.stream.close()
