"""Batch triage fixtures (tests/test_triage.py): one op broken upstream, one broken only under zl_bench."""

import sys

import pytest

from . import base  # noqa: F401  (as upstream's files: what makes it a benchmark module)


@pytest.mark.broken_upstream
def test_broken_upstream():
    raise RuntimeError("broken upstream")


@pytest.mark.ours_only
def test_ours_only():
    # Our failure, made honest: it fails exactly when zl_bench's child runs it (its module is
    # loaded) and passes as upstream's own pytest node.
    if "harness.child" in sys.modules:
        raise RuntimeError("fails under zl_bench's child only")
