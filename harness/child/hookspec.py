"""The hooks the child's plugins talk through, declared once (the runner adds them with
`pytest_addhooks`). Whoever starts a case calls the hook; pluggy calls every plugin implementing
it, whatever order the plugins were listed in. A plugin's service used by one other plugin (the
timer, the autotune patch, the results) is handed to it by the runner instead (harness.child.runner)."""

import pytest


@pytest.hookspec
def pytest_zl_case_started(case_id: str, shape_label: str | None) -> None:
    """A case begins: `case_id` as its row will name it ("fp16-4x16"), `shape_label` its shapes
    ("4x16"; None for a test that is not one of our cases, e.g. a FlagGems node failing as a whole).
    The IR collector files what launches from here on under `shape_label`."""


@pytest.hookspec
def pytest_zl_row_ready(row: dict) -> None:
    """A case's row is built, right after its measurement, and about to be written and shown: a
    plugin may add its own fields and append markers (the GPU state plugin adds `gpu_state`)."""
