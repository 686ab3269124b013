"""Numbers that cannot mislead: on a backend whose timings are not performance numbers (the
interpreter), every row of every file a record, an A/B and a batch leave behind that shows a timing,
or a number computed from timings, says so in the row itself (`measures_performance` false in a JSON
or CSV row, the NOT_PERFORMANCE flag in a Markdown or HTML table row, the note above a log's first
timing). Files are discovered, not listed, so a new output file is checked too, and a file of a kind
no rule here covers fails the test until one does.

Also the surprises of the same reports: the corpus plot counting other rows than its headline, the
corpus page hiding latencies the other reports show, skipped rows counted as ran or as degraded, and
replay's default run being one it then refuses."""

import csv
import html
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml
from conftest import alive, load, run_dir_of, run_harness
from result_rows import result_row

import backends
from harness import cli
from harness.core import launch, rundir
from harness.core.errors import UsageError
from harness.core.outcome import COMPLETE, INCOMPLETE, Outcome
from harness.sessions import resolve, run
from reports import ab_report, compare, corpus_html, stats, table

# Tokens of a field or column name that holds a timing or a number computed from timings.
PERF_TOKENS = {"ms", "speedup", "gbps", "tflops", "ratio", "lo", "hi", "median", "mean", "std", "sd", "min", "max",
               "latency", "raw", "q", "p", "gm", "geomean"}
# Budgets and stopping rules a run was given, not anything it measured.
SETTINGS = {"warmup_ms", "rep_ms", "max_noise"}
DECIMAL = re.compile(r"\d\.\d")
# A log line that shows a timing: a latency in a row line, or a results or A/B table's header.
TIMING_LINE = re.compile(r"\d\.\d+ ms\b|\bbaseline ms\b|\bA ms\b")
NOTE = table.not_performance_note("interpreter")
# The kinds of file with rows each pipeline leaves (at least).
ROW_KINDS = {"record": {".json", ".yaml", ".log"}, "ab": {".json", ".csv", ".md", ".html", ".log"},
             "batch": {".json", ".csv", ".log"}}
# Files that hold no row: plots (under the note they draw no ratio: tests/test_ab.py), locks and markers.
NO_ROWS = {".png", ".lock", ".owner", ".complete"}


def is_perf_key(name: str) -> bool:
    tokens = re.split(r"[^a-z0-9]+", name.lower())
    return name not in SETTINGS and any(t in PERF_TOKENS or re.fullmatch(r"p\d+", t) for t in tokens)


def holds_number(value) -> bool:
    if isinstance(value, list):
        return any(holds_number(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def unmarked_data(node, where: str, covered: bool = False) -> list[str]:
    """The perf numbers in parsed JSON/YAML not covered by `measures_performance: false` on their
    row: a dict in a list (a row) must carry it itself; anything else may inherit it from above."""
    found = []
    if isinstance(node, dict):
        covered = covered or node.get("measures_performance") is False
        for key, value in node.items():
            if is_perf_key(str(key)) and holds_number(value) and not covered:
                found.append(f"{where}.{key}")
            found += unmarked_data(value, f"{where}.{key}", covered)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += unmarked_data(value, f"{where}[{i}]", covered and not isinstance(value, dict))
    return found


def unmarked_csv(path: Path) -> list[str]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    found = []
    for i, row in enumerate(rows, start=2):
        numbers = [c for c, v in row.items() if is_perf_key(c) and v not in ("", None, stats.NOT_APPLICABLE)]
        if numbers and row.get("measures_performance") != "False":
            found.append(f"line {i}: {', '.join(numbers)} without measures_performance False")
    return found


def unmarked_markdown(path: Path) -> list[str]:
    found, previous = [], ""
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        # A table's data rows: its lines after the header (the first) and the |---| rule.
        is_row = line.startswith("|") and previous.startswith("|") and not re.fullmatch(r"\|[-:| ]+\|", line)
        if is_row and DECIMAL.search(line) and table.NOT_PERFORMANCE not in line:
            found.append(f"line {i}: {line}")
        previous = line
    return found


def unmarked_html(path: Path) -> list[str]:
    page = path.read_text()
    units = []
    for body in re.findall(r"<tbody([^>]*)>(.*?)</tbody>", page, re.S):
        attrs, inner = body
        # A row of the rows table is a tbody (its main line and its drill-down); elsewhere each tr is one.
        units += [inner] if 'id="row-' in attrs else re.findall(r"<tr.*?</tr>", inner, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", " ", u))[:160] for u in units
            if DECIMAL.search(u) and table.NOT_PERFORMANCE not in u]


def unmarked_log(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    first = next((i for i, line in enumerate(lines) if TIMING_LINE.search(line)), None)
    if first is None or any(line.startswith(NOTE) for line in lines[:first]):
        return []
    return [f"line {first + 1} shows a timing before any note: {lines[first]}"]


def unmarked(path: Path) -> list[str]:
    """What in `path` shows a perf number without saying, in its row, that it is none."""
    kind = path.suffix or path.name
    if kind == ".json":
        return unmarked_data(load(path), path.name)
    if kind == ".yaml":
        return unmarked_data(yaml.safe_load(path.read_text()), path.name)
    if kind == ".csv":
        return unmarked_csv(path)
    if kind == ".md":
        return unmarked_markdown(path)
    if kind == ".html":
        return unmarked_html(path)
    if kind == ".log":
        return unmarked_log(path)
    if kind in NO_ROWS:
        return []
    return [f"no rule here says how a {kind!r} file marks its numbers: add one"]


def left_running(before: set[int]) -> list[int]:
    """Our children, not in `before`, still running after a grace (the harness runs' workers end with them)."""
    deadline = time.monotonic() + 30
    while (left := [p for p in launch.children() if p not in before and alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def last_line_dir(proc, prefix: str) -> Path:
    for line in proc.stdout.splitlines():
        if line.startswith(prefix):
            return Path(line[len(prefix):].strip())
    raise AssertionError(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def interpreter_outputs(tmp_path_factory):
    """A record (bf16 rows skipped where the interpreter miscomputes bf16), a corpus A/B of one op
    (its op's single A/B dir inside) and a batch, on the interpreter: {name: (dir, process)}."""
    out = tmp_path_factory.mktemp("honest")
    before = set(launch.children())
    recorded = run_harness("record", "softmax", "--backend", "interpreter", "--dtypes", "fp32,bf16",
                           "--out", out / "record")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    ab = run_harness("ab", "--ops", "builtin:add", "--devices", "0", "--repeats", "2", "--backend", "interpreter",
                     "--out", out / "ab")
    assert ab.returncode == 0, ab.stdout + ab.stderr
    batch = run_harness("batch", "--ops", "builtin:add", "builtin:softmax", "--backend", "interpreter",
                        "--out", out / "batch")
    assert batch.returncode == 0, batch.stdout + batch.stderr
    assert not left_running(before)
    return {"record": (run_dir_of(recorded), recorded), "ab": (last_line_dir(ab, "batch dir: "), ab),
            "batch": (last_line_dir(batch, "batch dir: "), batch)}


@pytest.mark.e2e
@pytest.mark.parametrize("pipeline", ["record", "ab", "batch"])
def test_every_row_of_every_output_file_says_its_numbers_are_not_performance(interpreter_outputs, pipeline):
    out_dir, _ = interpreter_outputs[pipeline]
    files = sorted(p for p in out_dir.rglob("*") if p.is_file())
    # The kinds of file that carry rows are there to check: a renamed or moved output must not pass
    # as nothing to see.
    assert ROW_KINDS[pipeline] <= {p.suffix or p.name for p in files}
    problems = {str(p.relative_to(out_dir)): found for p in files if (found := unmarked(p))}
    assert not problems, json.dumps(problems, indent=1)


@pytest.mark.e2e
def test_the_rows_that_carry_numbers_carry_the_marker(interpreter_outputs):
    # The rows the walk above judges are the ones that carry the numbers: it cannot pass by finding none.
    record_dir, _ = interpreter_outputs["record"]
    rows = load(record_dir / rundir.RESULTS_JSON)["rows"]
    assert rows and all(r["measures_performance"] is False for r in rows)
    batch_dir, _ = interpreter_outputs["batch"]
    with open(batch_dir / "summary.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    assert summary and all(r["measures_performance"] == "False" and float(r["speedup"]) > 0 for r in summary)
    ab_batch, _ = interpreter_outputs["ab"]
    report = load(ab_batch / "report.json")
    assert report["rows"] and all(r["measures_performance"] is False for r in report["rows"] + report["ops"])
    (op_report,) = ab_batch.glob("ops/*/attempt*/ab_*/report.json")
    assert all(r["measures_performance"] is False and r["comparison"]["ratio"] > 0 for r in load(op_report)["rows"])


@pytest.mark.e2e
def test_the_corpus_page_shows_the_latencies_and_counts_the_headline_rows_its_headline_counts(
        interpreter_outputs):
    ab_batch, _ = interpreter_outputs["ab"]
    data = load(ab_batch / "report.json")
    page = (ab_batch / "report.html").read_text()
    for row in data["rows"]:
        # The latencies report.md and report.json give, with the row's flag saying what they are.
        body = re.search(rf'<tbody id="row-{re.escape(html.escape(row["id"]))}".*?</tbody>', page, re.S).group(0)
        for side in ("a", "b"):
            assert f">{row[side]['gm_ms']:.4f}</td>" in body
        assert table.NOT_PERFORMANCE in body
    headline = data["summary"]["headline_rows"]
    assert headline > 0 and f"rows: {headline} of {data['summary']['rows']} in the headline" in page
    (ax,) = corpus_html.figure(data).axes
    assert f"B/A of {headline} headline rows: not plotted" in ax.get_title()


@pytest.mark.parametrize(("plotted", "headline", "performance", "title"), [
    (6, 6, True, "B/A of 6 headline rows"),
    (4, 6, True, "B/A of 4 of 6 headline rows (2 without a ratio)"),
    (0, 6, False, "B/A of 6 headline rows: not plotted, the timings are not performance numbers"),
])
def test_the_plot_title_counts_the_headline_rows(plotted, headline, performance, title):
    assert corpus_html.plot_title(plotted, headline, performance) == title


@pytest.mark.e2e
def test_skipped_rows_are_counted_apart_and_never_as_degraded(interpreter_outputs):
    if backends.get("interpreter").dtype_problem("bf16") is None:
        pytest.skip("this Triton's interpreter computes bf16 right: no row is skipped")
    _, proc = interpreter_outputs["record"]
    assert "record ok: 2/4 rows, 2 skipped; run dir: " in proc.stdout
    assert "degraded measurement" not in proc.stdout


@pytest.mark.parametrize(("outcome", "skipped", "line"), [
    (Outcome(COMPLETE, 4, 4, exit_code=0), 2, "record ok: 2/4 rows, 2 skipped"),
    (Outcome(COMPLETE, 4, 4, exit_code=0), 0, "record ok: 4/4 rows"),
    (Outcome(COMPLETE, 4, 4, exit_code=1), 1, "record finished with failures (exit 1): 3/4 rows, 1 skipped"),
    (Outcome(INCOMPLETE, 3, 4, reason="interrupted", exit_code=130), 1,
     "record INCOMPLETE: 2/4 rows, 1 skipped, interrupted"),
])
def test_the_last_line_counts_skipped_rows_apart(outcome, skipped, line):
    assert run.summary_line("record", outcome, skipped=skipped) == line


def _run_dir(path: Path, candidate_ms: float, performance: bool) -> Path:
    path.mkdir()
    rows = [result_row("softmax", "fp32", (4, n), baseline_ms=1.0, candidate_ms=candidate_ms * (1 + n / 1000),
                       speedup=1.0 / candidate_ms, timer="graph", measures_performance=performance)
            for n in (16, 40)]
    rundir.atomic_write_json(path / rundir.RESULTS_JSON, {"format": 1, "rows": rows})
    return path


@pytest.mark.parametrize("performance", [True, False])
def test_the_ab_reports_rows_say_whether_they_are_performance_numbers(tmp_path, performance):
    # The same writer on a backend that measures (a GPU) and on one that does not: the field is on
    # every row either way, and only the latter's table rows carry the flag.
    a = [_run_dir(tmp_path / f"a{i}", 1.0, performance) for i in range(2)]
    b = [_run_dir(tmp_path / f"b{i}", 1.1, performance) for i in range(2)]
    paired = compare.pair(a, b, performance=performance)
    note = None if performance else NOTE
    ab_report.write(tmp_path / "report", paired, compare.summarize(paired), [], {"name": "t"}, note)
    rows = load(tmp_path / "report" / "report.json")["rows"]
    assert len(rows) == 2 and all(r["measures_performance"] is performance for r in rows)
    with open(tmp_path / "report" / "report.csv", newline="") as f:
        assert [r["measures_performance"] for r in csv.DictReader(f)] == [str(performance)] * 2
    md_rows = [line for line in (tmp_path / "report" / "report.md").read_text().splitlines()
               if line.startswith("| softmax")]
    assert len(md_rows) == 2 and all((table.NOT_PERFORMANCE in line) is not performance for line in md_rows)


def _interrupted_copy(record: Path, into: Path) -> Path:
    """A copy of `record` as a record killed before it wrote its configs: replay refuses it."""
    shutil.copytree(record, into)
    shutil.rmtree(into / rundir.RECORDS_DIR)
    run_json = load(into / rundir.RUN_JSON)
    run_json["observed"]["outcome"] = {"status": INCOMPLETE, "rows_done": 1, "rows_planned": 4,
                                       "reason": "interrupted (SIGINT)", "running_case": "fp32-3x40", "exit_code": 130}
    (into / rundir.RUN_JSON).write_text(json.dumps(run_json))
    return into


@pytest.mark.e2e
def test_replay_by_default_takes_the_newest_record_it_can_replay_and_says_which(interpreter_outputs, tmp_path,
                                                                                 capsys):
    record, _ = interpreter_outputs["record"]
    root = tmp_path / "runs"
    older = shutil.copytree(record, root / "softmax_20261201-000000")
    newer = _interrupted_copy(record, root / "softmax_20261202-000000")
    os.utime(older, (1, 1))  # the newer one is the newest by time too
    with pytest.raises(UsageError, match=f"cannot replay {newer}: it is an incomplete record"):
        resolve.replay_source(newer)
    spec, _, _ = resolve.resolve_replay(cli.parse_request(["replay", "--out", str(root)]))
    assert spec.replay_from == str(older.resolve())
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"replaying the newest replayable record run: {older}"
    assert out[1].startswith(f"  passed over a newer one: cannot replay {newer}: it is an incomplete record")


@pytest.mark.e2e
def test_replay_by_default_with_no_replayable_record_says_why_in_one_line(interpreter_outputs, tmp_path):
    record, _ = interpreter_outputs["record"]
    newer = _interrupted_copy(record, tmp_path / "runs" / "softmax_20261202-000000")
    with pytest.raises(UsageError) as info:
        resolve.newest_replayable_run(tmp_path / "runs")
    message = str(info.value)
    assert message.startswith(f"no record run under {tmp_path / 'runs'} can be replayed (1 refused, the newest: "
                              f"cannot replay {newer}: it is an incomplete record") and "\n" not in message
