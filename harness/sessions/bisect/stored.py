"""bisect.json read back by `--resume`: every field the session goes on to use checked for its type and
range first, so a torn or hand-edited file is one line naming the field (exit 2), never a KeyError or
an IndexError from deep in the search. The plan inside it is checked as a plan is (ab.plan)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from harness.core.errors import clip
from harness.core.options import MAX_REPEATS, is_strings, is_text, valid_repeats
from harness.sessions.bisect import search


def _index(v) -> bool:
    return type(v) is int and v >= 0


def _text_or_none(v) -> bool:
    return v is None or is_text(v)


def _mapping(v, value: Callable[[Any], bool] = is_text) -> bool:
    return isinstance(v, dict) and all(is_text(k) and value(x) for k, x in v.items())


def _fields(where: str, data, fields: dict[str, Callable[[Any], bool]], what: dict[str, str]) -> str | None:
    """The first field of `data` (a mapping) its check refuses, as `where.field = value is not WHAT`."""
    if not isinstance(data, dict):
        return f"{where} is {clip(data)!s}, not a mapping"
    for name, check in fields.items():
        if name not in data:
            return f"{where} has no '{name}'"
        if not check(data[name]):
            return f"{where}.{name} = {clip(data[name])} is not {what[name]}"
    return None


BUILD = {"label": is_text, "env": _mapping, "python": _text_or_none, "requirements": is_strings,
         "commit": _text_or_none}
BUILD_WHAT = {"label": "a string", "env": "a mapping of strings", "python": "a path or null",
              "requirements": "a list of strings", "commit": "a commit or null"}
KNOWN = {"ok": lambda v: isinstance(v, bool), "reason": _text_or_none, "python": _text_or_none}
KNOWN_WHAT = {"ok": "true or false", "reason": "a string or null", "python": "a path or null"}
def _ratio(v) -> bool:
    return v is None or (type(v) in (int, float) and math.isfinite(v) and v > 0)


VERDICT = {"verdict": is_text, "ratio": _ratio, "lo": _ratio, "hi": _ratio}
VERDICT_WHAT = {"verdict": "a verdict", "ratio": "a ratio (> 0) or null", "lo": "a ratio (> 0) or null",
                "hi": "a ratio (> 0) or null"}
ROW = {"id": is_text, "op": is_text, "direction": lambda v: v is None or v in search.MOVES}
ROW_WHAT = {"id": "a row name", "op": "an op", "direction": f"null or one of {', '.join(search.MOVES)}"}


def problem(state) -> str | None:
    """What is wrong with a bisect.json's `state` (its format aside, checked first), or None."""
    top = {"spec": lambda v: isinstance(v, dict), "builds": lambda v: isinstance(v, dict), "records": _mapping,
           "rows": lambda v: v is None or isinstance(v, list), "probes": lambda v: isinstance(v, list),
           "complete": lambda v: isinstance(v, bool)}
    found = _fields("it", state, top, {"spec": "a mapping", "builds": "a mapping", "records": "a mapping of paths",
                                       "rows": "a list or null", "probes": "a list", "complete": "true or false"})
    if found:
        return found
    spec = state["spec"]
    found = _fields("spec", spec, {
        "builds": lambda v: isinstance(v, list) and len(v) >= 2, "plan": lambda v: isinstance(v, dict),
        "device": lambda v: v is None or _index(v), "git": lambda v: v is None or _mapping(v), "ops": is_strings,
        "repeats": valid_repeats, "max_repeats": valid_repeats,
    }, {"builds": "a list of two builds or more", "plan": "a mapping", "device": "a device index or null",
        "git": "a mapping of strings or null", "ops": "a list of ops", "repeats": f"an integer from 2 to {MAX_REPEATS}",
        "max_repeats": f"an integer from 2 to {MAX_REPEATS}"})
    if found:
        return found
    git = spec["git"]
    if git is not None:
        found = _fields("spec.git", git, dict.fromkeys(("checkout", "build_cmd", "cache"), is_text),
                        dict.fromkeys(("checkout", "build_cmd", "cache"), "a string"))
    n = len(spec["builds"])
    for i, build in enumerate(spec["builds"]):
        found = found or _fields(f"spec.builds[{i}]", build, BUILD, BUILD_WHAT)
    for k, known in state["builds"].items():
        if not (k.isdigit() and int(k) < n):
            return f"builds has a key {clip(k)}, not a build index below {n}"
        found = found or _fields(f"builds.{k}", known, KNOWN, KNOWN_WHAT)
    for i, row in enumerate(state["rows"] or []):
        found = found or _fields(f"rows[{i}]", row, ROW, ROW_WHAT)
    builds = lambda v: _index(v) and v < n  # noqa: E731
    for i, done in enumerate(state["probes"]):
        found = found or _fields(f"probes[{i}]", done, {"probe": lambda v: isinstance(v, dict), "dir": is_text,
                                                         "verdicts": lambda v: isinstance(v, dict)},
                                 {"probe": "a mapping", "dir": "a path", "verdicts": "a mapping"})
        found = found or _fields(f"probes[{i}].probe", done["probe"], {
            "kind": lambda v: v in (search.SEARCH, search.CONFIRM), "a": builds, "b": builds,
            "repeats": lambda v: type(v) is int and 2 <= v <= 2 * MAX_REPEATS, "rows": is_strings,
        }, {"kind": f"{search.SEARCH} or {search.CONFIRM}", "a": f"a build index below {n}",
            "b": f"a build index below {n}", "repeats": "a count of repeats", "rows": "a list of row names"})
        for row, said in ({} if found else done["verdicts"]).items():
            found = found or _fields(f"probes[{i}].verdicts.{clip(row)}", said, VERDICT, VERDICT_WHAT)
    return found
