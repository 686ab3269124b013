from reports import table


def row(**kw):
    base = {"op": "softmax", "dtype": "bf16", "shape": [4, 16], "status": "SUCCESS", "baseline_ms": 0.01,
            "candidate_ms": 0.02, "speedup": 0.5, "timer": "graph", "markers": []}
    return base | kw


def test_invariant_columns_fold_into_legend():
    out = table.render([row(), row(shape=[8, 16])], context={"backend": "cuda"})
    legend, header = out.splitlines()[:2]
    assert "backend=cuda" in legend and "op=softmax" in legend and "dtype=bf16" in legend
    assert "timer=graph" in legend
    assert "shape" in header and "dtype" not in header and "timer" not in header


def test_varying_columns_stay_and_failed_rows_show():
    out = table.render([row(), row(dtype="fp16", status="FAILED", baseline_ms=None, candidate_ms=None,
                                   speedup=None, timer=None, markers=["X"])])
    header = out.splitlines()[1]
    assert "dtype" in header and "status" in header and "markers" in header
    assert "FAILED" in out


def test_colour_only_when_asked():
    rows = [row(), row(status="FAILED")]
    assert "\033[" not in table.render(rows, color=False)
    assert "\033[31mFAILED" in table.render(rows, color=True)
