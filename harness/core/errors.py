"""Errors every layer raises and the command line reports."""


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""

    exit_code = 2


class DtypeRejected(UsageError):
    """An operator does not take a requested dtype. Bad input with an exit code of its own, so a
    batch tells it from any other failure and reruns the op with the dtypes it takes."""

    # Not 4: pytest's own usage-error code comes back through a record whose child could not run.
    exit_code = 65
