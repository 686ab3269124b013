"""How a run ended: the outcome its child (or, when the child could not, its parent) records in
run.json's `observed.outcome`, and what a batch, a replay and the run's own last line read back.

Written by four hands (the child's end of session, the child's immediate stop, the parent's
account of a child that died, a stopped sweep): all build an Outcome, so the JSON is one shape.
"""

from __future__ import annotations

import dataclasses

COMPLETE = "COMPLETE"  # every planned case ran (some rows may have failed)
INCOMPLETE = "INCOMPLETE"
STATUSES = (COMPLETE, INCOMPLETE)


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str
    rows_done: int | None = None
    rows_planned: int | None = None  # None: not known (a FlagGems benchmark's cases are known as they run)
    reason: str | None = None  # why it is INCOMPLETE
    running_case: str | None = None  # the case it was in when it stopped
    exit_code: int | None = None  # what the run exits with (rundir's EXIT_ codes, 128+N for signal N)

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data) -> Outcome:
        """ValueError when `data` is not an outcome (an object whose status is COMPLETE or
        INCOMPLETE); a field it lacks is None (a record written by hand, or before it was kept)."""
        if not isinstance(data, dict) or data.get("status") not in STATUSES:
            raise ValueError(f"{data!r:.80} is not an outcome (status {' or '.join(STATUSES)})")
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})

    def rows(self, planned: int | None = None) -> str:
        """`13/20`, the planned count `?` when neither the outcome nor `planned` knows it."""
        return f"{self.rows_done}/{self.rows_planned or planned or '?'}"

    def during(self) -> str:
        """` during case X` when it stopped in a case, else ""."""
        return f" during case {self.running_case}" if self.running_case else ""
