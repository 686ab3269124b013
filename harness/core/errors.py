"""Errors every layer raises and the command line reports."""


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""
