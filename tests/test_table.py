import re

import pytest

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


def test_timings_that_are_not_performance_numbers_say_so_and_derive_nothing():
    rows = [row(gbps=12.5, tflops=0.3), row(shape=[8, 16], gbps=25.0, tflops=0.6)]
    measured = table.render(rows, context={"backend": "cuda"})
    assert "speedup" in measured and "GB/s" in measured and "0.500x" in measured
    out = table.render(rows, context={"backend": "interpreter"}, performance=False)
    note, legend, header = out.splitlines()[:3]
    assert note == table.not_performance_note("interpreter") and "'interpreter'" in note
    assert "baseline ms" in header and "candidate ms" in header
    below = out.split("\n", 1)[1]
    assert not any(h in below for h in ("speedup", "GB/s", "TFLOP/s", "0.500x", "12.5"))
    assert out.count("not performance numbers") == 1


@pytest.mark.e2e
def test_an_interpreter_run_prints_its_timings_without_ratios(harness, tmp_path):
    proc = harness("record", "add", "--backend", "interpreter", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row_lines = [line for line in proc.stdout.splitlines() if re.match(r"\[\d+/\d+\] add ", line)]
    assert row_lines and all(re.search(r"baseline [\d.]+ ms  candidate [\d.]+ ms  timer=host$", line)
                             for line in row_lines), row_lines
    summary = proc.stdout.split(" results ", 1)[1].splitlines()[1:]
    assert summary[0] == table.not_performance_note("interpreter")
    header = next(line for line in summary if "baseline ms" in line)
    assert "speedup" not in header and "GB/s" not in header
