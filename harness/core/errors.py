"""Errors every layer raises and the command line reports."""

import re


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""

    exit_code = 2


class DtypeRejected(UsageError):
    """An operator does not take a requested dtype. Bad input with an exit code of its own, so a
    batch tells it from any other failure and reruns the op with the dtypes it takes."""

    # Not 4: pytest's own usage-error code comes back through a record whose child could not run.
    exit_code = 65


# The most of an input's value an error echoes: a line a person reads, whatever the input held.
ECHO_CHARS = 200


def clip(value, limit: int = ECHO_CHARS) -> str:
    """`value`'s repr (one line, whatever it holds) as an error echoes it, cut by clip_text: a 4 MB
    shape list or a million-character key then costs one line, not a 300 MB one."""
    return clip_text(repr(value), limit)


def clip_text(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` (an input's words, a parser's message quoting them) cut to `limit` characters, with a
    note of how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more chars)"


def clip_words(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` with each run of characters without a space longer than `limit` cut by clip_text: the one
    guard every error line passes as it is printed (harness.cli), whatever a message echoed whole."""
    return re.sub(rf"\S{{{limit + 1},}}", lambda m: clip_text(m.group(), limit), text)
