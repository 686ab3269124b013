"""results.json typed (harness.core.results): a row reads back as exactly what was written, and a
file or row that is not what the child writes is refused in one line naming the file."""

import json
import math

import pytest

from harness.core import results
from harness.core.results import ResultRow, ResultsError

# Every field as the child writes it, the optional ones present.
FULL = {
    "op": "softmax", "dtype": "fp16", "shape": [4, 16], "params": {"M": 4, "N": 16}, "case": "fp16-4x16",
    "status": "SUCCESS", "baseline_ms": 0.02, "candidate_ms": 0.01, "speedup": 2.0, "timer": "graph",
    "measures_performance": True, "input_sha256": "ab" * 32,
    "samples": {"baseline": {"n": 2, "median": 0.02, "raw": [0.02, 0.02]},
                "candidate": {"n": 2, "median": 0.01, "raw": [0.01, 0.01]}},
    "markers": ["CLOCK_THROTTLED reasons=sw_power_cap kind=power_cap"], "configs": {"k": "BLOCK=64"},
    "nodeid": "cases.py::test_op[fp16-4x16]", "gbps": 12.5, "tflops": 0.5, "numel": 64,
    "benchmark": "GenericBenchmark", "error": "boom", "kernels": [{"name": "softmax_kernel", "share": 1.0}],
    "gpu_state": {"before": {"sm_clock_mhz": 1980}, "after": {"sm_clock_mhz": 1755}},
}
# A row with nothing optional: a case skipped before it built its inputs.
BARE = {"op": "add", "dtype": "fp32", "shape": None, "params": {}, "case": "fp32-8", "status": "SKIPPED",
        "baseline_ms": None, "candidate_ms": None, "speedup": None, "timer": None, "measures_performance": False,
        "input_sha256": None, "markers": [], "configs": {}, "nodeid": "cases.py::test_op[fp32-8]"}


def write(run_dir, data):
    run_dir.mkdir(exist_ok=True)
    (run_dir / "results.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return run_dir


@pytest.mark.parametrize("row", [FULL, BARE], ids=["full", "bare"])
def test_a_row_reads_back_as_written_and_writes_back_the_same(tmp_path, row):
    (got,) = results.read_results(write(tmp_path / "run", {"format": 1, "rows": [row]}))
    assert got.to_dict() == row and list(got.to_dict()) == list(row)  # the keys in the child's order too
    (tmp_path / "again").mkdir()
    results.write_results(tmp_path / "again", [results.encode_row(got)])
    assert json.loads((tmp_path / "again" / "results.json").read_text()) == {"format": 1, "rows": [row]}


def test_the_typed_fields_and_what_stays_absent():
    full, bare = ResultRow.from_dict(FULL, "t"), ResultRow.from_dict(BARE, "t")
    assert full.metrics == {"gbps": 12.5, "tflops": 0.5, "numel": 64}
    assert full.key == ("softmax", "fp16", (4, 16)) and bare.key == ("add", "fp32", ())
    assert (bare.samples, bare.error, bare.kernels, bare.gpu_state, bare.benchmark, bare.metrics) == (
        None, None, None, None, None, {})
    assert "error" not in bare.to_dict() and "samples" not in bare.to_dict()


@pytest.mark.parametrize(("data", "says"), [
    ('{"rows": [', "not JSON"),
    ([], "not an object"),
    ({"rows": []}, "format None, expected 1"),
    ({"format": 2, "rows": []}, "format 2, expected 1"),
    ({"format": 1}, "it holds no 'rows' list"),
    ({"format": 1, "rows": [BARE, "x"]}, "row 1: not an object"),
    ({"format": 1, "rows": [{k: v for k, v in BARE.items() if k != "nodeid"}]}, "row 0: lacks nodeid"),
    ({"format": 1, "rows": [{**BARE, "candidate_ms": "1.0"}]}, "row 0: candidate_ms is '1.0', not of type"),
    ({"format": 1, "rows": [{**BARE, "markers": None}]}, "row 0: markers is None, not of type"),
    # Whether a row's numbers are performance numbers is a bool (a row without it: its run's backend says).
    ({"format": 1, "rows": [{**BARE, "measures_performance": "no"}]},
     "row 0: measures_performance is 'no', not of type"),
    ({"format": 1, "rows": [{**BARE, "status": "PASS"}]}, "row 0: status 'PASS' not one of"),
    ({"format": 1, "rows": [{**BARE, "gbps": "fast"}]}, "row 0: gbps is 'fast', not a number"),
    ({"format": 1, "rows": [{**BARE, "extra": 1}]}, "row 0: unknown field(s) 'extra'"),
    # JSON as Python reads and writes it (NaN, Infinity), and a negative latency: they reached the statistics.
    ({"format": 1, "rows": [{**BARE, "candidate_ms": math.nan}]},
     "row 0: candidate_ms is nan, not a finite number >= 0"),
    ({"format": 1, "rows": [{**BARE, "baseline_ms": -1.0}]}, "row 0: baseline_ms is -1.0, not a finite number >= 0"),
    ({"format": 1, "rows": [{**BARE, "gbps": math.inf}]}, "row 0: gbps is inf, not a number"),
    ({"format": 1, "rows": [{**BARE, "samples": {"candidate": {"raw": [1.0, -math.inf]}}}]},
     "row 0: samples hold -inf, not a finite number"),
])
def test_a_file_that_is_not_results_is_refused_in_one_line_naming_it(tmp_path, data, says):
    run_dir = write(tmp_path / "run", data)
    with pytest.raises(ResultsError) as exc:
        results.read_results(run_dir)
    message = str(exc.value)
    assert message.startswith(f"{run_dir / 'results.json'} does not read as results: ") and says in message
    assert "\n" not in message


def test_a_run_dir_without_results_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ResultsError, match=r"results\.json does not read as results: No such file"):
        results.read_results(tmp_path)


@pytest.mark.parametrize(("backend", "measures"), [("interpreter", False), ("cuda", True)])
def test_a_row_written_before_rows_said_whether_they_measure_is_told_by_its_runs_backend(tmp_path, backend, measures):
    # A record kept from before the field existed still replays and compares: its rows read as its backend says.
    old = {k: v for k, v in BARE.items() if k != "measures_performance"}
    run = write(tmp_path / "run", {"format": 1, "rows": [old]})
    (run / "run.json").write_text(json.dumps({"spec": {"backend": backend}}))
    (got,) = results.read_results(run)
    assert got.measures_performance is measures


def test_an_old_row_whose_run_names_no_backend_is_refused_in_one_line(tmp_path):
    old = {k: v for k, v in BARE.items() if k != "measures_performance"}
    run = write(tmp_path / "run", {"format": 1, "rows": [old]})
    with pytest.raises(results.ResultsError, match="do not say whether they are performance numbers") as info:
        results.read_results(run)
    assert "\n" not in str(info.value)
