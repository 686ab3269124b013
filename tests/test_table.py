import re

import pytest
from conftest import run_dir_of

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


def test_a_clean_runs_folded_status_is_coloured_too():
    rows = [row(), row(shape=[8, 16])]
    assert "status=\033[32mSUCCESS\033[0m" in table.render(rows, color=True).splitlines()[0]
    assert "\033[" not in table.render(rows, color=False)


@pytest.mark.e2e
def test_color_always_colours_a_clean_runs_rows_and_keeps_run_log_plain(harness, tmp_path):
    shapes = tmp_path / "one.yaml"
    shapes.write_text("add: {shapes: [[2, 8], [4, 8]], dtypes: [fp32]}\n")
    proc = harness("record", "add", "--backend", "interpreter", "--shapes", shapes, "--out", tmp_path,
                   "--color", "always")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1/2] add fp32-2x8 \033[32mSUCCESS\033[0m " in proc.stdout
    assert "status=\033[32mSUCCESS" in proc.stdout
    assert "\033[" not in (run_dir_of(proc) / "run.log").read_text()


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


def test_markers_show_by_name_with_repeats_counted():
    rows = [row(markers=["TIMER_FALLBACK phase=capture reason=recoverable detail='x'",
                         "AUTOTUNE_REPLAY_FALLBACK kernel=a reason=key_missing",
                         "AUTOTUNE_REPLAY_FALLBACK kernel=b reason=key_missing"]),
            row(shape=[8, 16], markers=["CLOCK_THROTTLED reasons=sw_power_cap kind=power_cap sm_clock_mhz=1980->1755"])]
    out = table.render(rows)
    assert "TIMER_FALLBACK, AUTOTUNE_REPLAY_FALLBACK x2" in out and "CLOCK_THROTTLED" in out
    assert "kernel=" not in out and "reasons=" not in out  # the details stay in results.json


@pytest.mark.parametrize("statuses", [("FAILED", "FAILED"), ("SUCCESS", "ERROR"), ("SKIPPED", "SKIPPED")])
def test_a_run_with_rows_that_did_not_succeed_shows_status_and_error(statuses):
    error = "AssertionError: candidate disagrees with baseline: Mismatched elements: 3 / 64 (4.7%)\nmore"
    rows = [row(status=s, error=None if s == "SUCCESS" else error, shape=[i + 1]) for i, s in enumerate(statuses)]
    lines = table.render(rows).splitlines()
    header = lines[1].split()
    assert header[0] == "status" and header[-1] == "error"
    failed = [ln for ln in lines[3:] if ln.split()[0] != "SUCCESS"]
    assert failed and all("AssertionError: candidate disagrees with baseline: Mismat..." in ln for ln in failed)
    assert "more" not in "\n".join(lines)  # the first line only


def test_a_run_whose_rows_all_succeeded_has_no_error_column():
    lines = table.render([row(), row(shape=[8])]).splitlines()
    assert "status=SUCCESS" in lines[0] and "error" not in lines[1] and "status" not in lines[1]


KERNELS = [{"name": "softmax_kernel_with_a_very_long_templated_name<float, 4, 128>", "launches_per_call": 1,
            "time_ms": 0.009, "share": 0.905},
           {"name": "fill", "launches_per_call": 2, "time_ms": 0.0006, "share": 0.06},
           {"name": "copy", "launches_per_call": 1, "time_ms": 0.0002, "share": 0.02},
           {"name": "tail", "launches_per_call": 1, "time_ms": 0.0001, "share": 0.015}]


def test_profiled_rows_list_their_top_kernels_below_the_table():
    out = table.render([row(case="bf16-4x16", kernels=KERNELS), row(case="bf16-8x16", shape=[8, 16])])
    below = out.split("\n\n", 1)[1].splitlines()
    assert below[0].split()[:2] == ["case", "top"]
    (line,) = [ln for ln in below if ln.startswith("bf16-")]  # the unprofiled row gets no line
    assert line.startswith("bf16-4x16")
    assert "softmax_kernel_with_a_very_long_templ... 90%, fill 6% (x2), copy 2%, +1 more" in line


def test_no_kernels_table_without_profiled_rows():
    assert "top kernels" not in table.render([row(), row(shape=[8])])
