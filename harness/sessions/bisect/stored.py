"""bisect.json read back by `--resume`: every field the session goes on to use checked for its type and
range first, so a torn or hand-edited file is one line naming the field (exit 2), never a KeyError or
an IndexError from deep in the search. The plan inside it is checked as a plan is (ab.plan)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from harness.core.bounded import field_problem
from harness.core.errors import clip
from harness.core.options import MAX_REPEATS, is_strings, is_text, valid_repeats
from harness.sessions.bisect import search


def _index(v) -> bool:
    return type(v) is int and v >= 0


def _text_or_none(v) -> bool:
    return v is None or is_text(v)


def _mapping(v, value: Callable[[Any], bool] = is_text) -> bool:
    return isinstance(v, dict) and all(is_text(k) and value(x) for k, x in v.items())


BUILD = {"label": (is_text, "a string"), "env": (_mapping, "a mapping of strings"),
         "python": (_text_or_none, "a path or null"), "requirements": (is_strings, "a list of strings"),
         "commit": (_text_or_none, "a commit or null")}
KNOWN = {"ok": (lambda v: isinstance(v, bool), "true or false"), "reason": (_text_or_none, "a string or null"),
         "python": (_text_or_none, "a path or null")}


def _ratio(v) -> bool:
    return v is None or (type(v) in (int, float) and math.isfinite(v) and v > 0)


VERDICT = {"verdict": (is_text, "a verdict"), **dict.fromkeys(("ratio", "lo", "hi"), (_ratio, "a ratio (> 0) or null"))}
ROW = {"id": (is_text, "a row name"), "op": (is_text, "an op"),
       "direction": (lambda v: v is None or v in search.MOVES, f"null or one of {', '.join(search.MOVES)}")}
TOP = {"spec": (lambda v: isinstance(v, dict), "a mapping"), "builds": (lambda v: isinstance(v, dict), "a mapping"),
       "records": (_mapping, "a mapping of paths"),
       "rows": (lambda v: v is None or isinstance(v, list), "a list or null"),
       "probes": (lambda v: isinstance(v, list), "a list"),
       "complete": (lambda v: isinstance(v, bool), "true or false")}
SPEC = {"builds": (lambda v: isinstance(v, list) and len(v) >= 2, "a list of two builds or more"),
        "plan": (lambda v: isinstance(v, dict), "a mapping"),
        "device": (lambda v: v is None or _index(v), "a device index or null"),
        "git": (lambda v: v is None or _mapping(v), "a mapping of strings or null"),
        "ops": (is_strings, "a list of ops"),
        "repeats": (valid_repeats, f"an integer from 2 to {MAX_REPEATS}"),
        "max_repeats": (valid_repeats, f"an integer from 2 to {MAX_REPEATS}")}
GIT = dict.fromkeys(("checkout", "build_cmd", "cache"), (is_text, "a string"))
DONE = {"probe": (lambda v: isinstance(v, dict), "a mapping"), "dir": (is_text, "a path"),
        "verdicts": (lambda v: isinstance(v, dict), "a mapping")}


def problem(state) -> str | None:
    """What is wrong with a bisect.json's `state` (its format aside, checked first), or None."""
    found = field_problem("it", state, TOP) or field_problem("spec", state["spec"], SPEC)
    if found:
        return found
    spec = state["spec"]
    if spec["git"] is not None:
        found = field_problem("spec.git", spec["git"], GIT)
    n = len(spec["builds"])
    for i, build in enumerate(spec["builds"]):
        found = found or field_problem(f"spec.builds[{i}]", build, BUILD)
    for k, known in state["builds"].items():
        if not (k.isdigit() and int(k) < n):
            return f"builds has a key {clip(k)}, not a build index below {n}"
        found = found or field_problem(f"builds.{k}", known, KNOWN)
    for i, row in enumerate(state["rows"] or []):
        found = found or field_problem(f"rows[{i}]", row, ROW)
    build = (lambda v: _index(v) and v < n, f"a build index below {n}")
    probe = {"kind": (lambda v: v in (search.SEARCH, search.CONFIRM), f"{search.SEARCH} or {search.CONFIRM}"),
             "a": build, "b": build,
             "repeats": (lambda v: type(v) is int and 2 <= v <= 2 * MAX_REPEATS, "a count of repeats"),
             "rows": (is_strings, "a list of row names")}
    for i, done in enumerate(state["probes"]):
        found = found or field_problem(f"probes[{i}]", done, DONE)
        found = found or field_problem(f"probes[{i}].probe", done["probe"], probe)
        for row, said in ({} if found else done["verdicts"]).items():
            found = found or field_problem(f"probes[{i}].verdicts.{clip(row)}", said, VERDICT)
    return found
