"""What B changed (reports.explain), on the statistics of kernels really compiled for sm_90 on this
CPU (test_kernel_stats.compile_for): the delta of one variant, a report row's record, the corpus's
groups of calls sharing a change, and where each appears (report.json, report.md, report.html,
compare-ir, the single-op A/B report)."""

import json

import jsonschema
import pytest
from test_corpus_report import SCHEMA, TTGIR_A, TTGIR_B, _ab_dir, _row, _run
from test_kernel_stats import H200, compile_for

from harness import cli
from harness.core import ir_index
from harness.core.ir_index import NOT_AVAILABLE
from harness.measure import kernel_stats
from harness.sessions import ab
from reports import corpus, explain, stats

HASH = "hw4s3__fp16fp16"  # the index row's cache hash that test_corpus_report._ir writes


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """label -> record: the copy (aligned, misaligned) and the dot with MMA v3 (dot) and without (dot_v2)."""
    tools = kernel_stats.find_tools()
    if not tools["cuobjdump"]:
        pytest.skip("this Triton ships no cuobjdump")
    v3 = compile_for(tmp_path_factory.mktemp("v3"), "cuda", "90")
    v2 = compile_for(tmp_path_factory.mktemp("v2"), "cuda", "90", DISABLE_MMA_V3="1")
    out = {label: kernel_stats.extract(*k, tools, H200) for label, k in v3.items()}
    out["dot_v2"] = kernel_stats.extract(*v2["dot"], tools, H200)
    out["dot_no_tools"] = kernel_stats.extract(*v3["dot"], {}, H200)
    return out


def by_field(changes):
    return {c["field"]: (c["a"], c["b"]) for c in changes}


def test_the_delta_of_wgmma_off_names_the_mma_change_with_both_values(records):
    a, b = records["dot"], records["dot_v2"]
    changes = by_field(explain.delta(a, b))
    assert changes["wgmma"] == (a["wgmma"], 0) and a["wgmma"] > 0
    assert changes["mma.sync"] == (0, b["mma.sync"]) and b["mma.sync"] > 0
    assert changes["mma layout"][0].startswith("nvidia_mma v3") and changes["mma layout"][1].startswith("nvidia_mma v2")
    assert changes["dot ops"] == ("ttng.warp_group_dot x1", "tt.dot x1")
    assert changes["pipeline buffers"] == ("3,3", "2,2") and changes["smem"] == (98304, 65536)
    # Only what changed: the launch shape is the same.
    assert "warps" not in changes and "stages" not in changes and "instructions from" not in changes
    text = "; ".join(explain.change_text(c) for c in explain.delta(a, b))
    assert f"wgmma {a['wgmma']} -> 0" in text and f"mma.sync 0 -> {b['mma.sync']}" in text
    assert "smem 96 KB -> 64 KB" in text
    if a["regs"] != b["regs"]:
        assert f"regs {a['regs']} -> {b['regs']}" in text
    assert explain.delta(a, dict(a)) == []


def test_a_load_width_change_reads_in_bits(records):
    changes = explain.delta(records["copy_aligned"], records["copy_misaligned"])
    texts = [explain.change_text(c) for c in changes]
    assert "global load widths 128 bits -> 32 bits" in texts and "global store widths 128 bits -> 32 bits" in texts


def test_a_statistic_one_side_could_not_read_shows_as_not_available_and_none_both_could_not(records):
    changes = by_field(explain.delta(records["dot"], records["dot_no_tools"]))
    assert changes["regs"] == (records["dot"]["regs"], NOT_AVAILABLE)
    assert changes["instructions from"] == ("sass", "ptx")
    assert records["dot"]["scalar regs"] == NOT_AVAILABLE and "scalar regs" not in changes


def _with_stats(ab_dir, record_a, record_b):
    """Write each run's ttgir/stats.json (the one variant's record) into an ab dir of _ab_dir."""
    for step in json.loads((ab_dir / "ab.json").read_text())["steps"]:
        record = record_b if step["side"] == "B" else record_a
        path = ir_index.stats_path(step["run_dir"])
        path.write_text(json.dumps({"format": 1, "tools": {}, "variants": {HASH: record}}))
    return ab_dir


SLOWER = ([1.0, 1.002, 0.998], [1.9, 1.902, 1.898])


def test_a_corpus_names_what_changed_per_call_groups_shared_changes_and_shows_them_in_every_report(records, tmp_path):
    copy_a, copy_b, dot_a, dot_b = (records[k] for k in ("copy_aligned", "copy_misaligned", "dot", "dot_v2"))
    items = [(f"builtin:copy{i}", _with_stats(_ab_dir(tmp_path / f"c{i}", f"copy{i}", *SLOWER,
                                                      ttgir=(TTGIR_A, TTGIR_B)), copy_a, copy_b)) for i in range(3)]
    items.append(("builtin:mm", _with_stats(_ab_dir(tmp_path / "mm", "mm", *SLOWER, ttgir=(TTGIR_A, TTGIR_B)),
                                            dot_a, dot_b)))
    # Not a call: no record, though its code changed the same way.
    items.append(("builtin:same", _with_stats(_ab_dir(tmp_path / "s", "same", [1.0] * 3, [1.0] * 3,
                                                      ttgir=(TTGIR_A, TTGIR_B)), copy_a, copy_b)))
    data = corpus.from_ab_dirs(items, {})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    rows = {r["op_key"]: r for r in data["rows"]}
    assert rows["builtin:same"]["verdict"] == stats.SAME and rows["builtin:same"]["what_changed"] is None
    mm = rows["builtin:mm"]
    assert mm["verdict"] == stats.SLOWER
    [variant] = mm["what_changed"]["variants"]
    assert variant["status"] == "changed" and variant["kernel"] == "scale_kernel"
    assert by_field(variant["changes"])["wgmma"] == (dot_a["wgmma"], 0)
    assert mm["what_changed"]["text"].startswith(f"wgmma {dot_a['wgmma']} -> 0; mma.sync 0 -> ")
    # The three copies share every change of theirs: one group, their changes in the rows' order.
    [group] = data["summary"]["change_groups"]
    assert group["verdict"] == stats.SLOWER and group["rows"] == 3
    assert group["changes"][:2] == ["global load widths 128 bits -> 32 bits", "global store widths 128 bits -> 32 bits"]
    assert group["changes"] == [explain.change_text(c) for c in explain.delta(copy_a, copy_b)]
    assert sorted(group["ids"]) == sorted(rows[f"builtin:copy{i}"]["id"] for i in range(3))

    out = tmp_path / "out"
    corpus.write(out, data)
    md = (out / "report.md").read_text()
    assert "3 SLOWER rows share: global load widths 128 bits -> 32 bits; global store widths" in md
    calls = md[md.index("## FASTER and SLOWER rows: what changed"):]
    mm_line = next(line for line in calls.splitlines() if line.startswith("| builtin:mm"))
    # The compact column leads with the matrix unit.
    assert f"| wgmma {dot_a['wgmma']} -> 0; mma.sync 0 -> {dot_b['mma.sync']}; mma layout" in mm_line
    page = (out / "report.html").read_text()
    detail = page[page.index('id="row-builtin:mm|'):]
    table_at, diff_at = detail.index('class="what-changed"'), detail.index('class="diff"')
    assert table_at < diff_at  # the named facts above the diff
    assert "<td>wgmma</td><td>" + str(dot_a["wgmma"]) + "</td><td>0</td>" in detail[table_at:diff_at]
    assert "<td>smem</td><td>96 KB</td><td>64 KB</td>" in detail[table_at:diff_at]


def test_a_run_without_statistics_says_not_available(records, tmp_path):
    ab_dir = _ab_dir(tmp_path / "mm", "mm", *SLOWER, ttgir=(TTGIR_A, TTGIR_B))  # an older run: no stats.json
    data = corpus.from_ab_dirs([("builtin:mm", ab_dir)], {})
    jsonschema.validate(json.loads(json.dumps(data)), SCHEMA)
    what = data["rows"][0]["what_changed"]
    assert what["variants"] == [] and what["text"].startswith("not available (no kernel statistics in A and B")


def test_compare_ir_prints_what_changed_per_variant(records, tmp_path, capsys):
    ab_dir = _with_stats(_ab_dir(tmp_path / "mm", "mm", *SLOWER, ttgir=(TTGIR_A, TTGIR_B)), records["dot"],
                         records["dot_v2"])
    steps = json.loads((ab_dir / "ab.json").read_text())["steps"]
    assert cli.main(["compare-ir", steps[1]["run_dir"], steps[2]["run_dir"]]) == 0
    out = capsys.readouterr().out
    assert "what changed (kernel statistics, A -> B):" in out
    line = next(x for x in out.splitlines() if x.startswith("  64 scale_kernel w4s3__fp16:"))
    assert f"wgmma {records['dot']['wgmma']} -> 0" in line and "pipeline buffers 3,3 -> 2,2" in line


def test_a_single_op_ab_report_has_a_what_changed_column_and_json_field(records, tmp_path, capsys):
    def runs(side, ms, record):
        made = []
        for i in range(3):
            run = _run(tmp_path / f"{side}{i}", [_row("mm", "fp16", (64,), ms * (1 + i / 1000))],
                       [("64", "fp16", "w4s3__fp16", TTGIR_A if side == "A" else TTGIR_B, "l" * 16)])
            ir_index.stats_path(run).write_text(json.dumps({"format": 1, "tools": {}, "variants": {HASH: record}}))
            made.append(run)
        return made

    out = tmp_path / "report"
    out.mkdir()
    ab.report(out, [{"A": runs("A", 1.0, records["dot"]), "B": runs("B", 1.9, records["dot_v2"])}], {"name": "t"}, [],
              {"cuda"}, expected=3)
    md = (out / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| op"))
    assert [h.strip() for h in header.strip("| ").split("|")][-2:] == ["what changed", "flags"]
    assert f"wgmma {records['dot']['wgmma']} -> 0" in md
    assert f"wgmma {records['dot']['wgmma']} -> 0" in capsys.readouterr().out  # the terminal's report says it too
    row = json.loads((out / "report.json").read_text())["rows"][0]
    assert by_field(row["what_changed"]["variants"][0]["changes"])["mma.sync"] == (0, records["dot_v2"]["mma.sync"])


def _call(rid, verdict, *changes):
    return {"id": rid, "verdict": verdict, "what_changed": {"text": "", "variants": [
        {"changes": [{"field": f, "a": a, "b": b} for f, a, b in changes]}]}}


def test_rows_group_by_the_changes_they_share_within_a_verdict():
    width = ("global load widths", "128", "32")
    rows = [_call("r0", stats.SLOWER, width, ("regs", 10, 20)), _call("r1", stats.SLOWER, width, ("regs", 10, 30)),
            _call("r2", stats.SLOWER, width, ("regs", 10, 30)), _call("r3", stats.FASTER, width),
            _call("r4", stats.SAME, width), _call("r5", stats.SLOWER, ("regs", 10, 40))]
    assert explain.group_lines(explain.groups(rows)) == [
        "3 SLOWER rows share: global load widths 128 bits -> 32 bits", "2 SLOWER rows share: regs 10 -> 30"]
    assert explain.groups(rows[:1] + rows[3:]) == []  # nothing 2 rows of one verdict share


def test_a_single_op_ab_without_ir_has_no_what_changed_column(tmp_path, capsys):
    def runs(side, ms):
        return [_run(tmp_path / f"{side}{i}", [_row("mm", "fp16", (64,), ms * (1 + i / 1000))]) for i in range(3)]

    out = tmp_path / "report"
    out.mkdir()
    ab.report(out, [{"A": runs("A", 1.0), "B": runs("B", 1.9)}], {"name": "t"}, [], {"cuda"}, expected=3)
    assert "what changed" not in (out / "report.md").read_text()
    row = json.loads((out / "report.json").read_text())["rows"][0]
    assert row["comparison"]["verdict"] == stats.SLOWER and row["what_changed"]["text"].startswith("not available")
