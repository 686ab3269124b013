"""Every file the harness reads, read here: from a regular file only, and never more of it than its
kind may hold (CAPS), so a run dir whose results.json is a link to /dev/zero, a FIFO or a
multi-gigabyte file is refused in one line naming the file, what it is and the cap, instead of
hanging the reader or filling memory until the kernel kills it. YAML is read without aliases
(NoAliasLoader): our files never need them, and a few hundred bytes of nested aliases otherwise
expand to hundreds of millions of items. `path_problem` says what a path is when it is not what a
command expected (a directory given for a file, a file for a run dir, a device, a program that is
not executable), rather than that it does not exist."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from harness.core.errors import UsageError, clip, clip_text

MiB = 1024 * 1024
# The most a file of each kind may hold. Each is far above what the harness writes (a results.json
# of a FlagGems op with 1,000 raw samples per side and row is a few MB) and far below what a host
# can hold in memory; a reader names its file's kind, and rundir.read_json finds it by file name.
CAPS = {
    "run.json": 16 * MiB,
    "results.json": 256 * MiB,
    "batch.json": 64 * MiB,
    "ab.json": 16 * MiB,  # a single-op A/B's steps
    "report.json": 256 * MiB,  # an A/B's report
    "jobs.json": 16 * MiB,  # a Slurm driver's tasks in flight
    "bisect.json": 16 * MiB,  # a bisect's spec and its probes' verdicts
    "autotune records": 64 * MiB,
    "device facts": 1 * MiB,
    # YAML is parsed in Python at about 1 MB/s: a cap of seconds, not minutes.
    "shape file": 4 * MiB,
    "plan": 1 * MiB,
    "builds file": 1 * MiB,  # a bisect's ordered builds, each a side as a plan's
    "requirements file": 1 * MiB,
    "ops file": 4 * MiB,
    "dismiss list": 4 * MiB,
    "inventory": 16 * MiB,
    "ops_status.csv": 64 * MiB,
    "completion marker": 4096,
    "IR index": 64 * MiB,
    "IR statistics": 64 * MiB,
    "IR file": 64 * MiB,
    "compiled kernel file": 256 * MiB,  # a Triton cache entry's stage (cubin, ptx, ...)
    "Python source": 16 * MiB,
    "log": 64 * MiB,  # only its tail is read (read_tail): the whole of a log may be larger
}
# A file's kind by its name, for readers that are handed a path (rundir.read_json).
KIND_OF_NAME = {name: name for name in ("run.json", "results.json", "batch.json", "ab.json", "report.json",
                                        "jobs.json", "ops_status.csv", "bisect.json")}


class InputRefused(UsageError, ValueError):
    """A file refused as input: not a regular file, over its kind's cap, not text, nested past what
    Python parses, or not what its kind holds (a corrupt IR index). One line naming the file. A
    ValueError too, so a reader that turns a corrupt file into its own error (or treats it as
    absent) does so with this one."""


def size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def what_it_is(path: Path | str) -> str:
    """What is at `path`, in words: 'a directory', 'a FIFO', 'a symlink to /dev/zero (a character
    device)', 'a broken symlink to X', 'nothing'."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "nothing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not stat.S_ISLNK(st.st_mode):
        return _file_type(st.st_mode)
    target = os.readlink(path)
    try:
        return f"a symlink to {target} ({_file_type(os.stat(path).st_mode)})"
    except OSError:
        return f"a broken symlink to {target}"


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


EXPECTED = {"file": "a regular file", "dir": "a directory", "executable": "an executable file"}


def path_problem(path: Path | str, expect: str) -> str | None:
    """Why `path` is not what is expected ('file', 'dir' or 'executable'), as the rest of a sentence
    that starts with the path ('does not exist', 'is a directory, not a regular file'); None when
    it is. Links are followed, as a reader would follow them."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        found = what_it_is(path)
        return "does not exist" if found == "nothing" else f"is {found}"
    except OSError as exc:
        return f"cannot be looked at: {exc.strerror}"
    fits = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "executable": stat.S_ISREG}[expect](st.st_mode)
    if not fits:
        return f"is {what_it_is(path)}, not {EXPECTED[expect]}"
    if expect == "executable" and not os.access(path, os.X_OK):
        return "is a regular file that is not executable (no x permission)"
    return None


def _not_regular(path: Path, kind: str) -> InputRefused:
    return InputRefused(f"{path} is {what_it_is(path)}, not a regular file: a {kind} is read only from a regular "
                        f"file of at most {size_text(CAPS[kind])}")


def _over_cap(path: Path, kind: str) -> InputRefused:
    return InputRefused(f"{path} holds more than {size_text(CAPS[kind])}, the most a {kind} may hold: refused")


def _open_regular(path: Path, kind: str) -> int:
    """A descriptor on `path`, a regular file (checked before opening, so a device is never opened,
    and after, on what was opened). Non-blocking, so a FIFO that slips in between cannot hang."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.lexists(path):  # a broken link is there, pointing nowhere: said so
            raise _not_regular(path, kind) from None
        raise  # a missing file: the caller's to say
    if not stat.S_ISREG(mode):
        raise _not_regular(path, kind)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_regular(path, kind)
    return fd


def read_bounded(path: Path | str, kind: str) -> bytes:
    """The bytes of the regular file `path`, at most CAPS[kind] of them; InputRefused when it is
    not a regular file or holds more; OSError as open() raises it (a missing file)."""
    path, cap = Path(path), CAPS[kind]
    fd = _open_regular(path, kind)
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)  # one byte more than the cap tells a larger file (its size may lie: /proc's)
    if len(data) > cap:
        raise _over_cap(path, kind)
    return data


def read_text(path: Path | str, kind: str) -> str:
    """read_bounded as UTF-8 text; InputRefused naming the first byte that is not."""
    data = read_bounded(path, kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefused(f"{path} is not UTF-8 text (byte {exc.start}): a {kind} is text") from exc


def read_lines(path: Path | str, kind: str) -> list[str]:
    """A list file's entries (an ops file, a requirements file): its lines without their `#` comments,
    blank ones left out; InputRefused saying what the path is where it is not a file."""
    problem = path_problem(path, "file")
    if problem is not None:
        raise InputRefused(f"{path} {problem}")
    text = read_text(path, kind)
    if "\0" in text:  # its entries become arguments (pip's, an op's), which no NUL can be in: a traceback
        raise InputRefused(f"{path} holds a NUL byte (at {text.index(chr(0))}): a {kind} is text, one entry a line")
    return [entry for line in text.splitlines() if (entry := line.split("#")[0].strip())]


def read_tail(path: Path | str, kind: str = "log") -> str:
    """The last CAPS[kind] bytes of the regular file `path`, as text (bytes that are not UTF-8
    replaced): what a reader of a log wants is its end, however long the log grew."""
    path, cap = Path(path), CAPS[kind]
    fd = _open_regular(path, kind)
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, os.fstat(fd).st_size - cap))
        return f.read(cap).decode("utf-8", errors="replace")


def read_json(path: Path | str, kind: str | None = None) -> Any:
    """The JSON in `path` (a file of `kind`, by default the kind its name says: KIND_OF_NAME);
    ValueError (json's own) when it is not JSON, InputRefused as read_text refuses it or when it
    nests deeper than the parser can go."""
    kind = kind or KIND_OF_NAME[Path(path).name]
    text = read_text(path, kind)
    try:
        return json.loads(text)
    except RecursionError:
        raise InputRefused(f"{path} nests arrays or objects deeper than can be read: not a {kind}") from None


class NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses an alias (`*name`, and so `<<: *name`): each one would be a
    shared copy of its anchor's node, and nested they multiply (a 355-byte file read as 10^8 items)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(None, None, f"found alias *{event.anchor}: aliases and anchors are "
                                              "not read (write the value out)", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """yaml.safe_load, without aliases; yaml.YAMLError as it raises, and for a document nested too
    deep to compose (RecursionError), holding a number Python will not convert (ValueError), or a
    string holding a NUL ("\\0" escaped): no path, name, argument or environment value can carry one,
    and the first os call given it raised a traceback."""
    try:
        data = yaml.load(text, Loader=NoAliasLoader)
    except RecursionError:
        raise yaml.YAMLError("nested deeper than can be read") from None
    except ValueError as exc:  # int() of a scalar with more digits than Python converts
        raise yaml.YAMLError(str(exc)) from None
    todo = [data]
    while todo:
        item = todo.pop()
        if isinstance(item, str) and "\0" in item:
            raise yaml.YAMLError(f"the string {clip_text(repr(item))} holds a NUL character (\\0), which no value "
                                 "may hold")
        if isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            todo += item
    return data


# A stored mapping's fields and what each must be: name -> (check, what it must be, said in the refusal).
Fields = dict[str, tuple[Any, str]]


def finite_number(value) -> bool:
    """A field's number as JSON and YAML read it back: an int or float (not a bool), neither NaN nor infinite."""
    return type(value) in (int, float) and math.isfinite(value)


def field_problem(where: str, data: Any, fields: Fields, required: bool = True) -> str | None:
    """The first field of `data` (a mapping read back from a file) its check refuses, as `where.field = value
    is not WHAT`; None when every one passes. A missing field is refused (`where has no 'field'`) where
    `required`, else checked as None (its check says whether it may be left out)."""
    if not isinstance(data, dict):
        return f"{where} is {clip(data)}, not a mapping"
    for name, (check, what) in fields.items():
        if required and name not in data:
            return f"{where} has no '{name}'"
        if not check(data.get(name)):
            return f"{where}.{name} = {clip(data.get(name))} is not {what}"
    return None
