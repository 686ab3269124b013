"""The corpus A/B report (reports.corpus): two batch dirs or per-op A/B dirs written by hand as the
harness writes them, paired into report.json (checked against its committed schema), CSV, markdown
and a self-contained HTML page, which a real headless browser opens where one is installed."""

import csv
import hashlib
import html.parser
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import markupsafe
import numpy as np
import pytest
from conftest import REPO, load
from result_rows import result_row

from harness import cli
from harness.core import ir_index
from harness.core.options import RunOptions
from harness.measure import ir
from harness.sessions import ab
from reports import compare, corpus, corpus_html, stats

SCHEMA = json.loads((REPO / "reports" / "schema" / "corpus_report.schema.json").read_text())
JITTER = np.linspace(-0.002, 0.002, 41)  # one process's sample spread: 0.2%, far below any margin here

TTGIR_A = "#blocked = #ttg.blocked<{sizePerThread = [4]}>\nmodule {\n  %0 = tt.load %ptr : tensor<1024xf16>\n  " \
          "%1 = arith.mulf %0, %0 : tensor<1024xf16>\n  tt.return\n}\n"
TTGIR_B = TTGIR_A.replace("sizePerThread = [4]", "sizePerThread = [8]").replace("arith.mulf", "math.fma")


def _row(op, dtype, shape, cand, base=1.0, markers=(), timer="graph", configs=None, status="SUCCESS"):
    """A results.json row as the harness writes it (harness.child.plugins.results.make_row)."""
    return result_row(op, dtype, shape, status, baseline_ms=base, candidate_ms=cand, speedup=base / cand, timer=timer,
                      input_sha256="0" * 64, markers=list(markers), configs=configs or {"k": "BLOCK=64"},
                      samples={"candidate": {"median_ms": cand, "raw": list(cand * (1 + JITTER))},
                               "baseline": {"median_ms": base, "raw": list(base * (1 + JITTER))}})


def _ir(run_dir, variants):
    """ttgir/ as harness.measure.ir writes it: variants = [(shape, dtype, stem, ttgir text, llir sha[, num_warps])]."""
    lines = ["\t".join(ir.INDEX_COLUMNS)]
    (run_dir / "ttgir").mkdir()
    for shape, dtype, stem, text, llir, *warps in variants:
        path = run_dir / "ttgir" / shape / "scale_kernel" / f"{stem}.ttgir"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        sha = {"ttir": "t" * 16, "ttgir": hashlib.sha256(text.encode()).hexdigest()[:16], "llir": llir, "ptx": "p" * 16,
               "amdgcn": "-"}
        lines.append("\t".join([shape, "ops.k.scale_kernel", f"{shape}/scale_kernel/{stem}.ttgir", "3", dtype,
                                "div16-XP", *(warps or ["4"]), "3", "BLOCK=64", f"h{stem}{dtype}",
                                *(sha[s] for s in ir.HASHED_STAGES)]))
    (run_dir / "ttgir" / "index.tsv").write_text("\n".join(lines) + "\n")


def _run(root, rows, variants=None):
    root.mkdir(parents=True)
    (root / "results.json").write_text(json.dumps({"format": 1, "rows": rows}))
    (root / "run.json").write_text(json.dumps({"spec": {}, "observed": {}}))
    if variants is not None:
        _ir(root, variants)
    return root


# The corpus under A and B: op -> (A rows, B rows, A IR, B IR); B's status per op, where it failed.
def _corpus():
    return {
        "softmax": ([_row("softmax", "fp16", (64, 1024), 2.0), _row("softmax", "bf16", (64, 1024), 2.0)],
                    [_row("softmax", "fp16", (64, 1024), 2.2), _row("softmax", "bf16", (64, 1024), 2.0)],
                    [("64x1024", "fp16", "w4s3__fp16", TTGIR_A, "l" * 16),
                     ("64x1024", "bf16", "w4s3__bf16", TTGIR_A, "l" * 16)],
                    [("64x1024", "fp16", "w4s3__fp16", TTGIR_B, "m" * 16),
                     ("64x1024", "bf16", "w4s3__bf16", TTGIR_A, "l" * 16)]),
        # 2% faster: within the single-run margin; 1.5x slower but timed after a fallback.
        "mm": ([_row("mm", "fp16", (256, 256), 1.0), _row("mm", "bf16", (256, 256), 1.0)],
               [_row("mm", "fp16", (256, 256), 0.98),
                _row("mm", "bf16", (256, 256), 1.5, timer="direct",
                     markers=["TIMER_FALLBACK phase=capture reason=recoverable detail='host sync'"])], [], []),
        "gelu": ([_row("gelu", "fp32", (4096,), 1.0)], [_row("gelu", "fp32", (4096,), 0.8)], None, None),
        "add": ([_row("add", "fp32", (4096,), 1.0)], None, None, None),
    }


STATUS_COLUMNS = ("op", "repo", "op_file", "status", "exit_code", "attempts", "elapsed_s", "backend", "device",
                  "timer", "rows", "timer_fallback_rows", "replay_fallback_rows", "run_dir", "notes")


def _batch(root, side, backend="cuda"):
    """A batch dir as harness.sessions.batch writes it, side 0 (A) or 1 (B) of _corpus()."""
    root.mkdir(parents=True)
    (root / "batch.json").write_text(json.dumps({"backend": backend, "devices": [0], "selected": []}))
    lines = [",".join(STATUS_COLUMNS)]
    for op, data in _corpus().items():
        rows, variants = data[side], data[2 + side]
        run = f"ops/builtin__{op}/attempt1/{op}_20250101-000000"
        status = "PASS" if rows is not None else "FAIL"
        if rows is not None:
            _run(root / run, rows, variants)
        notes = "" if rows is not None else "exit 1 twice in a row: deterministic, not retried further"
        lines.append(",".join([op, "builtin", f"ops/{op}.py", status, "0", "1", "1.0", backend, "0", "graph",
                               str(len(rows or [])), "0", "0", run if rows is not None else "", notes]))
    (root / "ops_status.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def batches(tmp_path):
    return _batch(tmp_path / "batch_a", 0), _batch(tmp_path / "batch_b", 1)


def _rows(data):
    return {(r["op"], r["dtype"]): r for r in data["rows"]}


def test_batch_pair_report_validates_against_the_schema_and_lists_every_op(batches, tmp_path):
    data = corpus.from_batch_pair(*batches, {"name": "t"})
    files = corpus.write(tmp_path / "out", data)
    assert [f.name for f in files] == ["report.json", "report.csv", "report.md", "report.html"]
    report = load(files[0])
    jsonschema.validate(report, SCHEMA)
    assert report["format"] == corpus.REPORT_FORMAT == 4
    assert report["kind"] == "batch_pair" and report["basis"] == corpus.SINGLE_RUN
    assert len(report["rows"]) == 5 and report["summary"]["headline_rows"] == 4
    (unpaired,) = report["unpaired_ops"]
    assert unpaired["op"] == "builtin:add" and "status A PASS, B FAIL" in unpaired["reason"]
    assert "deterministic" in unpaired["reason"]
    csv_lines = files[1].read_text().splitlines()
    assert csv_lines[0].startswith("op_key,op,dtype") and len(csv_lines) == 6
    assert "builtin:add" in files[2].read_text()  # the markdown lists the op it could not compare


def _drift_verdict(data):
    data["rows"][0]["verdict"] = "BETTER"


def _drift_to_format_1_floor(data):
    data["rows"][0]["floor"] = data["rows"][0].pop("margin")


def _drift_q_above_1(data):
    data["rows"][0]["q"] = 1.5


def _drift_no_calibration(data):
    del data["summary"]["calibration"]


def _drift_spread_named_floor(data):
    data["summary"]["identical_ir_spread"] = {"rows": 5, "floor": 0.05}


@pytest.mark.parametrize("drift", [_drift_verdict, _drift_to_format_1_floor, _drift_q_above_1, _drift_no_calibration,
                                   _drift_spread_named_floor])
def test_schema_rejects_a_report_that_drifts(batches, drift):
    data = json.loads(json.dumps(corpus.from_batch_pair(*batches, {})))
    jsonschema.validate(data, SCHEMA)
    drift(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)


def test_one_run_per_side_needs_a_change_beyond_the_single_run_margin(batches):
    data = corpus.from_batch_pair(*batches, {})
    rows = _rows(data)
    mm = rows[("mm", "fp16")]
    # One process's samples alone call a 2% change FASTER; with one run per side it is within the 3%
    # margin: SAME, no change beyond 3% (it cannot tell 2% from nothing).
    raw_a, raw_b = list(1.0 * (1 + JITTER)), list(0.98 * (1 + JITTER))
    assert stats.compare(raw_a, raw_b).verdict == stats.FASTER
    assert data["single_run_margin"] == compare.SINGLE_RUN_MARGIN and data["margin"] == stats.MARGIN
    assert mm["basis"] == corpus.SINGLE_RUN and mm["margin"] == compare.SINGLE_RUN_MARGIN
    assert mm["verdict"] == stats.SAME and mm["ratio"] == pytest.approx(0.98)
    # Its variance is its own samples' (no prior: they measure one process each).
    assert mm["sd"] == pytest.approx(stats.compare(raw_a, raw_b).sd)
    assert rows[("softmax", "fp16")]["verdict"] == stats.SLOWER  # 10%: beyond it
    assert rows[("softmax", "bf16")]["verdict"] == stats.SAME  # the same latency: within 1%
    assert rows[("gelu", "fp32")]["verdict"] == stats.FASTER
    assert all(r["q"] is not None for r in rows.values())  # judged over the report


def test_single_run_headline_interval_is_over_operators(batches):
    data = corpus.from_batch_pair(*batches, {})
    overall = data["summary"]["overall"]
    per_op = {"softmax": (1.1 * 1.0) ** 0.5, "mm": 0.98, "gelu": 0.8}
    assert overall["over"] == "3 ops"
    assert overall["ratio"] == pytest.approx(np.exp(np.mean(np.log(list(per_op.values())))))
    gm, lo, hi = stats.geomean(list(per_op.values()))
    assert (overall["lo"], overall["hi"]) == (pytest.approx(lo), pytest.approx(hi))
    assert all(o["geomean"]["lo"] is None for o in data["ops"])  # no interval over one process pair's rows


def test_worst_regressions_come_first(batches):
    data = corpus.from_batch_pair(*batches, {})
    assert [o["op"] for o in data["ops"]] == ["builtin:softmax", "builtin:mm", "builtin:gelu"]
    # Rows: the headline's by B/A, then those left out of it (a degraded 1.5x is no regression to lead with).
    assert [(r["op"], r["dtype"]) for r in data["rows"]] == [
        ("softmax", "fp16"), ("softmax", "bf16"), ("mm", "fp16"), ("gelu", "fp32"), ("mm", "bf16")]


def test_flagged_rows_are_shown_and_kept_out_of_the_headline(batches):
    data = corpus.from_batch_pair(*batches, {})
    flagged = _rows(data)[("mm", "bf16")]
    assert flagged["flags"] == ["timer_fallback", "timer_mismatch"] and not flagged["in_headline"]
    assert data["summary"]["excluded"] == {"timer_fallback": 1, "timer_mismatch": 1}
    assert data["summary"]["verdicts"] == {"SLOWER": 1, "SAME": 2, "FASTER": 1}


def test_a_row_whose_ir_changed_carries_a_ttgir_diff_per_variant(batches):
    rows = _rows(corpus.from_batch_pair(*batches, {}))
    changed, same = rows[("softmax", "fp16")]["ir"], rows[("softmax", "bf16")]["ir"]
    assert changed["status"] == "changed" and changed["identical"] == 0
    (variant,) = changed["variants"]
    assert variant["stages"] == ["llir", "ttgir"] and variant["variant"] == "w4s3__fp16"
    assert "-#blocked = #ttg.blocked<{sizePerThread = [4]}>" in variant["diff"]
    assert "+  %1 = math.fma %0, %0 : tensor<1024xf16>" in variant["diff"]
    # The bf16 kernels of the same shape dir are this row's, identical; the fp16 change is not theirs.
    assert same == {"status": "identical", "identical": 1, "variants": []}
    assert rows[("mm", "fp16")]["ir"]["status"] == "none_launched"
    assert rows[("gelu", "fp32")]["ir"]["status"] == "not_collected"


def test_a_long_diff_is_cut_loudly(tmp_path):
    a = _run(tmp_path / "a", [_row("softmax", "fp16", (8,), 1.0)], [("8", "fp16", "w4s3", "x\n" * 1000, "l")])
    b = _run(tmp_path / "b", [_row("softmax", "fp16", (8,), 1.0)], [("8", "fp16", "w4s3", "y\n" * 1000, "l")])
    (variant,) = corpus.row_ir((ir_index.launched(a), ir_index.launched(b)), a, b, "fp16", (8,))["variants"]
    assert variant["diff_truncated"] and len(variant["diff"].splitlines()) == corpus.MAX_DIFF_LINES


class _Page(html.parser.HTMLParser):
    """What the report page holds: row tbodies, diff blocks, and every URL it references."""

    def __init__(self):
        super().__init__()
        self.row_ids, self.urls, self.diffs, self._in_diff = [], [], [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tbody" and attrs.get("id", "").startswith("row-"):
            self.row_ids.append(attrs["id"][4:])
        self.urls += [v for k, v in attrs.items() if k in ("src", "href", "action", "data") and v]
        if tag == "pre" and attrs.get("class") == "diff":
            self._in_diff = True
            self.diffs.append("")

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_diff = False

    def handle_data(self, data):
        if self._in_diff:
            self.diffs[-1] += data


def test_html_has_every_row_the_diffs_and_no_external_url(batches, tmp_path):
    data = corpus.from_batch_pair(*batches, {})
    page = (corpus.write(tmp_path, data))[3].read_text()
    parsed = _Page()
    parsed.feed(page)
    assert parsed.row_ids == [r["id"] for r in data["rows"]]
    (diff,) = parsed.diffs
    assert "+  %1 = math.fma %0, %0 : tensor<1024xf16>" in diff and "-  %1 = arith.mulf" in diff
    assert parsed.urls and all(u.startswith(("#", "data:image/png;base64,")) for u in parsed.urls)
    assert not re.search(r"https?://|//cdn|<link", page)
    assert "<script>" in page and "<style>" in page  # inline


def test_a_row_without_a_dtype_is_on_the_page(batches, tmp_path):
    # FlagGems benchmarks of integer or index inputs yield rows with no dtype: the page was not written for them.
    data = corpus.from_batch_pair(*batches, {})
    data["rows"][0]["dtype"] = None
    page = corpus.write(tmp_path, data)[3].read_text()
    parsed = _Page()
    parsed.feed(page)
    assert parsed.row_ids == [r["id"] for r in data["rows"]]


def _headline_paragraphs(page: str) -> list[str]:
    block = page[page.index("<div class=\"headline\">"):page.index("</div>")]
    return [markupsafe.Markup(p).unescape() for p in re.findall(r"<p[^>]*>(.*?)</p>", block)]


def test_the_page_shows_each_headline_line_once_and_names_a_first(batches, tmp_path):
    data = corpus.from_batch_pair(*batches, {"a": "fusion on", "b": "fusion off"})
    page = corpus.write(tmp_path, data)[3].read_text()
    assert _headline_paragraphs(page) == corpus.headline(data)
    assert page.count("overall geomean B/A") == 1 and page.count("verdicts: ") == 1
    assert "<title>Corpus A/B: fusion on vs fusion off</title>" in page


def test_the_page_escapes_what_the_data_says(batches, tmp_path):
    data = corpus.from_batch_pair(*batches, {"a": "<i>A</i>"})
    data["rows"][0]["errors"] = {"b": "<script>alert(1)</script>"}
    page = corpus.write(tmp_path, data)[3].read_text()
    assert "<dd>&lt;script&gt;alert(1)&lt;/script&gt;</dd>" in page and "<i>A</i>" not in page


def test_interpreter_ratios_are_neither_plotted_nor_sorted_by(tmp_path):
    data = corpus.from_batch_pair(_batch(tmp_path / "a", 0, "interpreter"), _batch(tmp_path / "b", 1, "interpreter"),
                                  {})
    assert all(r["ratio"] for r in data["rows"])  # computed, and called n/a
    (ax,) = corpus_html.figure(data).axes
    assert not ax.patches and [t.get_text() for t in ax.texts] == ["no ratios to plot: see the note"]
    page = corpus.write(tmp_path / "out", data)[3].read_text()
    assert page.count(">n/a</td>") > len(data["rows"]) and not re.search(r'<td data-v="[^"]*"[^>]*>n/a</td>', page)


def test_interpreter_timings_give_no_verdict_and_say_why(tmp_path):
    data = corpus.from_batch_pair(_batch(tmp_path / "a", 0, "interpreter"), _batch(tmp_path / "b", 1, "interpreter"),
                                  {})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    assert data["note"].startswith("NOTE: backend 'interpreter'") and not data["measures_performance"]
    assert {r["verdict"] for r in data["rows"]} == {stats.NOT_APPLICABLE}
    files = corpus.write(tmp_path / "out", data)
    head = files[2].read_text().split("\n\n")[1].splitlines()
    assert head[0] == f"- {data['note']}" and all(line.startswith("- ") for line in head), head  # CommonMark
    text = files[2].read_text() + files[3].read_text()
    assert data["note"] in files[2].read_text() and not re.search(r"x (slower|faster)|1\.1000", text)
    with open(files[1], newline="") as f:  # the note is in report.md and .json: a CSV reader takes no comment line
        assert {r["verdict"] for r in csv.DictReader(f)} == {stats.NOT_APPLICABLE}


# --- per-op A/B dirs (harness.sessions.ab) ----------------------------------------------------------
def _ab_dir(root, op, a_ms, b_ms, backend="cuda", failed_b=(), ttgir=None, passes_ms=None, a_passes_step=True):
    """A single-op ab dir: ab.json's steps as ab.Runner writes them, naming each step's run dir (a
    failed step's too: its rows FAILED); `failed_b`: the repeats (from 1) whose B replay failed;
    `ttgir`: (A's, B's) text of the row's one kernel, whose IR each run then collected, or with
    `passes_ms` (each passes run's latency), only each side's passes run: a step of its own, or A's
    record where not `a_passes_step` (as ab.Runner runs them now; older A/Bs had both steps)."""
    def variants(side, passes=False):
        if ttgir is None or (passes_ms is not None and not passes):
            return None
        return [("64", "fp16", "w4s3__fp16", ttgir[side == "B"], "l" * 16)]

    record_passes = passes_ms is not None and not a_passes_step
    record = _run(root / op / "A-record" / "r", [_row(op, "fp16", (64,), passes_ms if record_passes else a_ms[0])],
                  variants("A", record_passes))
    steps = [{"what": f"[1/1 {op}] A records", "side": "A", "args": ["record", op], "exit": 0, "usable": True,
              "run_dir": str(record), **({"passes": True} if record_passes else {})}]
    for side in ("A", "B")[int(record_passes):] if passes_ms is not None else ():
        run = _run(root / op / f"{side}-passes" / "r", [_row(op, "fp16", (64,), passes_ms)], variants(side, True))
        steps.append({"what": f"[1/1 {op}] {side}'s IR and kernels", "side": side, "args": ["replay", "x"], "exit": 0,
                      "usable": True, "run_dir": str(run), "passes": True})
    for i, (a, b) in enumerate(zip(a_ms, b_ms, strict=True), 1):
        for side, ms in (("A", a), ("B", b)):
            failed = side == "B" and i in failed_b
            run = _run(root / op / f"{side}-{i}" / "r", [_row(op, "fp16", (64,), ms, base=1.0 + i / 1000,
                                                              status="FAILED" if failed else "SUCCESS")],
                       variants(side))
            steps.append({"what": f"[1/1 {op}] repeat {i}/{len(a_ms)}: {side} replays A", "side": side,
                          "args": ["replay", "x"], "exit": 1 if failed else 0, "usable": not failed,
                          "run_dir": str(run)})
    (root / "ab.json").write_text(json.dumps({"plan": {"repeats": len(a_ms), "backend": backend},
                                              "steps": steps, "complete": True}))
    return root


def test_ab_dirs_time_from_the_repeats_and_compare_ir_from_the_passes_steps(tmp_path):
    # The passes steps ran 30% slow (the profiler ran in them) and alone collected IR (the repeats
    # time only): the row's latencies are the repeats', its IR the passes steps'.
    d = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [1.0, 1.002, 0.998], ttgir=(TTGIR_A, TTGIR_B),
                passes_ms=1.3)
    (row,) = corpus.from_ab_dirs([("builtin:mm", d)], {})["rows"]
    assert row["a_repeats_ms"] == [1.0, 1.002, 0.998] and row["b_repeats_ms"] == [1.0, 1.002, 0.998]
    assert row["run_a"].endswith("A-passes/r") and row["run_b"].endswith("B-passes/r")
    assert row["ir"]["status"] == "changed"


def test_ab_dirs_compare_a_s_ir_from_a_record_that_carried_a_s_passes(tmp_path):
    # A's record carried A's passes (no A-passes step): A's IR is the record's, its latency in no verdict.
    d = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [1.0, 1.002, 0.998], ttgir=(TTGIR_A, TTGIR_B),
                passes_ms=1.3, a_passes_step=False)
    assert [s.get("passes", False) for s in load(d / "ab.json")["steps"][:2]] == [True, True]
    (row,) = corpus.from_ab_dirs([("builtin:mm", d)], {})["rows"]
    assert row["a_repeats_ms"] == [1.0, 1.002, 0.998] and row["b_repeats_ms"] == [1.0, 1.002, 0.998]
    assert row["run_a"].endswith("A-record/r") and row["run_b"].endswith("B-passes/r")
    assert row["ir"]["status"] == "changed"


def test_ab_dirs_pair_independent_repeats(tmp_path):
    items = [("builtin:mm", _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [0.98, 0.982, 0.978])),
             ("builtin:softmax", _ab_dir(tmp_path / "sm", "softmax", [1.0] * 3, [1.0] * 3, failed_b=(2,))),
             ("builtin:add", _ab_dir(tmp_path / "add", "add", [1.0] * 3, [1.0] * 3, failed_b=(1, 2, 3))),
             ("builtin:gelu", tmp_path / "never_ran")]
    data = corpus.from_ab_dirs(items, {"a": "fp fusion on", "b": "fp fusion off"})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    rows = {r["op_key"]: r for r in data["rows"]}
    assert set(rows) == {"builtin:mm", "builtin:softmax"}
    # Repeats are independent processes: a steady 2% change is called, beyond the repeats' margin.
    mm = rows["builtin:mm"]
    assert mm["basis"] == corpus.REPEATS and mm["verdict"] == stats.FASTER
    assert mm["a_repeats_ms"] == [1.0, 1.002, 0.998] and mm["margin"] == stats.MARGIN
    assert mm["q"] <= data["fdr"] == stats.FDR and mm["hi"] < 1 - stats.MARGIN
    # The plan's repeats are expected on each side: a failed replay leaves the row short.
    assert rows["builtin:softmax"]["flags"] == ["incomplete_b(2/3)"] and not rows["builtin:softmax"]["in_headline"]
    assert data["summary"]["overall"]["over"] == "1 rows" and data["context"]["b"] == "fp fusion off"
    reasons = {u["op"]: u["reason"] for u in data["unpaired_ops"]}
    assert reasons["builtin:add"].startswith("no completed replay of side B; step failed (exit 1)")
    assert "no readable ab.json" in reasons["builtin:gelu"]


def test_a_call_on_byte_identical_ir_is_listed_apart_in_every_report(tmp_path):
    faster = ([1.0, 1.002, 0.998], [0.9, 0.902, 0.898])
    items = [("builtin:mm", _ab_dir(tmp_path / "mm", "mm", *faster, ttgir=(TTGIR_A, TTGIR_A))),
             ("builtin:gelu", _ab_dir(tmp_path / "gelu", "gelu", *faster, ttgir=(TTGIR_A, TTGIR_B))),
             ("builtin:add", _ab_dir(tmp_path / "add", "add", *faster)),  # no IR collected: cannot tell
             ("builtin:softmax", _ab_dir(tmp_path / "sm", "softmax", [1.0] * 3, [1.0] * 3, ttgir=(TTGIR_A, TTGIR_A)))]
    data = corpus.from_ab_dirs(items, {})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    rows = {r["op_key"]: r for r in data["rows"]}
    assert {k: (r["verdict"], r["ir"]["status"]) for k, r in rows.items()} == {
        "builtin:mm": (stats.FASTER, "identical"), "builtin:gelu": (stats.FASTER, "changed"),
        "builtin:add": (stats.FASTER, "not_collected"), "builtin:softmax": (stats.SAME, "identical")}
    # The verdict stands as measured; the row is named apart.
    assert data["summary"]["calls_on_identical_ir"] == [rows["builtin:mm"]["id"]]
    assert data["summary"]["identical_ir_spread"] is None  # 2 such rows say too little
    assert data["summary"]["verdicts"] == {stats.FASTER: 3, stats.SAME: 1}
    # The identical-IR rows as the run's own A/A: 1 call of 2 is within what 3 calls at the FDR allow.
    calibration = "rows whose IR is identical on both sides (the run's own A/A): 2, called FASTER/SLOWER: 1"
    assert data["summary"]["calibration"] == calibration and not data["warnings"]
    (tmp_path / "out").mkdir()
    corpus.write(tmp_path / "out", data)
    line = f"{corpus.IDENTICAL_IR_NOTE}: 1 (builtin:mm fp16 64)"
    assert line in (tmp_path / "out" / "report.md").read_text()
    assert calibration in (tmp_path / "out" / "report.md").read_text()
    assert markupsafe.escape(line) in (tmp_path / "out" / "report.html").read_text()


def test_a_single_op_ab_names_its_calls_on_identical_ir_too(tmp_path, capsys):
    # mm under a switch that changes fp16's code only: both dtypes 10% faster in B, only bf16 on the same IR.
    # As in an A/B whose one-off passes run once: only each side's first run holds IR.
    def runs(side, ms, dtypes=("fp16", "bf16")):
        rows = [[_row("mm", d, (64, 1024), ms * (1 + i / 1000)) for d in dtypes] for i in range(3)]
        ir = [("64x1024", "fp16", "w4s3__fp16", TTGIR_A if side == "A" else TTGIR_B, "l" * 16),
              ("64x1024", "bf16", "w4s3__bf16", TTGIR_A, "l" * 16)]
        return [_run(tmp_path / f"{side}{len(dtypes)}{i}", rows[i], ir if i == 0 else None) for i in range(3)]

    out = tmp_path / "report"
    out.mkdir()
    ab.report(out, [{"A": runs("A", 1.0), "B": runs("B", 0.9)}], {"name": "t"}, [], {"cuda"}, expected=3)
    line = f"WARNING: {corpus.IDENTICAL_IR_NOTE}: 1 (mm bf16 64x1024)"
    assert line in capsys.readouterr().out and line in (out / "report.md").read_text()
    # Its identical-IR rows are its own A/A: 1 call of 2 is within what 2 calls at the FDR allow.
    report = json.loads((out / "report.json").read_text())
    assert report["context"]["calibration"] == ("rows whose IR is identical on both sides (the run's own A/A): 1, "
                                                "called FASTER/SLOWER: 1")
    # bf16 alone: its one call, on identical IR, is more than 1 call at 0.05 allows (none); at 0.2, one.
    a, b = runs("A", 1.0, ("bf16",)), runs("B", 0.9, ("bf16",))
    ab.report(out, [{"A": a, "B": b}], {"name": "t"}, [], {"cuda"}, expected=3)
    alarm = json.loads((out / "report.json").read_text())
    assert "calibration" not in alarm["context"] and alarm["warnings"][-1] == (
        "rows whose IR is identical on both sides (the run's own A/A): 1, called FASTER/SLOWER: 1: more than the "
        "0.05 FDR allows of 1 calls (at most 0): the noise is larger than the model says (or the change lies below "
        "the IR)")
    ab.report(out, [{"A": a, "B": b}], {"name": "t"}, [], {"cuda"}, expected=3, fdr=0.2)
    lenient = json.loads((out / "report.json").read_text())
    assert "calibration" in lenient["context"] and lenient["summary"]["fdr"] == 0.2
    assert not any("FDR allows" in w for w in lenient["warnings"])


def test_the_spread_of_identical_ir_rows_is_the_runs_own_a_a(tmp_path):
    # Five ops whose code the switch left alone, B a little off A each: their B/A spread is what the
    # same code shows between processes; a changed row's ratio is not part of it.
    shifts = [0.97, 1.0, 1.02, 0.99, 1.04]
    items = [(f"builtin:op{i}", _ab_dir(tmp_path / f"op{i}", f"op{i}", [1.0, 1.001, 0.999],
                                       [s, s * 1.001, s * 0.999], ttgir=(TTGIR_A, TTGIR_A)))
             for i, s in enumerate(shifts)]
    items.append(("builtin:mm", _ab_dir(tmp_path / "mm", "mm", [1.0] * 3, [3.0] * 3, ttgir=(TTGIR_A, TTGIR_B))))
    data = corpus.from_ab_dirs(items, {})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    identical = [r["ratio"] for r in data["rows"] if r["ir"]["status"] == "identical"]
    assert len(identical) == 5
    spread = stats.spread(identical)
    assert 0.05 < spread < 0.2
    assert data["summary"]["identical_ir_spread"] == {"rows": 5, "spread": round(spread, 4)}
    # Their repeats are quiet, so 4 of the 5 are called: more than 5 calls at the FDR let be false. The
    # report warns that its noise model is wrong here.
    (warning,) = data["warnings"]
    assert warning == data["summary"]["calibration"]
    assert warning.startswith("rows whose IR is identical on both sides (the run's own A/A): 5, called "
                              "FASTER/SLOWER: 4: more than the 0.05 FDR allows of 5 calls (at most 1)")
    (tmp_path / "out").mkdir()
    corpus.write(tmp_path / "out", data)
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"rows whose IR is identical on both sides: 5; their B/A spread (3 sd) {spread:.1%}" in md
    assert md.count(warning) == 1  # said once, as a warning


def test_a_row_b_computed_wrong_is_failed_with_b_s_error_in_every_report(tmp_path):
    # B's replays ran every case (usable) but one row FAILED in each: verdict FAILED, B's error kept.
    d = _ab_dir(tmp_path / "sm", "softmax", [1.0] * 2, [1.0] * 2)
    state = json.loads((d / "ab.json").read_text())
    for step in state["steps"]:
        if step["side"] == "B":
            results = Path(step["run_dir"]) / "results.json"
            rows = json.loads(results.read_text())
            rows["rows"][0].update(status="FAILED", error="candidate raised ValueError: bad\nmore")
            results.write_text(json.dumps(rows))
            step["exit"] = 1
    (d / "ab.json").write_text(json.dumps(state))
    data = corpus.from_ab_dirs([("builtin:softmax", d)], {"a": "A", "b": "B"})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    (row,) = data["rows"]
    assert (row["verdict"], row["flags"]) == ("FAILED", ["failed_b(2/2)", "incomplete_b(0/2)"])
    assert row["errors"] == {"b": "candidate raised ValueError: bad"}
    page = next(f for f in corpus.write(tmp_path / "out", data) if f.suffix == ".html").read_text()
    assert "<dt>B failed</dt><dd>candidate raised ValueError: bad</dd>" in page


def test_an_ab_json_from_before_steps_said_usable_counts_exit_0_steps(tmp_path):
    d = _ab_dir(tmp_path / "sm", "softmax", [1.0] * 3, [1.0] * 3, failed_b=(2,))
    state = json.loads((d / "ab.json").read_text())
    for step in state["steps"]:
        del step["usable"]
    (d / "ab.json").write_text(json.dumps(state))
    (row,) = corpus.from_ab_dirs([("builtin:softmax", d)], {"a": "A", "b": "B"})["rows"]
    assert row["flags"] == ["incomplete_b(2/3)"]


def test_a_row_left_with_one_latency_a_side_has_no_interval_and_every_report_is_written(tmp_path):
    # Two ops a stop cut short: B's second replay failed, so B has a single latency; mm's A has two,
    # whose spread bounds the interval (both sides' spreads are pooled). add's second A replay
    # computed its row wrong too: one latency a side, nothing says how much a repeat varies, the
    # interval is unbounded (0, inf). Neither bound is kept alone, and the pages still render.
    mm = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002], [0.98, 0.982], failed_b=(2,))
    add = _ab_dir(tmp_path / "add", "add", [1.0, 1.002], [0.98, 0.982], failed_b=(2,))
    state = json.loads((add / "ab.json").read_text())
    results = Path(next(s["run_dir"] for s in state["steps"] if s["what"].endswith("repeat 2/2: A replays A"))) \
        / "results.json"
    failed = json.loads(results.read_text())
    failed["rows"][0].update(status="FAILED", error="candidate disagrees with baseline")
    results.write_text(json.dumps(failed))
    data = corpus.from_ab_dirs([("builtin:mm", mm), ("builtin:add", add)], {"a": "A", "b": "B"})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    rows = {r["op_key"]: r for r in data["rows"]}
    assert rows["builtin:mm"]["lo"] < rows["builtin:mm"]["ratio"] < rows["builtin:mm"]["hi"]
    assert rows["builtin:mm"]["ratio"] == pytest.approx(0.98 / 1.001, rel=1e-3)
    lone = rows["builtin:add"]
    assert (lone["a"]["n"], lone["b"]["n"]) == (1, 1) and lone["basis"] == corpus.REPEATS
    assert (lone["lo"], lone["hi"], lone["sd"]) == (None, None, None) and lone["verdict"] == stats.NOISY
    assert lone["ratio"] == pytest.approx(0.98)
    files = corpus.write(tmp_path / "out", data)
    page = next(f for f in files if f.suffix == ".html").read_text()
    assert "builtin:mm" in page and "builtin:add" in page


def test_an_op_that_moved_device_between_the_batches_is_named(batches):
    status = batches[1] / "ops_status.csv"
    status.write_text(status.read_text().replace("gelu,builtin,ops/gelu.py,PASS,0,1,1.0,cuda,0,",
                                                 "gelu,builtin,ops/gelu.py,PASS,0,1,1.0,cuda,1,"))
    data = corpus.from_batch_pair(*batches, {})
    assert "1 op(s) ran on another device in B than in A: builtin:gelu" in data["warnings"]


# --- the command line --------------------------------------------------------------------------------
def test_compare_of_two_batch_dirs_writes_the_corpus_report(batches, tmp_path, capsys):
    code = cli.main(["ab", "--compare", str(batches[0]), str(batches[1]), "--out", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 1  # not every row made the headline, and one op was not compared
    assert "ops: 3 of 4 compared; rows: 4 of 5 in the headline; verdicts: FASTER 1, SAME 2, SLOWER 1" in out
    assert "FASTER/SLOWER calls: 2, at a false discovery rate of 0.05 (Benjamini-Hochberg" in out
    assert "overall geomean B/A: " in out and "over 3 ops" in out and "ops not compared: builtin:add" in out
    (report_dir,) = (tmp_path / "runs").iterdir()
    assert report_dir.name.startswith("corpus_") and f"report: {report_dir / 'report.json'}" in out
    jsonschema.validate(load(report_dir / "report.json"), SCHEMA)


def test_compare_of_a_batch_dir_with_a_run_dir_is_one_line_of_error(batches, tmp_path, capsys):
    run = _run(tmp_path / "run", [_row("mm", "fp16", (8,), 1.0)])
    assert cli.main(["ab", "--compare", str(batches[0]), str(run)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --compare: {batches[0]} is a batch dir and {run} is not: give two batch dirs (a corpus " \
                  "report) or two run dirs\n"


# --- a real browser ---------------------------------------------------------------------------------
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
# Set by .ci/run, which installs Debian's chromium: there, a missing browser fails these tests instead of skipping them.
REQUIRE_BROWSER = "ZL_TEST_REQUIRE_CHROMIUM"


@pytest.fixture
def browser():
    if BROWSER is None:
        why = "no headless Chromium installed (apt-get install chromium)"
        if os.environ.get(REQUIRE_BROWSER):
            pytest.fail(f"{why}; {REQUIRE_BROWSER} is set, so a browser is required")
        pytest.skip(why)


def _dom(page: Path, fragment: str = "") -> str:
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                           "--dump-dom", page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _visible_rows(dom: str) -> list[str]:
    return [m.group(2) for m in re.finditer(r'<tbody id="row-([^"]+)" data-op="([^"]+)"(?![^>]*hidden)[^>]*>', dom)]


def test_the_page_runs_sorts_and_filters_in_a_real_browser(browser, batches, tmp_path):
    data = corpus.from_batch_pair(*batches, {"a": "fusion on", "b": "fusion off"})
    page = corpus.write(tmp_path, data)[3]
    dom = _dom(page)
    assert 'data-ready="1"' in dom  # the script ran to its end without an error
    assert "<title>Corpus A/B: fusion on vs fusion off</title>" in dom
    assert _headline_paragraphs(dom) == corpus.headline(data)  # each line once, as the other reports say it
    assert "5 of 5 rows shown" in dom
    assert _visible_rows(dom)[:1] == ["builtin:softmax"]  # worst first
    slower = _dom(page, "#verdict=SLOWER")
    # softmax's 10%, and mm's flagged 1.5x (SLOWER too, but out of the headline)
    assert _visible_rows(slower) == ["builtin:softmax", "builtin:mm"] and "2 of 5 rows shown" in slower
    ascending = _visible_rows(_dom(page, "#sort=ratio&desc=0"))
    assert ascending == ["builtin:gelu", "builtin:mm", "builtin:softmax", "builtin:softmax", "builtin:mm"]
    opened = _dom(page, "#open=" + "builtin%3Asoftmax%7Cfp16%7C64x1024")
    assert re.search(r'<tr class="detail">.*?math\.fma', opened, re.S)  # the row's drill-down shows its diff
    shot = tmp_path / "shot.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1400,1800", page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_interpreter_page_sorted_by_an_n_a_column_keeps_its_order_in_a_real_browser(browser, tmp_path):
    data = corpus.from_batch_pair(_batch(tmp_path / "a", 0, "interpreter"), _batch(tmp_path / "b", 1, "interpreter"),
                                  {})
    page = corpus.write(tmp_path / "out", data)[3]
    shown = _visible_rows(_dom(page))
    # Every B/A reads n/a: no order by the hidden ratios, either way.
    assert _visible_rows(_dom(page, "#sort=ratio&desc=0")) == shown == _visible_rows(_dom(page, "#sort=ratio&desc=1"))


@pytest.mark.e2e
def test_two_real_batches_compare_into_a_corpus_report(harness, tmp_path):
    for side in ("a", "b"):
        proc = harness("batch", "--ops", "add", "--backend", "interpreter", "--dtypes", "fp32",
                       "--batch-dir", tmp_path / side)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = harness("ab", "--compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (report_dir,) = (tmp_path / "runs").iterdir()
    report = load(report_dir / "report.json")
    jsonschema.validate(report, SCHEMA)
    assert report["kind"] == "batch_pair" and report["note"].startswith("NOTE: backend 'interpreter'")
    assert report["rows"] and all(r["basis"] == corpus.SINGLE_RUN and r["in_headline"] for r in report["rows"])
    assert all(r["ir"]["status"] == "not_collected" for r in report["rows"])  # the interpreter compiles nothing
    assert proc.stdout.splitlines()[2] == report["note"] and "overall geomean B/A: n/a" in proc.stdout


# Small kernels on an H200 land in a fast or a slow state per process (2.4 vs 2.6 us). Eight ops with
# 2 repeats a side show it; a ninth's two A processes happened to land alike, its B ones alike and
# 7% lower, on the same code.
BIMODAL_OPS = [(f"op{i}", [0.0026, 0.0024], [0.0024, 0.0026]) for i in range(8)]
LUCKY_OP = ("lucky", [0.00260, 0.00259], [0.00242, 0.00241])


# The lucky row's own per-repeat sd (both sides pooled): about 0.3%, against its neighbours' 5.7%.
LUCKY_SD = stats.residual(LUCKY_OP[1], LUCKY_OP[2])[0] ** 0.5


def test_a_corpus_judges_each_row_with_the_prior_of_its_latency_neighbours(tmp_path):
    def dirs(ops):
        return [(f"builtin:{op}", _ab_dir(tmp_path / op, op, a, b)) for op, a, b in ops]

    lucky = dirs([LUCKY_OP])
    alone = corpus.from_ab_dirs(lucky, {})["rows"][0]
    assert alone["verdict"] == stats.FASTER and alone["sd"] == pytest.approx(LUCKY_SD)  # its repeats agree: a call
    data = corpus.from_ab_dirs(lucky + dirs([*BIMODAL_OPS, ("mm", [1.0, 1.001], [3.0, 3.003])]), {})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    rows = {r["op_key"]: r for r in data["rows"]}
    assert rows["builtin:lucky"]["verdict"] == stats.NOISY and rows["builtin:lucky"]["sd"] > 5 * LUCKY_SD
    assert rows["builtin:mm"]["verdict"] == stats.SLOWER and rows["builtin:mm"]["q"] <= stats.FDR  # 3x: still called
    assert stats.FASTER not in data["summary"]["verdicts"]


def test_a_single_op_ab_judges_its_rows_with_their_neighbours_prior_too(tmp_path):
    # One op, nine shapes of about 2.5 us: the eight bimodal ones and the lucky one, as above.
    def report(name, shapes):
        def runs(side):
            col = 1 if side == "A" else 2
            return [_run(tmp_path / name / f"{side}{i}", [_row("add", "fp16", (n,), s[col][i])
                                                          for n, s in enumerate(shapes)]) for i in range(2)]

        out = tmp_path / name / "report"
        out.mkdir(parents=True)
        ab.report(out, [{"A": runs("A"), "B": runs("B")}], {"name": "t"}, [], {"cuda"}, expected=2)
        with open(out / "report.csv", newline="") as f:
            lucky_csv = next(r for r in csv.DictReader(f) if r["shape"] == str(len(shapes) - 1))
        lucky_json = json.loads((out / "report.json").read_text())["rows"][len(shapes) - 1]
        assert lucky_json["shape"] == [len(shapes) - 1]
        return lucky_csv, lucky_json["comparison"]

    alone_csv, alone = report("alone", [LUCKY_OP])
    assert alone_csv["verdict"] == stats.FASTER and alone["sd"] == pytest.approx(LUCKY_SD)
    lucky_csv, lucky = report("among", [*BIMODAL_OPS, LUCKY_OP])
    assert lucky_csv["verdict"] == lucky["verdict"] == stats.NOISY and lucky["sd"] > 5 * LUCKY_SD
    assert float(lucky_csv["margin"]) == stats.MARGIN and float(lucky_csv["q"]) == pytest.approx(lucky["q"])


def test_a_corpus_ab_ends_with_the_verdicts_its_report_gives(tmp_path):
    # The ops' own reports judged each op's rows alone; the closing line counts the corpus report's
    # verdicts (judged over all rows), for the ops that passed.
    from harness.core import batchdir
    from harness.sessions import corpus_ab

    ops = [*BIMODAL_OPS, LUCKY_OP, ("broken", [1.0, 1.001], [0.5, 0.501])]
    status = []
    for op, a, b in ops:
        run = tmp_path / "ops" / f"builtin__{op}" / "attempt1" / "ab_t"
        _ab_dir(run, op, a, b)
        status.append({**dict.fromkeys(batchdir.STATUS_COLUMNS, ""), "op": op, "repo": "builtin", "op_file": op,
                       "status": "FAIL" if op == "broken" else "PASS", "run_dir": str(run.relative_to(tmp_path))})
    with open(tmp_path / "ops_status.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=batchdir.STATUS_COLUMNS)
        writer.writeheader()
        writer.writerows(status)
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    opts = corpus_ab.ABOptions(RunOptions(backend="cuda"), [0], plan=plan.to_dict())
    line = corpus_ab.CorpusAB(tmp_path, opts, {}).summarize()
    assert line.startswith(f"verdicts: {stats.NOISY} 9; report: ")
    data = json.loads((tmp_path / "report.json").read_text())
    assert {r["op_key"]: r["verdict"] for r in data["rows"]}["builtin:broken"] == stats.FASTER  # in the report


def test_a_corpus_ab_report_keys_ops_sharing_a_name_by_file_and_leaves_skipped_ops_out(tmp_path):
    from harness.core import batchdir
    from harness.sessions import corpus_ab

    ops = [("mm", "ops/mm.py", "PASS", 0.5), ("mm", "ops/other/mm.py", "FAIL", 1.0), ("add", "ops/add.py", "SKIP", 1.0)]
    status = []
    for i, (op, op_file, state, b_ms) in enumerate(ops):
        run = tmp_path / "ops" / f"builtin__{op}{i}" / "attempt1" / "ab_t"
        _ab_dir(run, op, [1.0, 1.001], [b_ms, b_ms * 1.001])
        status.append({**dict.fromkeys(batchdir.STATUS_COLUMNS, ""), "op": op, "repo": "builtin", "op_file": op_file,
                       "status": state, "run_dir": str(run.relative_to(tmp_path))})
    with open(tmp_path / "ops_status.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=batchdir.STATUS_COLUMNS)
        writer.writeheader()
        writer.writerows(status)
    plan = ab.load_plan(REPO / "ops" / "ab_f32_ieee.yaml")
    opts = corpus_ab.ABOptions(RunOptions(backend="cuda"), [0], plan={**plan.to_dict(), "fdr": 0.2})
    line = corpus_ab.CorpusAB(tmp_path, opts, {}).summarize()
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["fdr"] == 0.2  # the plan's
    # Two mm's: each keyed by its file; the skipped op has nothing to report.
    assert {r["op_key"] for r in data["rows"]} == {"builtin:mm@ops/mm.py", "builtin:mm@ops/other/mm.py"}
    assert data["context"] == {"name": "f32-ieee", "a": plan.a.describe(), "b": plan.b.describe(), "repeats": 3,
                               "backend": "cuda", "batch_dir": str(tmp_path),
                               "op_status": {"builtin:mm@ops/mm.py": "PASS", "builtin:mm@ops/other/mm.py": "FAIL",
                                             "builtin:add@ops/add.py": "SKIP"}}
    # The closing line counts the rows of the ops that passed only.
    assert line == (f"verdicts: {stats.FASTER} 1; report: " + ", ".join(
        str(tmp_path / f"report.{ext}") for ext in ("json", "csv", "md", "html")))
    status_file = tmp_path / "ops_status.csv"
    status_file.write_text(status_file.read_text().replace(",PASS,", ",FAIL,"))
    assert corpus_ab.CorpusAB(tmp_path, opts, {}).summarize().startswith("verdicts: none; report: ")


def _control_batches(root, controls, backend="cuda"):
    """Two batches of one row per op, the candidate unchanged, op i's baseline (the control) moved by
    controls[i] in B."""
    sides = []
    for side in (0, 1):
        batch = root / f"batch_{'ab'[side]}"
        batch.mkdir(parents=True)
        (batch / "batch.json").write_text(json.dumps({"backend": backend, "devices": [0], "selected": []}))
        lines = [",".join(STATUS_COLUMNS)]
        for i, control in enumerate(controls):
            op, run = f"op{i}", f"ops/builtin__op{i}/attempt1/op{i}_20250101-000000"
            _run(batch / run, [_row(op, "fp32", (4096,), 1.0, base=control if side else 1.0)])
            lines.append(",".join([op, "builtin", f"ops/{op}.py", "PASS", "0", "1", "1.0", "cuda", "0", "graph", "1",
                                   "0", "0", run, ""]))
        (batch / "ops_status.csv").write_text("\n".join(lines) + "\n")
        sides.append(batch)
    return sides


def _spread_of(controls):
    return math.expm1(3.0 * float(np.std(np.log(controls), ddof=1)))


@pytest.mark.parametrize("spread", [0.029, 0.031])
def test_the_control_spread_warning_is_given_above_the_single_run_floor_only(tmp_path, spread):
    # Two ops whose controls lie +-d on the log scale: 3 sd over rows is 3 * sqrt(2) * d.
    d = math.log1p(spread) / (3.0 * math.sqrt(2))
    controls = [math.exp(d), math.exp(-d)]
    assert _spread_of(controls) == pytest.approx(spread)
    data = corpus.from_batch_pair(*_control_batches(tmp_path, controls), {})
    assert [r["control_ratio"] for r in data["rows"]] == pytest.approx(controls)
    warned = [w for w in data["warnings"] if w.startswith("the control")]
    if spread < compare.SINGLE_RUN_MARGIN:
        assert warned == []
    else:
        assert warned == [f"the control (torch baseline, which the compiler does not move) varies by {spread:.1%} "
                          "between the two sides' processes (3 sd over rows), more than the 3% single-run margin: "
                          "verdicts may call run-to-run noise a change"]


def test_interpreter_controls_are_no_performance_numbers_to_warn_of(tmp_path):
    data = corpus.from_batch_pair(*_control_batches(tmp_path, [1.0, 3500000.0], "interpreter"), {})
    assert not data["measures_performance"]
    assert not [w for w in data["warnings"] if w.startswith("the control")]


def test_one_control_has_no_spread_to_warn_of(tmp_path):
    data = corpus.from_batch_pair(*_control_batches(tmp_path, [1.5]), {})
    assert data["rows"][0]["control_ratio"] == pytest.approx(1.5)
    assert not [w for w in data["warnings"] if w.startswith("the control")]


# --- what each file says, row by row -------------------------------------------------------------------
def _md_table(md: str, title: str) -> list[list[str]]:
    """The cells of the markdown table under `## title` (header and rule left out)."""
    lines = md.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_csv_carries_every_row_of_the_json_column_by_column(batches, tmp_path):
    report = load(corpus.write(tmp_path, corpus.from_batch_pair(*batches, {}))[0])
    with open(tmp_path / "report.csv", newline="") as f:
        reader = csv.DictReader(f)
        table_rows = list(reader)
    assert tuple(reader.fieldnames) == corpus.CSV_COLUMNS
    assert b"\r" not in (tmp_path / "report.csv").read_bytes()  # lines end in \n, as the other files' do
    assert [r["op_key"] for r in table_rows] == [r["op_key"] for r in report["rows"]]
    for got, r in zip(table_rows, report["rows"], strict=True):
        want = {"op_key": r["op_key"], "op": r["op"], "dtype": r["dtype"], "shape": "x".join(map(str, r["shape"])),
                "basis": r["basis"], "a_gm_ms": r["a"]["gm_ms"], "b_gm_ms": r["b"]["gm_ms"], "ratio": r["ratio"],
                "ci_lo": r["lo"], "ci_hi": r["hi"], "margin": r["margin"], "q": r["q"], "verdict": r["verdict"],
                "n_a": r["a"]["n"], "n_b": r["b"]["n"], "control_ratio": r["control_ratio"],
                "in_headline": r["in_headline"], "flags": ";".join(r["flags"]), "config_differs": r["config_differs"],
                "ir_status": r["ir"]["status"], "ir_changed_variants": len(r["ir"]["variants"]), "run_a": r["run_a"],
                "run_b": r["run_b"], "measures_performance": r["measures_performance"]}
        assert got == {k: "" if v is None else str(v) for k, v in want.items()}, r["id"]
    by_row = {(r["op"], r["dtype"]): r for r in table_rows}
    flagged = by_row["mm", "bf16"]  # two flags, out of the headline, nothing launched
    assert (flagged["shape"], flagged["flags"], flagged["in_headline"]) == ("256x256", "timer_fallback;timer_mismatch",
                                                                          "False")
    softmax, run = by_row["softmax", "fp16"], "ops/builtin__softmax/attempt1/softmax_20250101-000000"
    assert (softmax["ir_status"], softmax["ir_changed_variants"]) == ("changed", "1")
    assert (softmax["run_a"], softmax["run_b"]) == (str(batches[0] / run), str(batches[1] / run))
    assert float(by_row["gelu", "fp32"]["ratio"]) == pytest.approx(0.8) and by_row["gelu", "fp32"]["n_a"] == "41"


def test_each_op_entry_counts_its_own_rows(batches):
    data = corpus.from_batch_pair(*batches, {})
    ops = {o["op"]: o for o in data["ops"]}
    mm, softmax, gelu = ops["builtin:mm"], ops["builtin:softmax"], ops["builtin:gelu"]
    # mm: fp16 2% faster (SAME within the single-run margin), bf16 flagged and out of its headline.
    assert (mm["rows"], mm["headline_rows"], mm["verdicts"], mm["flagged_rows"]) == (2, 1, {"SAME": 1}, 1)
    assert mm["worst_ratio"] == pytest.approx(0.98) and mm["geomean"]["ratio"] == pytest.approx(0.98)
    assert mm["geomean"]["over"] == "1 rows" and mm["control"] == pytest.approx(1.0)
    assert (softmax["verdicts"], softmax["ir_changed_rows"], softmax["flagged_rows"]) == (
        {"SLOWER": 1, "SAME": 1}, 1, 0)
    assert softmax["worst_ratio"] == pytest.approx(1.1) and softmax["geomean"]["ratio"] == pytest.approx(1.1 ** 0.5)
    assert (gelu["rows"], gelu["ir_changed_rows"], gelu["config_differs"]) == (1, 0, 0)
    assert all((o["status_a"], o["status_b"], o["notes"]) == ("PASS", "PASS", []) for o in data["ops"])
    assert mm["run_a"] == str(batches[0] / "ops/builtin__mm/attempt1/mm_20250101-000000")
    assert mm["run_b"] == str(batches[1] / "ops/builtin__mm/attempt1/mm_20250101-000000")
    assert data["summary"]["ops"] == 4 and data["summary"]["ops_compared"] == 3
    assert (data["summary"]["ir_changed_rows"], data["summary"]["ir_not_collected_rows"]) == (1, 1)


def test_the_markdown_tables_list_each_op_each_call_each_row_left_out_and_each_op_not_compared(batches):
    data = corpus.from_batch_pair(*batches, {})
    md = corpus.markdown(data)
    assert md.startswith("# Corpus A/B report\n\n") and md.endswith(
        "Per-row drill-down and the TTGIR diffs of rows whose IR changed: report.html.\n")
    assert [f"- {line}" for line in corpus.headline(data)] == md.split("\n\n")[1].splitlines()
    assert _md_table(md, "Operators (worst B/A first)") == [
        ["builtin:softmax", "2/2", f"{1.1 ** 0.5:.4f}", "SAME 1, SLOWER 1", "1.1000", "1", "0", "1.0000"],
        ["builtin:mm", "1/2", "0.9800", "SAME 1", "0.9800", "0", "1", "1.0000"],
        ["builtin:gelu", "1/1", "0.8000", "FASTER 1", "0.8000", "0", "0", "1.0000"]]
    calls = _md_table(md, "FASTER and SLOWER rows: what changed in their compiled code")
    assert [row[:5] for row in calls] == [["builtin:softmax", "fp16", "64x1024", "SLOWER", "1.1000"],
                                          ["builtin:gelu", "fp32", "4096", "FASTER", "0.8000"],
                                          ["builtin:mm", "bf16", "256x256", "SLOWER", "1.5000"]]
    assert _md_table(md, "Flagged and excluded rows") == [
        ["builtin:mm", "bf16", "256x256", "SLOWER", "timer_fallback,timer_mismatch"]]
    (unpaired,) = data["unpaired_ops"]
    assert f"## Operators not compared\n\n- builtin:add: {unpaired['reason']}\n\n" in md


def test_the_headline_says_who_a_and_b_are_counts_and_every_warning(batches):
    status = batches[1] / "batch.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "backend": "rocm"}))
    data = corpus.from_batch_pair(*batches, {"a": "fusion on", "b": "fusion off"})
    (warning,) = data["warnings"]
    assert warning == ("the batches ran on different backends (A cuda, B rocm): the comparison mixes hardware with "
                       "the compiler")
    lines = corpus.headline(data)
    assert lines[:4] == ["corpus A/B: A = fusion on, B = fusion off; ratio = B latency / A latency (below 1: B faster)",
                         f"basis: {corpus.BASIS_NOTES[corpus.SINGLE_RUN]}", f"WARNING: {warning}",
                         "ops: 3 of 4 compared; rows: 4 of 5 in the headline; verdicts: FASTER 1, SAME 2, SLOWER 1"]
    assert "excluded from the headline: timer_fallback 1, timer_mismatch 1" in lines
    assert "ops not compared: builtin:add" in lines and "rows whose IR changed: 1; IR not collected: 1" in lines
    assert lines[-1] == ("control (torch baseline) geomean B/A: 1.0000 [1.0000, 1.0000] over 3 ops (no change) -- "
                         "should be ~1: it does not depend on the compiler under test")
    overall = data["summary"]["overall"]
    assert lines[-2] == (f"overall geomean B/A: {overall['ratio']:.4f} [{overall['lo']:.4f}, {overall['hi']:.4f}] "
                         f"over 3 ops ({stats.describe(overall['ratio'])})")
    unnamed = corpus.headline(corpus.from_batch_pair(*batches, {}))
    assert unnamed[0].startswith(f"corpus A/B: A = {batches[0]}, B = {batches[1]}; ")  # the batch dirs name the sides


def test_a_row_with_no_interval_reads_so_and_an_unknown_value_is_a_dash(tmp_path):
    gm = {"ratio": 0.97, "lo": None, "hi": None, "over": "2 rows"}
    assert corpus.fmt_gm(gm, True) == f"0.9700 (no interval) over 2 rows ({stats.describe(0.97)})"
    assert corpus.fmt_gm(gm, False) == corpus.fmt_gm({**gm, "ratio": None}, True) == stats.NOT_APPLICABLE
    assert (corpus._cell(0.5, True), corpus._cell(None, True), corpus._cell(0.5, False), corpus._cell(None, False)) == (
        "0.5000", "-", stats.NOT_APPLICABLE, "-")


def test_a_diff_names_its_sides_ends_every_line_and_is_cut_at_its_limit_only(tmp_path, monkeypatch):
    a = _run(tmp_path / "a", [_row("softmax", "fp16", (8,), 1.0)],
             [("8", "fp16", "w4s3", "x\nsame\n", "l"), ("8", "fp16", "w8s3", "only A\n", "l", "8")])
    b = _run(tmp_path / "b", [_row("softmax", "fp16", (8,), 1.0)],
             [("8", "fp16", "w4s3", "y\nsame", "l"), ("8", "fp16", "w2s3", "only B\n", "l", "2")])
    indexes = (ir_index.launched(a), ir_index.launched(b))
    ir_row = corpus.row_ir(indexes, a, b, "fp16", (8,))
    assert (ir_row["status"], ir_row["identical"]) == ("changed", 0)
    by_variant = {v["variant"]: v for v in ir_row["variants"]}
    assert {k: v["status"] for k, v in by_variant.items()} == {"w4s3": "changed", "w8s3": "only_in_a",
                                                                "w2s3": "only_in_b"}
    changed = by_variant["w4s3"]
    # B's file has no final newline: the diff still has one line per line.
    assert changed["diff"].splitlines(keepends=True) == ["--- A.ttgir\n", "+++ B.ttgir\n", "@@ -1,2 +1,2 @@\n",
                                                         "-x\n", "-same\n", "+y\n", "+same\n"]
    assert changed["file_a"] == str(a / "ttgir" / "8" / "scale_kernel" / "w4s3.ttgir")
    assert changed["file_b"] == str(b / "ttgir" / "8" / "scale_kernel" / "w4s3.ttgir")
    only_a, only_b = by_variant["w8s3"], by_variant["w2s3"]
    assert (only_a["file_b"], only_a["kernel"], only_a["stages"]) == (None, "ops.k.scale_kernel", [])
    assert "-only A\n" in only_a["diff"] and only_b["file_a"] is None and "+only B\n" in only_b["diff"]
    lines = len(changed["diff"].splitlines())

    def changed_at(limit):
        monkeypatch.setattr(corpus, "MAX_DIFF_LINES", limit)
        return next(v for v in corpus.row_ir(indexes, a, b, "fp16", (8,))["variants"] if v["variant"] == "w4s3")

    whole = changed_at(lines)  # exactly at the limit: whole
    assert not whole["diff_truncated"] and whole["diff"] == changed["diff"]
    cut = changed_at(lines - 1)
    assert cut["diff_truncated"] and cut["diff"].splitlines() == changed["diff"].splitlines()[:-1]


def test_the_identical_ir_line_names_the_first_ten_calls():
    names = [f"op{i}" for i in range(11)]
    assert corpus.identical_ir_line(names[:10]) == f"{corpus.IDENTICAL_IR_NOTE}: 10 ({', '.join(names[:10])})"
    assert corpus.identical_ir_line(names) == f"{corpus.IDENTICAL_IR_NOTE}: 11 ({', '.join(names[:10])}, ...)"


def test_an_op_with_nothing_in_its_headline_comes_last_and_ops_sharing_a_name_keep_their_files(batches):
    # A second softmax, from another file, and an mm whose every row is flagged in B.
    for root, side in zip(batches, (0, 1), strict=True):
        rows = [_row("softmax", "fp16", (8,), 1.0 if side == 0 else 0.5)]
        run = "ops/other__softmax/attempt1/softmax_20250101-000000"
        _run(root / run, rows)
        with open(root / "ops_status.csv", "a") as f:
            f.write(",".join(["softmax", "builtin", "ops/other/softmax.py", "PASS", "0", "1", "1.0", "cuda", "0",
                              "graph", "1", "0", "0", run, ""]) + "\n")
        mm = root / "ops/builtin__mm/attempt1/mm_20250101-000000/results.json"
        results = json.loads(mm.read_text())
        for r in results["rows"]:
            if side == 1:
                r["markers"] = ["TIMER_FALLBACK phase=capture reason=recoverable detail='host sync'"]
                r["timer"] = "direct"
        mm.write_text(json.dumps(results))
    data = corpus.from_batch_pair(*batches, {})
    order = [o["op"] for o in data["ops"]]
    assert order[-1] == "builtin:mm" and data["ops"][-1]["geomean"]["ratio"] is None
    assert {"builtin:softmax@ops/softmax.py", "builtin:softmax@ops/other/softmax.py"} <= set(order)
    assert "builtin:gelu" in order  # a name only one op has stays short
    assert [r["in_headline"] for r in data["rows"]][-2:] == [False, False]  # mm's rows, out of the headline, last


def test_the_rows_on_identical_ir_are_found_in_every_op_not_only_the_last(tmp_path):
    groups = []
    for op in ("mm", "add", "gelu"):
        ttgir = {"A": TTGIR_A, "B": TTGIR_B if op == "gelu" else TTGIR_A}
        a, b = (_run(tmp_path / op / side, [_row(op, "fp16", (64,), 1.0)],
                     [("64", "fp16", "w4s3__fp16", ttgir[side], "l" * 16)]) for side in "AB")
        groups.append((a, b, compare.pair([a], [b])))
    assert [r.op for r in corpus.identical_ir_rows(groups)] == ["mm", "add"]  # gelu's IR changed


def test_an_op_whose_ab_dir_is_unreadable_is_listed_and_the_ops_after_it_still_compared(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ab.json").write_text("{")
    items = [("builtin:gelu", tmp_path / "never_ran"), ("builtin:add", broken),
             ("builtin:mm", _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [0.98, 0.982, 0.978]))]
    data = corpus.from_ab_dirs(items, {})
    assert [r["op_key"] for r in data["rows"]] == ["builtin:mm"]
    reasons = {u["op"]: u["reason"] for u in data["unpaired_ops"]}
    assert set(reasons) == {"builtin:gelu", "builtin:add"}
    assert reasons["builtin:add"].startswith(f"no readable ab.json in {broken}: ")
    assert data["sources"] == {"a": None, "b": None, "ab_dirs": {key: str(d) for key, d in items}}


def test_an_incomplete_ab_is_compared_on_what_completed_and_says_so_first_in_its_notes(tmp_path):
    d = _ab_dir(tmp_path / "sm", "softmax", [1.0] * 3, [1.0] * 3, failed_b=(2,))
    state = json.loads((d / "ab.json").read_text())
    state["complete"] = False
    for step in state["steps"]:  # written before steps said `usable`: exit 0 with no run dir is no run
        del step["usable"]
    state["steps"][-1]["run_dir"] = None
    (d / "ab.json").write_text(json.dumps(state))
    data = corpus.from_ab_dirs([("builtin:softmax", d)], {})
    (op,) = data["ops"]
    assert op["notes"] == ["INCOMPLETE: the A/B stopped before its last step",
                           "step failed (exit 1): [1/1 softmax] repeat 2/3: B replays A",
                           "step failed (exit 0): [1/1 softmax] repeat 3/3: B replays A"]
    (row,) = data["rows"]
    assert row["flags"] == ["incomplete_b(1/3)"] and (row["a"]["n"], row["b"]["n"]) == (3, 1)  # one latency a repeat


def test_an_op_compared_though_one_side_failed_carries_each_sides_status_and_notes(batches):
    # B's mm exited non-zero but wrote its results (a row computed wrong, say): compared, its statuses kept.
    status = batches[1] / "ops_status.csv"
    status.write_text(status.read_text().replace("mm,builtin,ops/mm.py,PASS,", "mm,builtin,ops/mm.py,FAIL,"))
    lines = status.read_text().splitlines()
    lines = [line + "exit 1" if line.startswith("mm,") else line for line in lines]  # its notes column, empty before
    status.write_text("\n".join(lines) + "\n")
    data = corpus.from_batch_pair(*batches, {})
    mm = next(o for o in data["ops"] if o["op"] == "builtin:mm")
    assert (mm["status_a"], mm["status_b"], mm["notes"]) == ("PASS", "FAIL", ["B: exit 1"])
    # The headline says each IR count for what it is.
    data["summary"]["ir_not_collected_rows"] = 2
    assert "rows whose IR changed: 1; IR not collected: 2" in corpus.headline(data)


def test_the_control_spread_is_over_the_headlines_rows_not_a_degraded_ones(tmp_path):
    # Two ops whose controls agree, and a third whose B row fell back to another timer (out of the
    # headline): its control, 20% off, says nothing about the sides' processes.
    sides = _control_batches(tmp_path, [1.0, 1.001, 1.2])
    results = sides[1] / "ops/builtin__op2/attempt1/op2_20250101-000000/results.json"
    data = json.loads(results.read_text())
    data["rows"][0].update(timer="direct", markers=["TIMER_FALLBACK phase=capture reason=recoverable detail='x'"])
    results.write_text(json.dumps(data))
    report = corpus.from_batch_pair(*sides, {})
    assert [r["in_headline"] for r in report["rows"]] == [True, True, False]
    assert report["rows"][2]["control_ratio"] == pytest.approx(1.2)
    assert not [w for w in report["warnings"] if w.startswith("the control")]


def test_each_side_summary_is_its_latencies_range_and_geometric_mean(batches):
    row = _rows(corpus.from_batch_pair(*batches, {}))[("mm", "fp16")]
    raw_a, raw_b = 1.0 * (1 + JITTER), 0.98 * (1 + JITTER)
    for side, raw in (("a", raw_a), ("b", raw_b)):
        assert row[side] == {"n": len(raw), "gm_ms": pytest.approx(stats.center(list(raw))),
                             "min_ms": pytest.approx(raw.min()), "max_ms": pytest.approx(raw.max())}


def test_an_op_one_batch_never_ran_is_listed_as_absent_there(batches):
    status = batches[1] / "ops_status.csv"
    status.write_text("".join(line for line in status.read_text().splitlines(keepends=True)
                              if not line.startswith("add,")))
    (unpaired,) = corpus.from_batch_pair(*batches, {})["unpaired_ops"]
    assert unpaired == {"op": "builtin:add", "reason": "status A PASS, B absent: a side has no results"}


def test_an_op_whose_replays_all_failed_names_both_sides(tmp_path):
    d = _ab_dir(tmp_path / "sm", "softmax", [1.0] * 2, [1.0] * 2)
    state = json.loads((d / "ab.json").read_text())
    for step in state["steps"][1:]:
        step.update(exit=1, usable=False)
    (d / "ab.json").write_text(json.dumps(state))
    (unpaired,) = corpus.from_ab_dirs([("builtin:softmax", d)], {})["unpaired_ops"]
    assert unpaired["reason"].startswith("no completed replay of side A and B; step failed (exit 1): ")


def test_an_ab_of_one_replay_a_side_is_single_run_and_one_short_side_is_not(tmp_path):
    single = _ab_dir(tmp_path / "one", "mm", [1.0], [0.9])
    short = _ab_dir(tmp_path / "short", "gelu", [1.0, 1.001], [0.9, 0.901])
    state = json.loads((short / "ab.json").read_text())
    state["steps"][1].update(exit=1, usable=False)  # A's first replay failed: A 1, B 2
    (short / "ab.json").write_text(json.dumps(state))
    data = corpus.from_ab_dirs([("builtin:mm", single), ("builtin:gelu", short)], {})
    rows = {r["op_key"]: r for r in data["rows"]}
    assert (rows["builtin:mm"]["basis"], rows["builtin:mm"]["margin"]) == (corpus.SINGLE_RUN, compare.SINGLE_RUN_MARGIN)
    assert rows["builtin:gelu"]["basis"] == corpus.REPEATS and rows["builtin:gelu"]["flags"] == ["incomplete_a(1/2)"]
    assert data["basis"] == corpus.SINGLE_RUN  # a headline row of one run a side


def test_ab_dirs_on_the_interpreter_give_no_verdict_and_say_why(tmp_path):
    d = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [0.5, 0.501, 0.499], backend="interpreter")
    data = corpus.from_ab_dirs([("builtin:mm", d)], {})
    assert data["note"].startswith("NOTE: backend 'interpreter'") and not data["measures_performance"]
    assert [r["verdict"] for r in data["rows"]] == [stats.NOT_APPLICABLE]


def test_a_dir_that_is_no_batch_dir_is_one_line_of_error(tmp_path, batches):
    with pytest.raises(corpus.UsageError, match=re.escape(f"{tmp_path} is not a batch dir (it has no batch.json)")):
        corpus.from_batch_pair(tmp_path, batches[1], {})


def test_batches_of_one_backend_give_no_warning_and_each_sides_absence_and_notes_are_said(batches):
    assert corpus.from_batch_pair(*batches, {})["warnings"] == []  # same backend, same devices
    for root, op in ((batches[0], "gelu"), (batches[1], "add")):
        status = root / "ops_status.csv"
        status.write_text("".join(line for line in status.read_text().splitlines(keepends=True)
                                  if not line.startswith(f"{op},")))
    status = batches[0] / "ops_status.csv"
    status.write_text(status.read_text().replace("mm,builtin,ops/mm.py,PASS,0,1,1.0,cuda,0,graph,2,0,0,",
                                                 "mm,builtin,ops/mm.py,FAIL,0,1,1.0,cuda,0,graph,2,0,0,,"))
    reasons = {u["op"]: u["reason"] for u in corpus.from_batch_pair(*batches, {})["unpaired_ops"]}
    assert reasons["builtin:gelu"] == "status A absent, B PASS: a side has no results"
    assert reasons["builtin:add"] == "status A PASS, B absent: a side has no results"
    assert reasons["builtin:mm"].startswith("status A FAIL, B PASS: a side has no results; A: ")


def test_a_batch_dir_that_does_not_read_is_one_line_of_error(batches):
    (batches[0] / "batch.json").write_text("{")
    with pytest.raises(corpus.UsageError, match=re.escape(f"batch dir {batches[0]} is unreadable: ")):
        corpus.from_batch_pair(*batches, {})


def test_a_batch_pair_names_its_two_dirs_and_every_op_that_moved_device(batches):
    status = batches[1] / "ops_status.csv"
    for op in ("gelu", "mm"):
        status.write_text(status.read_text().replace(f"{op},builtin,ops/{op}.py,PASS,0,1,1.0,cuda,0,",
                                                     f"{op},builtin,ops/{op}.py,PASS,0,1,1.0,cuda,1,"))
    data = corpus.from_batch_pair(*batches, {})
    assert data["sources"] == {"a": str(batches[0]), "b": str(batches[1]), "ab_dirs": None}
    assert "2 op(s) ran on another device in B than in A: builtin:mm, builtin:gelu" in data["warnings"]


def _md_header(md: str, title: str) -> list[str]:
    """The header row of the markdown table under `## title`."""
    line = md.split(f"## {title}\n\n", 1)[1].splitlines()[0]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_markdown_tables_name_their_columns(batches):
    md = corpus.markdown(corpus.from_batch_pair(*batches, {}))
    assert _md_header(md, "Operators (worst B/A first)") == [
        "op", "rows in headline", "geomean B/A", "verdicts", "worst B/A", "IR changed", "flagged", "control B/A"]
    assert _md_header(md, "FASTER and SLOWER rows: what changed in their compiled code") == [
        "op", "dtype", "shape", "verdict", "B/A", "what changed"]
    assert _md_header(md, "Flagged and excluded rows") == ["op", "dtype", "shape", "verdict", "flags"]


def test_a_headline_with_no_verdicts_and_unnamed_sides_says_so(tmp_path):
    # Nothing compared: no verdict to count; every op not compared is named; no context names the sides.
    lines = corpus.headline(corpus.from_ab_dirs([("builtin:gelu", tmp_path / "g"), ("builtin:add", tmp_path / "a")],
                                                {}))
    assert lines[0] == "corpus A/B: A = A, B = B; ratio = B latency / A latency (below 1: B faster)"
    assert "ops: 0 of 2 compared; rows: 0 of 0 in the headline; verdicts: none" in lines
    assert "ops not compared: builtin:gelu, builtin:add" in lines


def test_the_headline_and_each_op_count_the_rows_whose_sides_ran_different_configs(batches):
    results = batches[1] / "ops/builtin__gelu/attempt1/gelu_20250101-000000/results.json"
    data = json.loads(results.read_text())
    data["rows"][0]["configs"] = {"k": "BLOCK=128"}
    results.write_text(json.dumps(data))
    data = corpus.from_batch_pair(*batches, {})
    assert "rows whose sides ran different autotune configs: 1" in corpus.headline(data)
    assert {o["op"]: o["config_differs"] for o in data["ops"]} == {"builtin:gelu": 1, "builtin:softmax": 0,
                                                                   "builtin:mm": 0}
    same = corpus.headline(corpus.from_batch_pair(batches[0], batches[0], {}))  # A against itself
    assert not [line for line in same if "autotune configs" in line]


def test_the_report_is_written_into_an_out_dir_made_with_its_parents(batches, tmp_path):
    out = tmp_path / "reports" / "corpus"  # neither exists yet
    paths = corpus.write(out, corpus.from_batch_pair(*batches, {}))
    assert [p.name for p in paths] == ["report.json", "report.csv", "report.md", "report.html"]
    assert all(p.parent == out and p.is_file() for p in paths)


def test_a_row_is_keyed_by_op_dtype_and_shape_and_lists_its_latencies_only_as_independent_repeats(batches, tmp_path):
    rows = _rows(corpus.from_batch_pair(*batches, {}))
    softmax = rows["softmax", "fp16"]
    assert softmax["id"] == "builtin:softmax|fp16|64x1024"
    assert rows["mm", "fp16"]["ir"] == {"status": "none_launched", "identical": 0, "variants": []}  # IR, no kernel
    # One run a side: its samples come from one process, no repeats to list.
    assert (softmax["basis"], softmax["a_repeats_ms"], softmax["b_repeats_ms"]) == (corpus.SINGLE_RUN, None, None)
    d = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [0.98, 0.982, 0.978])
    (row,) = corpus.from_ab_dirs([("builtin:mm", d)], {})["rows"]
    assert (row["basis"], row["a_repeats_ms"], row["b_repeats_ms"]) == (corpus.REPEATS, [1.0, 1.002, 0.998],
                                                                        [0.98, 0.982, 0.978])


def test_a_row_whose_processes_factor_was_taken_out_carries_it(tmp_path):
    # Four rows of one latency band in three processes a side, every kernel of a process (baseline
    # and candidate) as much faster or slower as the process: that factor is fitted and taken out.
    factors = {"A": (1.0, 1.02, 0.98), "B": (1.01, 0.99, 1.0)}
    d = _ab_dir(tmp_path / "mm", "mm", [1.0] * 3, [1.0] * 3)
    for side, side_factors in factors.items():
        for i, f in enumerate(side_factors, 1):
            rows = [_row("mm", "fp16", (64 * k,), f * (1 + k / 100), base=f * (1 + k / 50)) for k in range(1, 5)]
            (d / "mm" / f"{side}-{i}" / "r" / "results.json").write_text(json.dumps({"format": 1, "rows": rows}))
    rows = corpus.from_ab_dirs([("builtin:mm", d)], {})["rows"]
    assert len(rows) == 4 and all(r["process_factor"] == pytest.approx(1.0, abs=0.05) for r in rows)


def test_an_op_entry_counts_each_verdict_over_its_rows(batches):
    results = batches[1] / "ops/builtin__softmax/attempt1/softmax_20250101-000000/results.json"
    data = json.loads(results.read_text())
    data["rows"][0] = _row("softmax", "fp16", (64, 1024), 2.0)  # B's fp16 row as fast as A's, as its bf16 is
    results.write_text(json.dumps(data))
    ops = {o["op"]: o for o in corpus.from_batch_pair(*batches, {})["ops"]}
    assert ops["builtin:softmax"]["verdicts"] == {"SAME": 2}


def test_an_interval_has_both_bounds_finite_and_positive_or_none():
    assert corpus._bounds(0.9, 1.1) == (0.9, 1.1)
    for lo, hi in ((None, 1.1), (0.9, None), (0.0, math.inf), (0.0, 1.1), (0.9, math.inf), (math.nan, 1.1),
                   (-0.1, 1.1)):
        assert corpus._bounds(lo, hi) == (None, None), (lo, hi)


def test_a_corpus_calls_a_row_only_at_the_false_discovery_rate_it_was_given(tmp_path):
    items = [("builtin:mm", _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [0.98, 0.982, 0.978]))]
    data = corpus.from_ab_dirs(items, {})
    (row,) = data["rows"]
    assert row["verdict"] == stats.FASTER and 0 < row["q"] < stats.FDR
    # Repeats: the headline's intervals are over rows.
    assert data["basis"] == corpus.REPEATS and data["basis_note"] == corpus.BASIS_NOTES[corpus.REPEATS]
    assert data["summary"]["overall"]["over"] == data["summary"]["control"]["over"] == "1 rows"
    strict = corpus.from_ab_dirs(items, {}, fdr=row["q"] / 2)
    assert strict["fdr"] == row["q"] / 2 and strict["rows"][0]["verdict"] != stats.FASTER
    fdr_line = f"FASTER/SLOWER calls: 0, at a false discovery rate of {row['q'] / 2:g} "
    assert strict["summary"]["fdr_line"].startswith(fdr_line)


def test_interpreter_timings_on_identical_ir_are_no_a_a_to_calibrate_against(tmp_path):
    d = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.002, 0.998], [1.0, 1.002, 0.998], backend="interpreter",
                ttgir=(TTGIR_A, TTGIR_A))
    data = corpus.from_ab_dirs([("builtin:mm", d)], {})
    assert data["rows"][0]["ir"]["status"] == "identical" and data["rows"][0]["in_headline"]
    assert data["summary"]["calibration"] is None


def test_the_rows_run_from_the_largest_b_a_down_and_those_without_a_ratio_come_last(batches):
    def results(op):
        return batches[1] / f"ops/builtin__{op}/attempt1/{op}_20250101-000000/results.json"

    softmax = json.loads(results("softmax").read_text())
    softmax["rows"][0] = _row("softmax", "fp16", (64, 1024), 1.4)  # now B's fastest row, its first op's
    results("softmax").write_text(json.dumps(softmax))
    mm = json.loads(results("mm").read_text())
    mm["rows"][0]["status"] = "FAILED"  # no ratio: out of the headline, after the flagged row that has one
    results("mm").write_text(json.dumps(mm))
    rows = corpus.from_batch_pair(*batches, {})["rows"]
    assert [(r["op"], r["dtype"]) for r in rows] == [("softmax", "bf16"), ("gelu", "fp32"), ("softmax", "fp16"),
                                                     ("mm", "bf16"), ("mm", "fp16")]
    assert [r["in_headline"] for r in rows] == [True, True, True, False, False] and rows[-1]["ratio"] is None


def test_a_row_whose_ir_a_side_did_not_collect_is_not_compared(tmp_path):
    variants = [("8", "fp16", "w4s3", "x\n", "l")]
    a = _run(tmp_path / "a", [_row("softmax", "fp16", (8,), 1.0)], variants)
    b = _run(tmp_path / "b", [_row("softmax", "fp16", (8,), 1.0)], [("8", "fp16", "w4s3", "y\n", "l")])
    indexes = (ir_index.launched(a), ir_index.launched(b))
    assert corpus.row_ir(indexes, a, b, "fp16", (8,))["status"] == "changed"
    not_collected = {"status": "not_collected", "identical": 0, "variants": []}
    for args in (((indexes[0], None), a, b), ((None, indexes[1]), a, b), (indexes, None, b), (indexes, a, None)):
        assert corpus.row_ir(*args, "fp16", (8,)) == not_collected


def _sequential(ab_dir, first=3, cap=6):
    """Mark an ab dir's plan as --repeats auto (its repeats then read as rounds of that schedule)."""
    state = json.loads((ab_dir / "ab.json").read_text())
    state["plan"].update(repeats="auto", first=first, max_repeats=cap, resolve=0.01)
    (ab_dir / "ab.json").write_text(json.dumps(state))
    return ab_dir


def test_a_corpus_of_sequential_ab_dirs_is_judged_look_by_look_and_a_row_past_the_first_round_is_complete(tmp_path):
    # A row settled by the report's own schedule at its cap (6 repeats): read as asked of it, not as short of
    # a fixed count; its interval is the running intersection of its looks (reports.sequential).
    quiet = [1.0, 1.001, 0.999, 1.0, 1.001, 0.999]
    d = _sequential(_ab_dir(tmp_path / "mm", "mm", quiet, [x * 1.0 for x in quiet]))
    data = corpus.from_ab_dirs([("builtin:mm", d)], {})
    (row,) = data["rows"]
    assert row["a_repeats_ms"] == quiet and not [f for f in row["flags"] if f.startswith("incomplete")]
    assert row["verdict"] == stats.SAME


def test_a_corpus_of_ab_dirs_timed_under_different_repeats_is_refused_in_one_line(tmp_path):
    fixed = _ab_dir(tmp_path / "mm", "mm", [1.0, 1.001, 0.999], [1.0, 1.001, 0.999])
    auto = _sequential(_ab_dir(tmp_path / "add", "add", [1.0, 1.001, 0.999], [1.0, 1.001, 0.999]))
    with pytest.raises(corpus.UsageError, match="different repeats"):
        corpus.from_ab_dirs([("builtin:mm", fixed), ("builtin:add", auto)], {})
