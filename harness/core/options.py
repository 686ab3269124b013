"""The options a session hands on to the record and replay runs it starts, each declared once.

nox's `_options.py` is the model: a field of an option set (`RunOptions`, `BatchOptions`) carries
its flag, help, group, parser type and stored-value check in its metadata (`option`), and the rest
is derived from those declarations: the command line's argument groups (`add_arguments`), the argv
a session gives a child (`to_argv`), the stored form an A/B plan and a batch's batch.json keep
(`to_dict`, `from_dict`), and what a command line gave (`given`). A session holds one frozen set;
what the command line gives over a stored one is `dataclasses.replace(stored, **given)`.

None (or an empty tuple) leaves an option out: the child then applies its own default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import backends
from harness.core import bounded
from harness.core.errors import clip, clip_text
from harness.core.spec import L2_MODES, MAX_NOISE, RULES, TIMERS
from ops import DTYPES_RULE, valid_dtype_list

# Option values with a meaning of their own (FlagGems checkouts), here because the parser checks them.
DEFAULT_REPO = "flaggems"  # the NAME of a `--flaggems-dir PATH` given without one
LEVELS = ("core", "comprehensive")
# `--shapes upstream`: the checkout's own shapes (core_shapes.yaml at the level, plus what the
# benchmark classes add), untouched.
UPSTREAM = "upstream"

# How an A/B starts each step: forked by its side's warm worker (harness.core.forkserver), fresh, or
# forked by a warm worker of its own, begun with the op's others before its first step.
STEP_STARTS = ("fork", "fresh", "prewarmed")
# How a batch starts each op's record or replay: forked by its device's warm worker, or fresh.
OP_STARTS = ("fork", "fresh")
# Where an A/B's one-off passes (IR, per-kernel attribution) run: one untimed step per side, or every step.
STEP_PASSES = ("once", "every")
# Where a chunk's records and passes run: the later ops' beside the earlier ops' repeats (sharing the device
# through a gate, harness.measure.device_gate), or all of them before its first repeat.
CHUNK_RECORDS = ("beside", "first")

# Ceilings on counts a request can ask for: each repeat is two processes, each window a capture a row.
MAX_REPEATS = 100
# Ops whose repeat one measuring host a side runs (harness.child.host): past it a host's one device context
# holds more of the A/B than a crash should cost.
MAX_CHUNK = 64
# A chunk's records and B's passes at once (--record-jobs): each a process with its device context and inputs.
MAX_RECORD_JOBS = 8
DEFAULT_RECORD_JOBS = 1
# A run's measured fields (seed, budgets, windows, device) are ranged in harness.core.spec (RULES), which a
# run.json is read back by too. An op's timeout past a week is a typo; 1e308 overflowed a clock (a traceback).
MAX_OP_TIMEOUT_S = 7 * 24 * 3600


# Argument group titles, by the key an option's `group` names.
GROUPS = {
    "where": "where to run",
    "what": "what to run",
    "flaggems": "FlagGems benchmark checkouts (operators named REPO:OP[@FILE] or a pytest node)",
    "how": "how to measure",
    "running": "running",
    "experiment": "the experiment (override the plan)",
    "bisect": "the bisect: builds, rows, resume",
}


# --- parser types: each checks what its flag takes, so a parsed value is a valid one ---------------
def dtype_list(text: str) -> list[str]:
    items = [d.strip() for d in text.split(",") if d.strip()]
    if not valid_dtype_list(items):
        raise argparse.ArgumentTypeError(f"{clip(text)} must be {DTYPES_RULE}, comma-separated")
    return items


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def nonneg_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # said as the other refusals are, not as argparse's "invalid positive_int value"
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, not {clip(text)}")
    return value


def path_of(expect: str) -> Callable[[str], Path]:
    """A path option's parser type: the text as a Path, refused at the door where something that is
    not `expect` ('file' or 'dir') is there already (a directory given for a file; a file, a FIFO or a
    device for a dir; a broken link), saying what is there and what was expected, not "does not exist"
    or "File exists" later, nor a dir made at a dangling link's target. A path not there yet passes:
    its reader or maker says what it needs."""
    def parse(text: str) -> Path:
        if os.path.lexists(text):
            problem = bounded.path_problem(text, expect)
            if problem is not None:
                raise argparse.ArgumentTypeError(f"{clip_text(text)} {problem}")
        return Path(text)

    parse.__name__ = f"{expect} path"
    return parse


FILE_PATH, DIR_PATH = path_of("file"), path_of("dir")


def split_dir(item: str) -> tuple[str, str]:
    """`[NAME=]PATH` as (NAME, PATH); NAME defaults to `flaggems`."""
    name, sep, path = item.partition("=")
    return (name, path) if sep else (DEFAULT_REPO, item)


def absolute_dir(item: str, base: Path) -> str:
    """A `[NAME=]PATH` value whose PATH is absolute (relative to `base`): the value travels into run
    specs and plans that processes read from other directories."""
    name, path = split_dir(item)
    return f"{name}={os.path.abspath(base / Path(path).expanduser())}" if path else item


def absolute_libtuner_cache(choice: str, base: Path) -> str:
    """A `--libtuner-cache` value whose path is absolute (relative to `base`), for the same reason."""
    if choice in ("private", "user") or "://" in choice:
        return choice
    return os.path.abspath(base / Path(choice).expanduser())


def absolute_ops_path(item: str) -> str:
    """An `--ops-path` file or dir made absolute (the child runs from the repo root); a module name as is."""
    if not os.path.exists(item):  # a module name, or a path its probe names missing (False for a name too long)
        return item
    # Anything else there was imported by the probe, which said only that it "ended its process (exited 1)".
    if not (os.path.isdir(item) or (os.path.isfile(item) and item.endswith(".py"))):
        raise argparse.ArgumentTypeError(f"{clip_text(item)} is {bounded.what_it_is(item)}, not a directory or a "
                                         ".py file")
    return str(Path(item).resolve())


def _is_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _device_list(value) -> bool:
    # An index given twice would run two ops on one device at once, each timing the other's load.
    items = [d.strip() for d in value.split(",") if d.strip()] if isinstance(value, str) else []
    return bool(items) and all(d.isdigit() for d in items) and len(set(map(int, items))) == len(items)


def is_text(value) -> bool:
    """A string an argv or a path can carry: no NUL (a stored one reached os calls as a traceback)."""
    return isinstance(value, str) and "\0" not in value


def is_strings(value) -> bool:
    return isinstance(value, list) and all(is_text(v) for v in value)


# --- the declaration ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Option:
    """How one option is given, checked, passed on and stored."""

    flag: str
    help: str
    group: str  # a GROUPS key
    commands: tuple[str, ...]  # the `python -m harness` commands that take it
    check: Callable[[Any], bool]  # a stored value (plan, batch.json), which skips the parser
    what: str  # what `check` wants, said in its refusal
    metavar: str | None = None
    type: Callable | None = None
    choices: tuple | None = None
    repeat: bool = False  # repeatable; the value a tuple
    nargs: str | None = None  # "+": one or more values after the flag; the value a tuple
    switch: bool = False  # --X / --no-X
    flag_only: bool = False  # the flag alone says True (argparse's store_true)
    record_default: Any = None  # what `record` parses when it is not given (the others parse `default`)
    default: Any = None  # what the other commands parse when it is not given: the same value given is not "given"
    record_only: bool = False  # a replay keeps the record's: `replay` refuses it by name
    replay: bool = True  # an A/B gives it to its replays, not only to A's record
    stored: bool = True  # in batch.json, for a resume
    # A stored relative value made absolute against the folder of the file that holds it (a plan's).
    rebase: Callable[[Any, Path], Any] | None = None
    load: Callable[[Any], Any] | None = None  # a stored value (checked) in the field's own type
    show: Callable[[Any], str] = str  # the value as its flag takes it on a command line (to_argv)
    expect: str | None = None  # a path option's: 'file' or 'dir', what may already be there (path_of)


def option(**declared) -> Any:
    """A field declared as an option: None (or () when repeatable) until given."""
    meta = Option(**declared)
    return dataclasses.field(default=() if meta.repeat else None, metadata={"option": meta})


def declared(cls_or_obj) -> list[tuple[dataclasses.Field, Option]]:
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls_or_obj) if "option" in f.metadata]


class OptionSet:
    """What every declared option set derives from its declarations."""

    def __post_init__(self) -> None:
        # Lists handed in become tuples: a set stays hashable and unchangeable.
        for field, _ in declared(self):
            if isinstance(getattr(self, field.name), list):
                object.__setattr__(self, field.name, tuple(getattr(self, field.name)))

    @classmethod
    def add_arguments(cls, groups: Mapping[str, Any], command: str, names: Iterable[str] | None = None) -> None:
        """Each option `command` takes (of `names`, default all) into its group of `groups`. A
        record-only option given to `replay` is refused by name; a session that starts records
        (ab, batch) parses None for one not given, so that only what is given is passed on."""
        wanted = None if names is None else set(names)
        for field, meta in declared(cls):
            if command not in meta.commands or (wanted is not None and field.name not in wanted):
                continue
            if command == "replay" and meta.record_only:
                groups[meta.group].add_argument(meta.flag, action=RecordOnly)
                continue
            kw: dict[str, Any] = {"dest": field.name, "help": meta.help}
            if meta.switch:
                kw["action"] = argparse.BooleanOptionalAction
            elif meta.flag_only:
                kw["action"] = "store_true"
            else:
                kw.update(metavar=meta.metavar, type=_checked(meta), choices=meta.choices, nargs=meta.nargs)
                if meta.repeat:
                    kw["action"] = "append"
            kw["default"] = meta.record_default if command == "record" else meta.default
            groups[meta.group].add_argument(meta.flag, **{k: v for k, v in kw.items() if v is not None
                                                            or k == "default"})

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace):
        """The options a parsed command line holds (one it does not take is None)."""
        return cls(**{f.name: _frozen(getattr(ns, f.name, None), meta) for f, meta in declared(cls)})

    def given(self) -> dict:
        """The options set (not None, not empty, not what the parser gives when it is not given), by field
        name: what overrides a stored set."""
        return {f.name: getattr(self, f.name) for f, meta in declared(self) if _given(getattr(self, f.name), meta)}

    def flags(self, but: Iterable[str] = ()) -> list[str]:
        """The flags of the stored options set, but those named (`--no-triage` for a switch turned off):
        what a resume says it took from where."""
        return [("--no-" + meta.flag[2:]) if getattr(self, f.name) is False else meta.flag
                for f, meta in declared(self)
                if meta.stored and _given(getattr(self, f.name), meta) and f.name not in but]

    def to_argv(self) -> list[str]:
        """The options set, as the command line that gives them; in declaration order (logs show it)."""
        argv: list[str] = []
        for field, meta in declared(self):
            value = getattr(self, field.name)
            if not _given(value, meta):
                continue
            if meta.repeat:
                for item in value:
                    argv += [meta.flag, str(item)]
            elif meta.nargs:
                argv += [meta.flag, *map(str, value)]
            elif meta.flag_only:
                argv.append(meta.flag)
            elif meta.switch:
                argv.append(meta.flag if value else "--no-" + meta.flag[2:])
            elif isinstance(value, tuple):  # a comma-separated list (--dtypes)
                argv += [meta.flag, ",".join(value)]
            else:
                argv += [meta.flag, meta.show(value)]
        return argv

    def to_dict(self) -> dict:
        """The stored options (batch.json, a plan's yaml), JSON types, None included."""
        out = {}
        for field, meta in declared(self):
            if meta.stored:
                out[field.name] = _plain(getattr(self, field.name))
        return out

    @classmethod
    def from_dict(cls, data: Mapping, refuse: Callable[[str, Any, str], Exception], base: Path | None = None):
        """The options a stored mapping holds (other keys are the caller's), each checked as its flag
        would be (`refuse(name, value, what)` is raised); relative paths are relative to `base`
        where one is given (a plan file's folder)."""
        fields = {}
        for field, meta in declared(cls):
            value = data.get(field.name)
            if value is None or (meta.repeat and value == []):
                continue
            if not meta.check(value):
                raise refuse(field.name, value, meta.what)
            if base is not None and meta.rebase is not None:
                value = [meta.rebase(v, base) for v in value] if meta.repeat else meta.rebase(value, base)
            fields[field.name] = _frozen(meta.load(value) if meta.load else value, meta)
        return cls(**fields)


def _checked(meta: Option) -> Callable | None:
    """The flag's parser type followed by the declaration's own check, the one a stored value (a plan, a
    batch.json) gets: one rule for both, and no NaN, infinity or out-of-range number reaches a run. A
    repeatable or multi-value option is checked whole where it is stored; its items by their type."""
    if meta.repeat or meta.nargs or meta.choices or meta.type is None:  # a string: its session says what is wrong
        return meta.type
    convert = path_of(meta.expect) if meta.expect else meta.type

    def parse(text: str):
        value = convert(text)
        if not meta.check(_plain(value)):
            raise argparse.ArgumentTypeError(f"must be {meta.what}, not {text[:60]!r}")
        return value

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its own refusals
    return parse


def _given(value, meta: Option) -> bool:
    return value is not None and value != () and value != meta.default


def _frozen(value, meta: Option):
    """A value in the field's own type: lists as tuples, paths as Path."""
    if meta.repeat and value is None:  # an append argument not given
        return ()
    if isinstance(value, list):
        return tuple(value)
    if meta.type is Path and value is not None:
        return Path(value)
    return value


def _plain(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return value


class RecordOnly(argparse.Action):
    """A record's measurement option given to replay: refused by name, not as an unknown argument."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is record-only: a replay measures as its record did (run.json spec); "
                     "record again to change it")


RUNS = ("record", "replay", "ab", "batch", "bisect")  # the commands that run operators
STARTERS = ("ab", "batch")  # the commands that start batches of them


def _plan_shapes(value: str, base: Path) -> str:
    return UPSTREAM if str(value) == UPSTREAM else str((base / value).resolve())


@dataclasses.dataclass(frozen=True)
class RunOptions(OptionSet):
    """How a record or replay runs, as a session passes it on: where, what, the FlagGems checkouts,
    and how A's record (or a batch's) measures. Declaration order is the argv's (FlagGems' options
    lead, right after the target they qualify; the device last) and, within each group, the help's."""

    level: str | None = option(
        flag="--level", group="flaggems", commands=RUNS, choices=LEVELS, replay=False,
        help="upstream --level, recorded; replays keep the recorded one (default: core)",
        check=lambda v: v in LEVELS, what=f"one of {', '.join(LEVELS)}")
    flagtune: str | None = option(
        flag="--flagtune", group="flaggems", commands=RUNS, choices=("0", "1"), replay=False,
        help="FlagGems' USE_FLAGTUNE switch, recorded; replays keep the recorded one (default: $USE_FLAGTUNE, else 0)",
        check=lambda v: not isinstance(v, bool) and str(v) in ("0", "1"), what="0 or 1", load=str)  # yaml's 1: "1"
    libtuner_cache: str | None = option(
        flag="--libtuner-cache", group="flaggems", commands=RUNS, metavar="private|user|URL", replay=False,
        type=lambda text: absolute_libtuner_cache(text, Path.cwd()),
        rebase=lambda v, base: absolute_libtuner_cache(str(v), base),
        help="LibTuner's persistent config cache: a fresh one in the run dir (private, the default), FlagGems' own "
             "(user), or a sqlite path/URL; recorded in run.json",
        check=is_text, what="a cache name, path or URL")
    backend: str | None = option(
        flag="--backend", group="where", commands=RUNS, metavar="NAME", replay=False,
        help=f"{'|'.join(backends.NAMES)} or an alias (default: the accelerator found; replay: the recorded one)",
        check=is_text, what="a string (a backend name)")
    shapes: Path | None = option(
        flag="--shapes", group="what", commands=RUNS, metavar="FILE", type=Path, expect="file", rebase=_plan_shapes,
        help="shape yaml (default: shapes/<backend default>; replay: the recorded shapes; FlagGems ops: `upstream`, "
             "the checkout's own, by default)",
        check=is_text, what="a path")
    dtypes: tuple[str, ...] | None = option(
        flag="--dtypes", group="what", commands=RUNS, metavar="LIST", type=dtype_list,
        help="comma-separated subset of fp16,bf16,fp32 (default: the shape file's, else the op's)",
        check=valid_dtype_list, what=DTYPES_RULE)
    ops_paths: tuple[str, ...] = option(
        flag="--ops-path", group="what", commands=RUNS, metavar="PATH", type=absolute_ops_path, repeat=True,
        rebase=lambda v, base: str((base / v).resolve()),
        help="extra operator definitions: a directory of modules, a .py file or a module name (repeatable)",
        check=is_strings, what="a list of paths")
    flaggems_dirs: tuple[str, ...] = option(
        flag="--flaggems-dir", group="flaggems", commands=RUNS, metavar="[NAME=]PATH", repeat=True,
        # Absolute as parsed: the value travels into run specs and plans that processes read from elsewhere.
        type=lambda text: absolute_dir(text, Path.cwd()), rebase=lambda v, base: absolute_dir(str(v), base),
        help="a FlagGems-style checkout (benchmark/ and src/); NAME is the repo prefix of its operators, `flaggems` "
             "when omitted (repeatable)",
        check=is_strings, what="a list of [NAME=]PATH")
    seed: int | None = option(
        flag="--seed", group="how", commands=RUNS, metavar="N", type=int, record_default=0, record_only=True,
        help="seed for random/numpy/torch (default: 0)",
        check=RULES["seed"][0], what=RULES["seed"][1])
    timer: str | None = option(
        flag="--timer", group="how", commands=RUNS, choices=TIMERS, record_default="auto", record_only=True,
        help="auto: the backend's own: graph where it can capture, else direct, and host (a wall clock) where it "
             "has no device timing (the interpreter); profiler: the device profiler's summed kernel time per call "
             "(default: auto)",
        check=lambda v: v in TIMERS, what=f"one of {', '.join(TIMERS)}")
    l2: str | None = option(
        flag="--l2", group="how", commands=RUNS, choices=L2_MODES, record_default="warm", record_only=True,
        help="warm: calls reuse what the last left in the device L2; cold: flush it before every call (default: warm)",
        check=lambda v: v in L2_MODES, what=f"one of {', '.join(L2_MODES)}")
    warmup_ms: float | None = option(
        flag="--warmup-ms", group="how", commands=RUNS, metavar="MS", type=nonneg_float, record_only=True,
        help="warmup budget per measurement (default: the backend's, 5 on GPUs)",
        check=RULES["warmup_ms"][0], what=RULES["warmup_ms"][1])
    rep_ms: float | None = option(
        flag="--rep-ms", group="how", commands=RUNS, metavar="MS", type=nonneg_float, record_only=True,
        help="timing budget per measurement (default: the backend's, 100 on GPUs)",
        check=RULES["rep_ms"][0], what=RULES["rep_ms"][1])
    windows: int | None = option(
        flag="--windows", group="how", commands=RUNS, metavar="N", type=positive_int, record_only=True,
        help="graph and direct timers: time each side in N windows, the sides alternating, sharing the timing "
             "budget; a row's latency is the geometric mean of its windows' medians (default: 1)",
        check=RULES["windows"][0], what=RULES["windows"][1])
    max_noise: float | None = option(
        flag="--max-noise", group="how", commands=RUNS, metavar="PCT", type=lambda text: percent(text),
        show=lambda v: percent_text(v), record_only=True,
        help="graph, direct and host timers: stop timing a side once its median is known within PCT (its relative "
             "standard error; NVBench's stdrel rule), after 5 graph samples (10 of the others); --rep-ms stays the "
             "most it times; 0 turns it off (default: the backend's, 0.1%% on GPUs)",
        check=RULES["max_noise"][0], what=f"a percentage from 0% to {MAX_NOISE:.0%}")
    # Each op's device is the batch's choice: not stored.
    device: int | None = option(
        flag="--device", group="where", commands=RUNS, metavar="N", type=int, stored=False,
        help="device index (default: the first visible device)",
        check=RULES["device"][0], what=RULES["device"][1])

    def for_replay(self) -> RunOptions:
        """What a replay of a record made with these options is given: it keeps the rest as recorded."""
        return dataclasses.replace(self, **{f.name: f.default for f, meta in declared(self) if not meta.replay
                                            or meta.record_only})

    def measurement(self) -> RunOptions:
        """Only how a record measures (the record-only options), the rest left out."""
        return RunOptions(**{f.name: getattr(self, f.name) for f, meta in declared(self) if meta.record_only})

    def without_measurement(self) -> RunOptions:
        return dataclasses.replace(self, **{f.name: None for f, meta in declared(self) if meta.record_only})


@dataclasses.dataclass(frozen=True)
class BatchOptions(OptionSet):
    """How a batch (or a corpus A/B) runs its ops, stored in its batch.json for a resume."""

    devices: str | None = option(
        flag="--devices", group="running", commands=STARTERS, metavar="LIST",
        help="comma-separated device indices (default: the backend's visible devices)",
        check=_device_list, what="comma-separated device indices, each once")
    op_timeout: float | None = option(
        flag="--op-timeout", group="running", commands=STARTERS, metavar="S", type=positive_float,
        help="per-op timeout in seconds; the op's process group is killed (default: 1800; --resume: the batch's)",
        check=lambda v: _is_number(v) and 0 < v <= MAX_OP_TIMEOUT_S,
        what=f"a number of seconds > 0, at most {MAX_OP_TIMEOUT_S} (a week)")
    replay_root: Path | None = option(
        flag="--replay-root", group="running", commands=("batch",), metavar="DIR", type=Path, expect="dir",
        help="replay each op from this earlier batch dir",
        check=is_text, what="a path")
    triage: bool | None = option(
        flag="--triage", group="running", commands=("batch",), switch=True,
        help="rerun a FlagGems op that still fails or times out as the bare upstream pytest node: FAIL_UPSTREAM or "
             "TIMEOUT_UPSTREAM when that fails or times out too (not counted as ours), FAIL or TIMEOUT otherwise "
             "(default: on; --resume: the batch's)",
        check=lambda v: v is False, what="false (on is stored as null)")
    op_start: str | None = option(
        flag="--op-start", group="running", commands=("batch",), choices=OP_STARTS,
        help="how each op's record or replay starts: fork (forked by its device's warm worker, which imported "
             "torch, triton and pytest once: a new process per op, without the imports) or fresh (a new "
             "interpreter per op, imports included) (default: fork; --resume: the batch's)",
        check=lambda v: v in OP_STARTS, what=f"one of {', '.join(OP_STARTS)}")


EXECUTORS = ("local", "ray", "slurm")


@dataclasses.dataclass(frozen=True)
class CorpusOptions(OptionSet):
    """Which ops a batch (or a corpus A/B) runs, and how the batch itself runs: given on its command line
    only (batch.json keeps the selection in its own terms). Any of them given to `ab` makes it a corpus A/B
    (harness.sessions.corpus_ab.wanted), as any of BatchOptions does."""

    all: bool | None = option(
        flag="--all", group="selection", commands=STARTERS, flag_only=True, default=False, stored=False,
        help="the whole inventory, minus skip marks and ops/dismiss.txt",
        check=lambda v: isinstance(v, bool), what="true or false")
    ops_file: Path | None = option(
        flag="--ops-file", group="selection", commands=STARTERS, metavar="FILE", type=Path, expect="file", stored=False,
        help="one selection entry per line", check=is_text, what="a path")
    repos: tuple[str, ...] | None = option(
        flag="--repos", group="selection", commands=STARTERS, metavar="REPO", nargs="+", stored=False,
        help="only these inventories", check=is_strings, what="a list of inventory names")
    sample: int | None = option(
        flag="--sample", group="selection", commands=STARTERS, metavar="N", type=int, stored=False,
        help="a seeded random sample of N ops from the selection (after exclusions)",
        check=lambda v: type(v) is int and v >= 1, what="an integer >= 1")
    sample_seed: int | None = option(
        flag="--sample-seed", group="selection", commands=STARTERS, metavar="S", type=int, default=0, stored=False,
        help="the sample's seed (default 0): the same seed and inventory pick the same ops",
        check=lambda v: type(v) is int, what="an integer")
    resume: bool | None = option(
        flag="--resume", group="running", commands=STARTERS, flag_only=True, default=False, stored=False,
        help="rerun only ops not PASS/SKIP in --batch-dir, with the selection and options stored there unless "
             "given again",
        check=lambda v: isinstance(v, bool), what="true or false")
    batch_dir: Path | None = option(
        flag="--batch-dir", group="running", commands=STARTERS, metavar="DIR", type=Path, expect="dir", stored=False,
        help="the batch dir: a new or empty one (created), or with --resume the batch to resume (default for a "
             "new batch: runs/batch_<ts>)",
        check=is_text, what="a path")
    executor: str | None = option(
        flag="--executor", group="running", commands=STARTERS, choices=EXECUTORS, default="local", stored=False,
        help="local subprocesses, Ray tasks of one device each, or Slurm array tasks of one GPU each through "
             "submitit (the batch dir on a shared filesystem) (default: local)",
        check=lambda v: v in EXECUTORS, what=f"one of {', '.join(EXECUTORS)}")
    ray_address: str | None = option(
        flag="--ray-address", group="running", commands=STARTERS, metavar="ADDR", stored=False,
        help="Ray cluster to join (default with --executor ray: a local Ray instance)",
        check=is_text, what="an address")
    slurm_param: tuple[str, ...] = option(
        flag="--slurm-param", group="running", commands=STARTERS, metavar="KEY=VAL", repeat=True, stored=False,
        help="with --executor slurm: a Slurm job parameter for submitit (slurm_KEY), e.g. partition=gpu, account=x "
             "(repeatable)",
        check=is_strings, what="a list of KEY=VAL")


def _is_env_list(value) -> bool:
    return is_strings(value) and all("=" in item for item in value)


# The default false discovery rate of a report's FASTER/SLOWER calls (reports.stats), beside --fdr, whose
# default it is: the A/B's plan takes it without importing the statistics (numpy) before its first step.
FDR = 0.05


def valid_fdr(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1


def valid_repeats(value) -> bool:
    """At least two (a row's spread between its repeats is its noise), at most MAX_REPEATS."""
    return type(value) is int and 2 <= value <= MAX_REPEATS


# `--repeats auto`: sequential repeats. The first round times FIRST_REPEATS per side for every row; each
# later round one more per side for the rows whose verdict is still open (reports.sequential.settle),
# until none is or a side has --max-repeats.
AUTO = "auto"
FIRST_REPEATS = 3
DEFAULT_MAX_REPEATS = 12
DEFAULT_RESOLVE = 0.01  # --resolve: the smallest change, as a fraction of latency, a row is timed to resolve
# Above reports.stats.MARGIN, which a call's interval must clear (here: the plan is checked before the
# statistics' numpy is imported; tests/test_sequential_runner.py keeps the two equal).
MIN_RESOLVE = 0.003
MAX_RESOLVE = 0.5


def repeats_value(text: str) -> int | str:
    """`--repeats`: a count, or the text (`auto`); the declared check says which are valid."""
    try:
        return int(text)
    except ValueError:  # `auto`, or what the declared check refuses in its own words
        return text


def valid_repeats_choice(value) -> bool:
    return value == AUTO or valid_repeats(value)


def valid_max_repeats(value) -> bool:
    """At least FIRST_REPEATS (the first round's), at most MAX_REPEATS."""
    return type(value) is int and FIRST_REPEATS <= value <= MAX_REPEATS


def percent(text: str) -> float:
    """`1%` or `0.5%` as the fraction it names (0.01, 0.005). The sign is required: a bare 0.5 could
    mean half a percent or half the latency."""
    number = text.strip().removesuffix("%") if isinstance(text, str) and text.strip().endswith("%") else None
    try:
        return float(number) / 100
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be a percentage such as 1% or 0.5%, not {clip(text)}") from None


def percent_text(fraction: float) -> str:
    """A fraction as `percent` reads it back: 0.005 -> `0.5%`."""
    return f"{fraction * 100:g}%"


def valid_resolve(value) -> bool:
    """A fraction strictly between MIN_RESOLVE and MAX_RESOLVE (0.3% and 50%)."""
    return _is_number(value) and MIN_RESOLVE < value < MAX_RESOLVE


def _side_env(side: str):
    return option(flag=f"--{side}-env", group="experiment", commands=("ab",), metavar="KEY=VAL", repeat=True,
                  help=f"environment variable for side {side.upper()} (repeatable)", check=_is_env_list,
                  what="a list of KEY=VAL")


def _side_python(side: str):
    return option(flag=f"--{side}-python", group="experiment", commands=("ab",), metavar="PATH",
                  help=f"Python interpreter of side {side.upper()} (a second compiler build)",
                  check=is_text, what="a path")


@dataclasses.dataclass(frozen=True)
class ExperimentOptions(OptionSet):
    """What an A/B compares and how often, given over its plan (`python -m harness ab`). Its plan keeps
    them (ab.Plan, its yaml): a corpus A/B's resume, which runs the stored plan, refuses any given."""

    repeats: int | str | None = option(
        flag="--repeats", group="experiment", commands=("ab", "bisect"), metavar="N|auto", type=repeats_value,
        help=f"replays per side (>= 2; default 3), or auto: {FIRST_REPEATS} per side, then one more per side a "
             "round for the rows whose verdict is still open, up to --max-repeats",
        check=valid_repeats_choice, what=f"an integer from 2 to {MAX_REPEATS}, or auto")
    max_repeats: int | None = option(
        flag="--max-repeats", group="experiment", commands=("ab", "bisect"), metavar="N", type=int,
        help=f"with --repeats auto: the most replays a side gives any row (default {DEFAULT_MAX_REPEATS})",
        check=valid_max_repeats, what=f"an integer from {FIRST_REPEATS} to {MAX_REPEATS}")
    resolve: float | None = option(
        flag="--resolve", group="experiment", commands=("ab",), metavar="X%", type=percent, show=percent_text,
        # argparse formats help with %: the percent sign doubled.
        help=f"with --repeats auto: the smallest change you care about, e.g. 0.5%%; a row is timed until it resolves "
             f"it or reaches --max-repeats (default {percent_text(DEFAULT_RESOLVE)}%)",
        check=valid_resolve, what=f"a percentage above {percent_text(MIN_RESOLVE)} (the margin a call clears) and "
                                  f"below {percent_text(MAX_RESOLVE)}")
    fdr: float | None = option(
        flag="--fdr", group="experiment", commands=("ab", "bisect"), metavar="Q", type=float,
        help=f"false discovery rate of the report's FASTER/SLOWER calls (default {FDR})",
        check=valid_fdr, what="a number between 0 and 1")
    a_env: tuple[str, ...] = _side_env("a")
    a_python: str | None = _side_python("a")
    b_env: tuple[str, ...] = _side_env("b")
    b_python: str | None = _side_python("b")
    step_start: str | None = option(
        flag="--step-start", group="experiment", commands=("ab",), choices=STEP_STARTS,
        help="how each step starts: prewarmed (each step forked by a warm worker of its own, with torch, triton "
             "and pytest imported, all of an op's begun before its first step: a new interpreter per step at "
             "fork's pace); fresh (a new process per step, imports included: slowest); fork (one warm worker per "
             "side forks every step: its repeats came out measurably more alike than fresh ones on an H200, "
             "noise understated) (default: prewarmed)",
        check=lambda v: v in STEP_STARTS, what=f"one of {', '.join(STEP_STARTS)}")
    chunk: int | None = option(
        flag="--chunk", group="experiment", commands=("ab",), metavar="K", type=int,
        help="time the repeats of up to K ops in one process a side (a measuring host per repeat and side, "
             "forked by a warm worker: one device start and one pytest start per chunk, not per op); each op's "
             "step keeps its run dir, a crash costs its op's rows and the chunk's later ops go on in a new "
             f"host; records and passes stay a process an op; 1 to {MAX_CHUNK} (default: 8 for a corpus A/B on the "
             "local executor, whose chunks each start an A/B; else 1, a process a step)",
        check=lambda v: type(v) is int and 1 <= v <= MAX_CHUNK, what=f"an integer from 1 to {MAX_CHUNK}")
    step_passes: str | None = option(
        flag="--step-passes", group="experiment", commands=("ab",), choices=STEP_PASSES,
        help="where IR collection and per-kernel attribution run: once per side (A's in its record, B's in a "
             "step of its own, B-passes; their timings no verdict uses, every repeat times only) or every "
             "(every step) (default: once)",
        check=lambda v: v in STEP_PASSES, what=f"one of {', '.join(STEP_PASSES)}")
    chunk_records: str | None = option(
        flag="--chunk-records", group="experiment", commands=("ab",), choices=CHUNK_RECORDS,
        help="where a chunk's records and B's passes run: first (all of them before the chunk's first repeat) "
             "or beside (each op's repeats begin as its passes end, while the next ops record; a timed row holds "
             "the device while it is timed, a record or passes step while its cases run the device, not while "
             "they compile, at a lower CPU priority; quicker, and on an H100 the repeats timed beside records "
             "spread more between processes) (default: first)",
        check=lambda v: v in CHUNK_RECORDS, what=f"one of {', '.join(CHUNK_RECORDS)}")
    record_jobs: int | None = option(
        flag="--record-jobs", group="experiment", commands=("ab",), metavar="J", type=int,
        help="with --chunk: how many of a chunk's ops record (and run B's passes) at once, no repeat timed "
             "meanwhile: their compiles share the host's cores, their cases the device, one at a time through a "
             "gate (no verdict reads their timings); a step that fails beside others runs again alone; "
             f"1 to {MAX_RECORD_JOBS} (default: 4 for a corpus A/B on the local executor whose chunks record "
             f"first, else {DEFAULT_RECORD_JOBS})",
        check=lambda v: type(v) is int and 1 <= v <= MAX_RECORD_JOBS,
        what=f"an integer from 1 to {MAX_RECORD_JOBS}")


def _bisect_option(flag: str, **declared):
    """An option of `bisect` alone, in its help group, checked as text (a path, a range, a command)
    where no other check is given."""
    return option(flag=flag, group="bisect", commands=("bisect",), **{"check": is_text, **declared})


@dataclasses.dataclass(frozen=True)
class BisectOptions(OptionSet):
    """What a bisect searches (its builds, its rows) and where it resumes (`python -m harness bisect`).
    Its bisect.json keeps them, resolved: a resume refuses any given again."""

    builds: Path | None = _bisect_option(
        "--builds", expect="file", metavar="FILE", type=Path,
        help="YAML: `builds:` an ordered list of ready builds, the good one first, each a side as an A/B plan's "
             "(label, python, env, requirements)", what="a path")
    git_range: str | None = _bisect_option(
        "--git-range", metavar="GOOD..BAD",
        help="instead of --builds: GOOD and each commit after it on BAD's first-parent line, each built with "
             "--build-cmd into a kept dir keyed by commit and command", what="GOOD..BAD")
    checkout: Path | None = _bisect_option(
        "--checkout", expect="dir", metavar="DIR", type=Path,
        help="with --git-range: the compiler's git checkout", what="a path")
    build_cmd: str | None = _bisect_option(
        "--build-cmd", metavar="CMD",
        help="with --git-range: the shell command that builds a commit's tree (its cwd) into the active venv "
             "(first on PATH), e.g. 'pip install --no-build-isolation ./python'", what="a command")
    build_cache: Path | None = _bisect_option(
        "--build-cache", expect="dir", metavar="DIR", type=Path,
        help="with --git-range: where the builds are kept (default: .nox/bisect-builds)",
        what="a path")
    from_ab: Path | None = _bisect_option(
        "--from-ab", expect="dir", metavar="AB_DIR", type=Path,
        help="bisect this A/B's FASTER/SLOWER rows (or those --rows names), replaying its A record",
        what="a path")
    rows: tuple[str, ...] | None = _bisect_option(
        "--rows", metavar="'OP DTYPE SHAPE'", nargs="+",
        help="with --from-ab: only these rows, named as its report names them (e.g. 'softmax fp16 4x16')",
        check=is_strings, what="a list of row names")
    resume: Path | None = _bisect_option(
        "--resume", expect="dir", metavar="BISECT_DIR", type=Path, stored=False,
        help="continue the bisect in BISECT_DIR: no probe it finished runs again, no build is built again",
        what="a path")
