"""The search of a bisect, as pure functions of what its probes said.

Each row keeps the interval its move lies in: `lo`, the last build seen good (its verdict SAME
against the good build, build 0), and `hi`, the first build seen bad (moved in the row's direction),
or `n` (one past the last build) where no build has been seen bad yet. A probe at build k narrows
every open row whose interval holds k, so rows that moved together are bisected together, and split
when a probe's verdicts part them: a group is the rows of one interval. The next probe is the middle
of the largest group's interval, the builds it cannot test (not built, not importable, or no verdict
for that row there) left out, as `git bisect skip` leaves them. A row not yet seen bad anywhere (`--ops`
rows) is probed at the last build first: a row that did not move there is done after one probe, and
one that moved has its first bad build and the size of its move.

A called verdict is read as it is: SAME is good, the row's direction (FASTER or SLOWER) is bad. A
NOISY one is read by the size of the move searched for, once a build has shown it (`bad_ratio`): the
question at build k is not "did it change by 1%" but "is it still where the good build was, or where
the bad one is". Its interval lying wholly on one side of the half-way point (the geometric mean of 1
and the bad B/A) says which; a 1.7x move is found past a 2% noise that no repeats resolve. Otherwise
the probe is run again at twice the repeats, up to `max_repeats`, and a row still NOISY there cannot be
tested at that build. A move the other way is not the move searched for: that build is untestable for
the row too. A row never seen bad whose last build stays NOISY is not searched further (undecided).

The search stays right where a probe could be wrong by confirming each boundary at the end: an A/B of
the last good build against the first bad one (both replaying the good build's record). A row whose
confirm does not call its move there is reported unconfirmed, never as found.

State is recomputed from the probes done, in order (`replay`), so a resume asks for the same next
probe as the interrupted run would have, and runs none of the done ones again.
"""

from __future__ import annotations

import dataclasses
import math

FASTER, SLOWER, SAME, NOISY = "FASTER", "SLOWER", "SAME", "NOISY"
MOVES = (FASTER, SLOWER)
SEARCH, CONFIRM = "search", "confirm"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One A/B to run: build `a` against build `b`, for the rows named (each replaying the good
    build's record)."""

    kind: str  # SEARCH (a is build 0) or CONFIRM (a is the last good build, b the first bad)
    a: int
    b: int
    repeats: int
    rows: tuple[str, ...]

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rows": list(self.rows)}


@dataclasses.dataclass
class Row:
    """One row's search: its op, the direction it moved, and the interval its move lies in."""

    id: str
    op: str
    lo: int
    hi: int
    direction: str | None = None  # FASTER or SLOWER; None until a probe (or the A/B it came from) says
    bad_ratio: float | None = None  # B/A where the move was called: the size of the move searched for
    untestable: dict[int, str] = dataclasses.field(default_factory=dict)  # build -> why no verdict there
    seen: list[dict] = dataclasses.field(default_factory=list)  # per probe that judged it
    confirmed: bool | None = None  # the boundary's final A/B called the move (None: not run yet)

    def candidates(self, skipped: dict[int, str], n: int) -> list[int]:
        """The builds still to test for this row: strictly inside its interval, testable. None for a row
        never seen bad whose latest testable build could not be told (walking down from it would spend
        a probe per build on a row that may not have moved at all)."""
        left = [k for k in range(self.lo + 1, min(self.hi, n)) if k not in skipped]
        if self.hi >= n and left and max(left) in self.untestable:
            return []
        return [k for k in left if k not in self.untestable]

    def moved(self, n: int) -> bool:
        return self.hi < n


@dataclasses.dataclass
class Search:
    n: int  # builds, in order; build 0 is the good one
    rows: dict[str, Row]
    repeats: int
    max_repeats: int
    skipped: dict[int, str] = dataclasses.field(default_factory=dict)  # builds that did not build or import
    done: list[dict] = dataclasses.field(default_factory=list)  # probe results, in order

    def skip(self, build: int, reason: str) -> None:
        """A build the search cannot test. A row that was only assumed bad there (the last build, for a
        row from an A/B) is searched over the whole list instead."""
        self.skipped[build] = reason
        for row in self.rows.values():
            if row.hi == build:
                row.hi = self.n

    def open_rows(self) -> list[Row]:
        return [r for r in self.rows.values() if r.candidates(self.skipped, self.n)]

    def groups(self) -> list[list[Row]]:
        """Rows of one interval (and so one set of builds left to test) together, largest group first."""
        by_interval: dict[tuple, list[Row]] = {}
        for row in self.open_rows():
            by_interval.setdefault((row.lo, row.hi, tuple(row.candidates(self.skipped, self.n))), []).append(row)
        return sorted(by_interval.values(), key=lambda g: (-len(g), g[0].lo))


def new(n: int, rows: list[dict], repeats: int, max_repeats: int) -> Search:
    """A search over `n` builds. Each row: {"id", "op", "direction"}; a row whose direction is known
    (it came from an A/B of the good build against the last) has the last build as its first bad one."""
    if n < 2:
        raise ValueError("a bisect needs at least two builds: the good one and one to test")
    made = {}
    for r in rows:
        direction = r.get("direction")
        made[r["id"]] = Row(r["id"], r["op"], 0, n - 1 if direction else n, direction,
                            r.get("ratio") if direction else None)
    return Search(n, made, repeats, max_repeats)


def apply(search: Search, result: dict) -> None:
    """What one probe said (its `probe` and `verdicts`: row id -> {"verdict", "ratio"}) into the rows."""
    probe = result["probe"]
    search.done.append(result)
    for row_id in probe["rows"]:
        row = search.rows[row_id]
        said = result["verdicts"].get(row_id) or {"verdict": "UNPAIRED", "ratio": None}
        verdict = said["verdict"]
        inside = probe["kind"] == SEARCH and row.lo < probe["b"] < row.hi
        if not inside and probe["kind"] == SEARCH:
            continue
        side = _side(row, said) if verdict == NOISY and probe["kind"] == SEARCH else None
        row.seen.append({"probe": len(search.done), "kind": probe["kind"], "a": probe["a"], "b": probe["b"],
                         "repeats": probe["repeats"], "verdict": verdict, "ratio": said["ratio"],
                         **({"read_as": side} if side else {})})
        retry = verdict == NOISY and probe["repeats"] < search.max_repeats and side is None
        if probe["kind"] == CONFIRM:
            if not retry:
                row.confirmed = verdict == row.direction
            continue
        k = probe["b"]
        if verdict == SAME or side == "good":
            row.lo = k
        elif side == "bad":
            row.hi = k
        elif verdict in MOVES and row.direction in (None, verdict):
            row.direction, row.hi = verdict, k
            row.bad_ratio = said["ratio"]
        elif verdict in MOVES:
            row.untestable[k] = f"moved the other way ({verdict})"
        elif verdict == NOISY and not retry:
            row.untestable[k] = f"NOISY at {probe['repeats']} repeats"
        elif verdict != NOISY:
            row.untestable[k] = f"no verdict ({verdict})"


def _side(row: Row, said: dict) -> str | None:
    """"good" where a NOISY interval lies wholly nearer no move than half the row's known move (in log
    B/A, either way), "bad" where it lies wholly past half of it in its direction; None where it
    straddles either bound or no move is known yet."""
    lo, hi = said.get("lo"), said.get("hi")
    if not row.bad_ratio or not lo or not hi or row.bad_ratio <= 0 or lo <= 0 or row.bad_ratio == 1:
        return None
    half = abs(math.log(row.bad_ratio)) / 2
    toward = 1 if row.bad_ratio > 1 else -1
    ends = [toward * math.log(lo), toward * math.log(hi)]  # positive: in the direction of the move
    if min(ends) > half:
        return "bad"
    if max(abs(e) for e in ends) < half:
        return "good"
    return None


def _retry(search: Search) -> Probe | None:
    """The last probe again at twice the repeats, for its rows that it found NOISY (never read as
    good or bad) where they are still open to that verdict."""
    if not search.done:
        return None
    last = search.done[-1]["probe"]
    if last["repeats"] >= search.max_repeats:
        return None
    noisy = []
    for row_id in last["rows"]:
        row = search.rows[row_id]
        said = search.done[-1]["verdicts"].get(row_id) or {}
        still_open = (row.confirmed is None if last["kind"] == CONFIRM
                      else row.lo < last["b"] < row.hi and last["b"] not in row.untestable)
        if said.get("verdict") == NOISY and still_open:
            noisy.append(row_id)
    if not noisy:
        return None
    return Probe(last["kind"], last["a"], last["b"], min(2 * last["repeats"], search.max_repeats), tuple(noisy))


def next_probe(search: Search) -> Probe | None:
    """The next A/B the search needs, or None when it is over."""
    retry = _retry(search)
    if retry is not None:
        return retry
    groups = search.groups()
    if groups:
        group = groups[0]
        lo, hi = group[0].lo, group[0].hi
        candidates = group[0].candidates(search.skipped, search.n)
        if hi >= search.n:  # not seen bad anywhere yet: the last build says whether it moved at all
            build = max(candidates)
        else:
            middle = (lo + hi) / 2
            build = min(candidates, key=lambda k: (abs(k - middle), k))
        # Every open row whose interval holds the build learns from the probe, in or out of this group.
        rows = tuple(r.id for r in search.open_rows() if build in r.candidates(search.skipped, search.n))
        return Probe(SEARCH, 0, build, search.repeats, rows)
    unconfirmed: dict[tuple[int, int], list[str]] = {}
    for row in search.rows.values():
        if row.moved(search.n) and row.confirmed is None:
            unconfirmed.setdefault((row.lo, row.hi), []).append(row.id)
    if unconfirmed:
        (lo, hi), rows = min(unconfirmed.items())
        return Probe(CONFIRM, lo, hi, search.repeats, tuple(rows))
    return None


def replay(n: int, rows: list[dict], repeats: int, max_repeats: int, skipped: dict[int, str],
           done: list[dict]) -> Search:
    """The search as the probes `done` left it (what a resume continues)."""
    search = new(n, rows, repeats, max_repeats)
    for build, reason in skipped.items():
        search.skip(build, reason)
    for result in done:
        apply(search, result)
    return search


def between(row: Row, skipped: dict[int, str]) -> list[int]:
    """The builds between a row's last good and first bad that were never tested for it: the first
    bad could be any of them, as `git bisect` says when only skipped commits are left."""
    return [k for k in range(row.lo + 1, row.hi) if k in skipped or k in row.untestable]
