"""A batch selection naming an op that does not exist says which ones do: the nearest names, and the ops
that can run here (all of them while they are few, how many when they are not), as record and ab do."""

import pytest

from harness.providers import catalog
from harness.providers.catalog import Entry


def builtin(op: str) -> Entry:
    return Entry("builtin", op, op, f"ops/{op}.py")


BUILTIN = [builtin(op) for op in ("add", "gelu", "mm", "rms_norm", "softmax")]


def error_of(entries, specs, runnable=None) -> str:
    with pytest.raises(catalog.SelectionError) as info:
        catalog.select(entries, specs, False, None, {}, runnable)
    return str(info.value)


def test_an_unknown_op_names_the_nearest_and_what_is_known_here():
    # A FlagGems inventory whose checkout is not given runs nowhere here: not among the ops offered.
    flaggems = [Entry("flaggems", "softmax_out", "softmax", "benchmark/test_softmax.py")]
    assert error_of(BUILTIN + flaggems, ["sofmax"], runnable={"builtin"}) == (
        "bad operator selection: 'sofmax': unknown (did you mean softmax?); "
        "known here: builtin: add, gelu, mm, rms_norm, softmax")


def test_an_op_named_in_a_repo_is_looked_up_in_that_repo():
    flaggems = [Entry("flaggems", "softmax_out", "softmax", "benchmark/test_softmax.py")]
    assert error_of(BUILTIN + flaggems, ["flaggems:softmax_ot"], runnable={"builtin"}).startswith(
        "bad operator selection: 'flaggems:softmax_ot': unknown (did you mean softmax_out?); known here: ")


def test_too_many_ops_to_list_are_counted():
    many = [builtin(f"op{i}") for i in range(catalog.MAX_LISTED + 1)]
    assert error_of(many, ["zzz"]) == (f"bad operator selection: 'zzz': unknown; {catalog.MAX_LISTED + 1} ops known "
                                       "here (ops/inventory_*.csv, --ops-path, --flaggems-dir)")
