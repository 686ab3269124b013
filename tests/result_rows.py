"""A results.json row as the child writes it (harness.child.plugins.results.make_row), for tests
that write run dirs by hand: the fields a test does not name hold plain values."""

import dataclasses

from harness.core.results import ResultRow


def result_row(op="add", dtype="fp32", shape=(8,), status="SUCCESS", **fields) -> dict:
    row = ResultRow(op=op, dtype=dtype, shape=None if shape is None else list(shape), params={}, case=f"{dtype}-x",
                    status=status, baseline_ms=None, candidate_ms=None, speedup=None, timer=None, input_sha256=None,
                    markers=[], configs={}, nodeid="test_op", measures_performance=True)
    return dataclasses.replace(row, **fields).to_dict()
