"""The A/B session end to end on the interpreter backend, plus plan parsing and validity."""

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, exits_of, harness_env, load
from result_rows import result_row

from harness import cli
from harness.core import paths
from harness.core.options import RunOptions
from harness.measure import ir
from harness.sessions import ab
from harness.sessions.ab import session as ab_session
from harness.sessions.ab import steps as ab_steps
from reports import compare, table

# A user operator that writes the ZL_TEST_SWITCH its run saw into its run dir.
PROBE = REPO / "tests" / "resources" / "user_ops" / "switch_probe.py"


def ab_dir_of(proc):
    for line in proc.stdout.splitlines():
        if line.startswith("ab dir: "):
            return Path(line[len("ab dir: "):].strip())
    raise AssertionError(proc.stdout + proc.stderr)


BREAKS = REPO / "tests" / "resources" / "user_ops" / "switch_breaks.py"


@pytest.mark.e2e
def test_rows_b_breaks_are_reported_failed_with_its_error_and_its_other_rows_compared(harness, tmp_path):
    # B's replays exit 1 (one row wrong) yet ran every case: their rows count, the wrong one as a
    # failure of B named in every report, the right one paired as usual.
    proc = harness("ab", "--ops", "switch_breaks", "--ops-path", BREAKS, "--backend", "interpreter",
                   "--b-env", "ZL_TEST_SWITCH=1", "--repeats", "2", "--out", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    d = ab_dir_of(proc)
    state = load(d / "ab.json")
    assert [(s["side"], s["exit"], s["usable"]) for s in state["steps"]] == [
        ("A", 0, True), ("B", 1, True), ("A", 0, True), ("B", 1, True), ("A", 0, True), ("B", 1, True)]
    rows = {tuple(r["shape"]): r for r in load(d / "report.json")["rows"]}
    assert rows[(300,)]["flags"] == ["failed_b(2/2)", "incomplete_b(0/2)"]
    assert rows[(300,)]["errors"]["b"].startswith("AssertionError: candidate disagrees with baseline")
    assert rows[(2, 700)]["flags"] == [] and len(rows[(2, 700)]["b_ms"]) == 2
    assert "rows that FAILED on a side (out of the headline): 1" in proc.stdout
    assert "switch_breaks fp32 300: B AssertionError: candidate disagrees" in (d / "report.md").read_text()


@pytest.mark.e2e
def test_an_unknown_op_in_the_plan_stops_the_ab_before_any_step(harness, tmp_path):
    proc = harness("ab", "--ops", "add", "no_such_op", "--backend", "interpreter", "--out", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown operator 'no_such_op'" in proc.stderr and not list(tmp_path.glob("ab_*"))


@pytest.mark.e2e
def test_an_op_whose_record_dies_makes_the_ab_fail(harness, tmp_path):
    # crashy resolves, but its record is killed on its second shape: that op has nothing to
    # compare, a failure even though every row of the other op made the headline.
    proc = harness("ab", "--ops", "add", "crashy", "--ops-path", REPO / "tests" / "resources" / "crash_ops",
                   "--backend", "interpreter", "--repeats", "2", "--out", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = load(ab_dir_of(proc) / "report.json")
    assert {r["op"] for r in report["rows"]} == {"add"}
    assert report["summary"]["headline_rows"] == report["summary"]["rows"]
    assert any(w.startswith("no rows to compare for crashy") for w in report["warnings"])


@pytest.mark.e2e
def test_ab_flow_pairs_rows_and_writes_every_report_file(harness, tmp_path):
    proc = harness("ab", "--ops", "switch_probe", "--ops-path", PROBE, "--backend", "interpreter",
                   "--b-env", "ZL_TEST_SWITCH=1", "--repeats", "2", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = ab_dir_of(proc)
    for name in ("report.md", "report.csv", "report.json", "report.html", "ratios.png", "ab.json", "ab.log"):
        assert (d / name).is_file(), name
    state = load(d / "ab.json")
    assert state["complete"] is True
    # One record (carrying A's passes), B's untimed passes step, then A and B interleaved.
    assert [s["what"].split(": ")[-1] for s in state["steps"]] == [
        "[1/1 switch_probe] A records", "[1/1 switch_probe] B's IR and kernels (not timed for the verdict)",
        "A replays A", "B replays A", "A replays A", "B replays A"]
    # B ran with B's environment, A (its record included) without it: the probe operator wrote the
    # switch each of its cases saw into its run dir.
    seen = [(s["side"], (Path(s["run_dir"]) / "switch_seen.txt").read_text().split()) for s in state["steps"]]
    a, b = ("A", ["unset", "unset"]), ("B", ["1", "1"])
    assert seen == [a, b, a, b, a, b]
    report = load(d / "report.json")
    assert len(report["rows"]) == 2  # tiny pointwise shapes
    # The interpreter's timings are not performance numbers: paired and compared all the same, but
    # no verdict is called, and every report says why at its top.
    note = table.not_performance_note("interpreter")
    assert report["measures_performance"] is False and report["note"] == note
    for row in report["rows"]:
        assert len(row["a_ms"]) == 2 and len(row["b_ms"]) == 2 and row["flags"] == []
        assert row["comparison"]["verdict"] == "n/a" and row["comparison"]["ratio"] > 0
    assert report["summary"]["headline_rows"] == 2
    assert any("IR was not collected" in w for w in report["warnings"])
    assert "overall geomean B/A: n/a" in proc.stdout and "B/A" in (d / "report.md").read_text()
    assert proc.stdout.split("ab dir: ", 1)[1].splitlines()[1] == note  # atop the run
    printed = proc.stdout.split("\n\n", 1)[1]
    assert printed.splitlines()[0] == note and printed.count(note) == 1  # atop the report
    assert (d / "report.md").read_text().splitlines()[2] == f"- {note}"
    assert (d / "report.csv").read_text().startswith("op,")  # a CSV reader's header, no comment line
    assert not re.search(r"x (slower|faster)|no change|FASTER|SLOWER|SAME|NOISY", printed)
    # B replayed A's configs: every row ran the same configs on both sides.
    assert all(not row["config_differs"] for row in report["rows"])


@pytest.mark.e2e
def test_incomplete_pairing_is_reported_as_such(harness, tmp_path):
    proc = harness("ab", "--ops", "add", "--backend", "interpreter", "--b-python", "/bin/false",
                   "--repeats", "2", "--out", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = load(ab_dir_of(proc) / "report.json")
    assert report["summary"]["headline_rows"] == 0
    assert all(row["comparison"] is None for row in report["rows"])
    assert any("step(s) failed" in w for w in report["warnings"])
    assert "UNPAIRED" in proc.stdout


@pytest.mark.e2e
def test_compare_two_records_shows_config_drift(harness, tmp_path):
    for _ in range(2):
        proc = harness("record", "add", "--backend", "interpreter", "--out", tmp_path / "rec")
        assert proc.returncode == 0
    runs = sorted((tmp_path / "rec").iterdir())
    # Independent sweeps (host-timed here) may pick anything: pin the second record's choices to the
    # first's, then make one row differ, as a re-sweep would.
    first = json.loads((runs[0] / "results.json").read_text())
    results = json.loads((runs[1] / "results.json").read_text())
    for mine, theirs in zip(results["rows"], first["rows"], strict=True):
        mine["configs"] = theirs["configs"]
    results["rows"][0]["configs"] = {"ops.add.add_kernel": "BLOCK=999 num_warps=1 num_stages=3"}
    (runs[1] / "results.json").write_text(json.dumps(results))
    proc = harness("ab", "--compare", runs[0], runs[1], "--out", tmp_path / "cmp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rows whose sides ran different autotune configs: 1" in proc.stdout
    assert "config_differs" in proc.stdout
    # A results.json that does not read is one line, before any report is written.
    (runs[1] / "results.json").write_text('{"rows": [')
    proc = harness("ab", "--compare", runs[0], runs[1], "--out", tmp_path / "cmp2")
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: --compare: {runs[1] / 'results.json'} does not "
                                                           "read as results: not JSON"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "cmp2").exists()


def test_plan_errors_name_file_and_field(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("ops: [add]\nrepeats: 1\n")
    with pytest.raises(ab.PlanError, match=r"plan .*plan.yaml: 'repeats' must be an integer from 2 to 100"):
        ab.load_plan(p)
    p.write_text("ops: [add]\nb: {env: {X: 1}, requirements: missing.txt}\n")
    with pytest.raises(ab.PlanError, match=r"requirements file .*missing.txt does not exist"):
        ab.load_plan(p)
    p.write_text("ops: [add]\nflavour: x\n")
    with pytest.raises(ab.PlanError, match=r"unknown fields \['flavour'\]"):
        ab.load_plan(p)


@pytest.mark.parametrize("line,error", [
    ("b: {env: {'A=B': '1'}}", "env name 'A=B' is not a variable name"),
    ("b: {env: {'': '1'}}", "env name '' is not a variable name"),
    ("b: {env: {X: null}}", "env X: None is not a string or a number"),
    ("b: {env: {X: true}}", "env X: True is not a string"), ("b: {env: {X: [1]}}", "env X: \\[1\\] is not a string"),
    ("dtypes: [fp99]", "'dtypes' must be a non-empty list"), ("dtypes: fp16", "'dtypes' must be a non-empty list"),
    ("dtypes: [fp16, fp16]", "'dtypes' must be a non-empty list of distinct")])
def test_plan_values_no_process_could_take_are_refused(tmp_path, line, error):
    p = tmp_path / "plan.yaml"
    p.write_text(f"ops: [add]\n{line}\n")
    with pytest.raises(ab.PlanError, match=error):
        ab.load_plan(p)
    p.write_text("ops: [add]\nb: {env: {X: 1, Y: '1', Z: 0.5}}\n")
    assert ab.load_plan(p).b.env == {"X": "1", "Y": "1", "Z": "0.5"}


@pytest.mark.e2e
def test_a_plan_whose_shape_file_is_missing_stops_before_any_step(harness, tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("ops: [add]\nshapes: nowhere.yaml\n")
    proc = harness("ab", p, "--backend", "interpreter", "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: shape file {tmp_path / 'nowhere.yaml'} does not exist"], proc.stderr
    assert not (tmp_path / "out").exists()


def test_repo_plans_load():
    plans = sorted((paths.REPO_ROOT / "ops").glob("ab_*.yaml"))
    assert {"ab_default.yaml", "ab_f32_ieee.yaml", "ab_mma_v3.yaml"} <= {p.name for p in plans}
    for plan in plans:
        loaded = ab.load_plan(plan)
        assert loaded.ops and loaded.a.env != loaded.b.env


def _index(run, stage_value):
    (run / "ttgir").mkdir(parents=True)
    row = {c: "x" for c in ir.INDEX_COLUMNS} | {"shape": "64", "kernel": "k", "file": "64/k/w4s3.ttgir"}
    row |= {f"{s}_sha": stage_value for s in ir.HASHED_STAGES}
    (run / "ttgir" / "index.tsv").write_text("\t".join(ir.INDEX_COLUMNS) + "\n" +
                                             "\t".join(row[c] for c in ir.INDEX_COLUMNS) + "\n")


def test_validity_warns_when_the_axis_changed_nothing(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _index(a, "same")
    _index(b, "same")
    _index(c, "other")
    warnings, per_op = ab.validity({"op": {"A": [a], "B": [b]}})
    assert any("changed NOTHING" in w for w in warnings) and per_op["op"]["identical"] == 1
    warnings, per_op = ab.validity({"op": {"A": [a], "B": [c]}})
    assert not any("changed NOTHING" in w for w in warnings) and per_op["op"]["changed"] == 1


@pytest.mark.e2e
def test_requirements_side_env_overrides_only_what_it_names(tmp_path):
    """A pip-built side sees its own tabulate and the base environment's torch; the base env is
    left alone. Needs PyPI (CI has it)."""
    import os
    import subprocess

    import tabulate

    req = tmp_path / "req.txt"
    req.write_text("tabulate==0.9.0  # older than the base env's\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text("ops: [add]\nb: {requirements: req.txt}\n")
    side = ab.load_plan(plan).b
    assert side.requirements == ["tabulate==0.9.0"]
    with open(tmp_path / "log", "w") as log:
        python = ab.build_side_env(side, log, root=tmp_path / "envs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as the runner starts a pip-built side
    out = subprocess.run([python, "-c", "import tabulate, torch, triton, yaml; print(tabulate.__version__)"],
                         capture_output=True, text=True, check=True, env=env, timeout=120).stdout.strip()
    assert out == "0.9.0"
    assert tabulate.__version__ != "0.9.0"
    with open(tmp_path / "log", "a") as log:  # cached: the second call builds nothing
        assert ab.build_side_env(side, log, root=tmp_path / "envs") == python


@pytest.mark.e2e
@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="this machine has an NVIDIA GPU")
def test_ab_without_an_accelerator_fails_before_running(harness, tmp_path):
    proc = harness("ab", "--ops", "add", "--out", tmp_path)
    assert proc.returncode == 2 and "--backend interpreter" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing started


@pytest.mark.e2e
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_the_running_side_and_reports_what_completed(tmp_path, signame):
    # SIGTERM is how a corpus A/B stops each op's A/B (its timeout, its own stop): the same report.
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    env = harness_env()
    # 30 repeats: a warm worker's replay of add takes well under a second, and a loaded machine can leave
    # this loop asleep for seconds; at 3 repeats the A/B once completed every step before the signal came.
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ab", "--ops", "add", "--backend", "interpreter",
                             "--repeats", "30", "--out", str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    state = None
    while time.monotonic() < deadline:  # wait until A recorded, each side's passes ran and each side replayed once
        found = list(tmp_path.glob("ab_*/ab.json"))
        state = load(found[0]) if found else None
        if state and len([s for s in state["steps"] if s["usable"]]) >= 5:
            break
        time.sleep(0.5)
    assert state is not None
    signum = getattr(signal, signame)
    os.kill(proc.pid, signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in exits_of(signum), out
    assert "INCOMPLETE" in out and f"interrupted ({signame})" in out
    d = next(tmp_path.glob("ab_*"))
    report = load(d / "report.json")
    assert report["warnings"][0].startswith("INCOMPLETE")
    # Every row paired (a run per side) but with fewer repeats than planned: flagged, none in the headline.
    assert report["rows"] and all(r["comparison"] is not None for r in report["rows"])
    assert all({f.split("(")[0] for f in r["flags"]} == {"incomplete_a", "incomplete_b"} for r in report["rows"])
    assert report["summary"]["headline_rows"] == 0
    state = load(d / "ab.json")
    assert state["complete"] is False
    assert state["triton_caches"] and not any(Path(c["dir"]).exists() for c in state["triton_caches"].values())
    leftovers = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(d).encode() in f.read():
                        leftovers.append(entry)
            except OSError:
                pass
    assert leftovers == []


def _fake_run(path, candidate_ms):
    path.mkdir(parents=True)
    rows = [result_row(shape=[300], baseline_ms=1.0, candidate_ms=candidate_ms, timer="graph")]
    (path / "results.json").write_text(json.dumps({"format": 1, "rows": rows}))
    return path


@pytest.mark.parametrize("backend", ["cuda", "interpreter"])
def test_verdicts_only_where_the_backend_measures_performance(tmp_path, capsys, backend):
    """B is clearly 10% slower: called SLOWER on a GPU backend; n/a on the interpreter, whose report
    still pairs the rows and writes every file, each headed by the note."""
    groups = [{"A": [_fake_run(tmp_path / f"a{i}", ms) for i, ms in enumerate((2.0, 2.002, 1.998))],
               "B": [_fake_run(tmp_path / f"b{i}", ms) for i, ms in enumerate((2.2, 2.202, 2.198))]}]
    code = ab.report(tmp_path / "out", groups, {"name": "t"}, [], {backend})
    out = capsys.readouterr().out
    report = load(tmp_path / "out" / "report.json")
    assert code == 0 and report["summary"]["headline_rows"] == 1
    assert report["rows"][0]["comparison"]["ratio"] == pytest.approx(1.1, rel=1e-3)
    note = table.not_performance_note(backend)
    if backend == "cuda":
        assert report["rows"][0]["comparison"]["verdict"] == "SLOWER" and report["measures_performance"] is True
        assert "1.100x slower" in out and note not in out
    else:
        assert report["rows"][0]["comparison"]["verdict"] == "n/a" and report["measures_performance"] is False
        assert out.strip().splitlines()[0] == note
        assert not re.search(r"x (slower|faster)|SLOWER|1\.1000", out)  # no ratio shown: B/A is 1.1
        assert "verdicts: n/a 1" in out
        assert note in (tmp_path / "out" / "report.md").read_text()
    # The note is not in the CSV, whose readers take a first line as the header (report.md and .json say it).
    with open(tmp_path / "out" / "report.csv", newline="") as f:
        assert next(csv.DictReader(f))["verdict"] == report["rows"][0]["comparison"]["verdict"]
    assert (tmp_path / "out" / "ratios.png").is_file()


def test_an_ab_writes_its_rows_as_the_offline_report_page_with_the_verdicts_of_report_json(tmp_path, capsys):
    # Two ops, one 10% slower on B, one unchanged: the page (report.html, as a corpus A/B writes) shows each
    # row under its op with the verdict report.json gives it, judged over the same rows.
    def repeats(name, ms):
        return [_fake_run(tmp_path / f"{name}{i}", m) for i, m in enumerate(ms)]
    groups = [{"A": repeats("a", (2.0, 2.002, 1.998)), "B": repeats("b", (2.2, 2.202, 2.198))},
              {"A": repeats("c", (1.0, 1.001, 0.999)), "B": repeats("d", (1.0, 1.001, 0.999))}]
    for group, op in zip(groups, ("slow_op", "same_op"), strict=True):
        for run in group["A"] + group["B"]:
            data = json.loads((run / "results.json").read_text())
            data["rows"][0]["op"] = op
            (run / "results.json").write_text(json.dumps(data))
    assert ab.report(tmp_path / "out", groups, {"a": "before", "b": "after"}, [], {"cuda"}) == 0
    capsys.readouterr()
    verdicts = {r["op"]: r["comparison"]["verdict"] for r in load(tmp_path / "out" / "report.json")["rows"]}
    assert verdicts == {"slow_op": "SLOWER", "same_op": "SAME"}
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<title>A/B: before vs after</title>" in page
    for op, verdict in verdicts.items():
        assert re.search(rf'data-op="{op}"[^>]*data-verdict="{verdict}"', page), (op, verdict)


def _headline_is_a_markdown_list(md: str) -> list[str]:
    """The lines between the title and the table, each a list item (CommonMark would join plain
    adjacent lines into one paragraph); an indented line is a nested item."""
    head = md.split("\n\n")[1].splitlines()
    assert all(re.fullmatch(r"(  )*- \S.*", line) for line in head), head
    return head


def test_report_md_headline_is_one_list_item_per_line(tmp_path, capsys):
    groups = [{"A": [_fake_run(tmp_path / f"a{i}", ms) for i, ms in enumerate((2.0, 2.002, 1.998))],
               "B": [_fake_run(tmp_path / f"b{i}", ms) for i, ms in enumerate((2.2, 2.202, 2.198))]}]
    ab.report(tmp_path / "out", groups, {"name": "t"}, [], {"cuda"})
    head = _headline_is_a_markdown_list((tmp_path / "out" / "report.md").read_text())
    assert any(line.startswith("- overall geomean B/A: ") for line in head)
    assert any(line.startswith("  - add: ") for line in head)  # the per-op geomean, under the overall one


# Synthetic A/B results for the headline and flag rules (docs/verdicts.md). Each repeat jitters both
# sides alike, so every row's B/A is exactly the ratio it was built with.
JITTER = (1.0, 1.001, 0.999)


def _row(op, shape, ms, baseline_ms, timer="graph", markers=(), status="SUCCESS"):
    return result_row(op, "fp32", shape, status, baseline_ms=baseline_ms, candidate_ms=ms, timer=timer,
                      markers=list(markers))


def _side_runs(root, side, rows_of_repeat):
    """One run dir per repeat; rows_of_repeat(repeat, jitter) -> that run's rows."""
    runs = []
    for i, jitter in enumerate(JITTER):
        path = root / f"{side}{i}"
        path.mkdir(parents=True)
        (path / "results.json").write_text(json.dumps({"format": 1, "rows": rows_of_repeat(i, jitter)}))
        runs.append(path)
    return runs


# Rows measured cleanly: (op, shape, A ms, B/A). Their control (torch baseline) B/A is 1.02.
CLEAN = [("add", [1], 2.0, 1.1), ("add", [2], 1.0, 0.9), ("mm", [3], 4.0, 1.0)]
# A degraded row: B three times slower and its control twice, so counting it would move every number.
FALLBACK_CAPTURE = "TIMER_FALLBACK phase=capture reason=recoverable detail='host sync'"
FALLBACK_DENY = "TIMER_FALLBACK phase=deny reason=capture_denied"
KEY_MISSING = "AUTOTUNE_REPLAY_FALLBACK kernel=ops.add.add_kernel key=(300,) reason=key_missing"
COMPILE_FAILED = "AUTOTUNE_REPLAY_FALLBACK kernel=ops.add.add_kernel key=(300,) reason=compile_failed"
MIXED = "TIMER_MIXED baseline=graph candidate=direct"
# A thermal slowdown on B alone: unlike sides (a power cap on every repeat of a side would stay in).
THROTTLED = "CLOCK_THROTTLED reasons=hw_thermal_slowdown kind=slowdown sm_clock_mhz=1980->1500"
# shape -> (flags it must carry, comma-joined, A's row fields, B's row fields, repeats in which the row is absent
# from B's run, repeats in which B's row FAILED)
DEGRADED = {
    10: ("timer_fallback", {"timer": "direct", "markers": [FALLBACK_CAPTURE]},
         {"timer": "direct", "markers": [FALLBACK_CAPTURE]}, (), ()),
    11: ("timer_fallback", {"timer": "direct", "markers": [FALLBACK_DENY]},
         {"timer": "direct", "markers": [FALLBACK_DENY]}, (), ()),
    12: ("replay_fallback", {}, {"markers": [KEY_MISSING]}, (), ()),
    13: ("replay_fallback", {}, {"markers": [COMPILE_FAILED]}, (), ()),
    14: ("timer_mixed", {"timer": "mixed", "markers": [MIXED]}, {"timer": "mixed", "markers": [MIXED]}, (), ()),
    15: ("timer_mismatch", {"timer": "graph"}, {"timer": "direct"}, (), ()),
    16: ("incomplete_b(0/3)", {}, {}, (0, 1, 2), ()),
    17: ("failed_b(1/3),incomplete_b(2/3)", {}, {}, (), (1,)),
    18: ("clock_throttled", {}, {"markers": [THROTTLED]}, (), ()),
}


def _ab(tmp_path, degraded: dict):
    """ab.report over the CLEAN rows plus `degraded`, on a backend that measures performance."""
    def a_rows(i, j):
        return ([_row(op, shape, ms * j, 1.0 * j) for op, shape, ms, _ in CLEAN] +
                [_row("add", [s], 2.0 * j, 1.0 * j, **fa) for s, (_, fa, _, _, _) in degraded.items()])

    def b_rows(i, j):
        return ([_row(op, shape, ms * ratio * j, 1.02 * j) for op, shape, ms, ratio in CLEAN] +
                [_row("add", [s], 6.0 * j, 2.0 * j, **fb, status="FAILED" if i in failed else "SUCCESS")
                 for s, (_, _, fb, absent, failed) in degraded.items() if i not in absent])

    groups = [{"A": _side_runs(tmp_path, "a", a_rows), "B": _side_runs(tmp_path, "b", b_rows)}]
    code = ab.report(tmp_path / "out", groups, {"name": "t"}, [], {"cuda"}, expected=3)
    return code, load(tmp_path / "out" / "report.json")


@pytest.mark.parametrize("shape", sorted(DEGRADED))
def test_a_degraded_row_is_shown_flagged_and_left_out_of_the_headline(tmp_path, capsys, shape):
    flag = DEGRADED[shape][0]
    code, report = _ab(tmp_path, {shape: DEGRADED[shape]})
    out = capsys.readouterr().out
    rows = {tuple(r["shape"]): r for r in report["rows"]}
    assert rows[(shape,)]["flags"] == flag.split(",")
    assert [rows[tuple(s)]["flags"] for _, s, _, _ in CLEAN] == [[], [], []]
    (line,) = [ln for ln in out.splitlines() if re.match(rf"add\s+fp32\s+{shape}\s", ln)]  # shown
    assert line.split()[-1] == flag
    summary = report["summary"]
    assert summary["rows"] == 4 and summary["headline_rows"] == 3
    assert "rows: 3 of 4 in the headline; verdicts: FASTER 1, SAME 1, SLOWER 1" in out
    assert all(summary["excluded"][f.split("(")[0]] == 1 for f in flag.split(","))
    assert summary["overall"][0] == pytest.approx((1.1 * 0.9 * 1.0) ** (1 / 3))
    assert summary["control"][0] == pytest.approx(1.02)
    assert code == 1  # not every row made the headline


def test_headline_counts_clean_rows_only_with_geomeans_per_op_overall_and_control(tmp_path, capsys):
    from scipy import stats as sps

    code, report = _ab(tmp_path, DEGRADED)
    out = capsys.readouterr().out
    rows = {tuple(r["shape"]): r for r in report["rows"]}
    assert {s: rows[(s,)]["flags"] for s in DEGRADED} == {s: d[0].split(",") for s, d in DEGRADED.items()}
    assert rows[(16,)]["comparison"] is None and re.search(r"add\s+fp32\s+16\s.*UNPAIRED", out)
    summary = report["summary"]
    assert summary["rows"] == 12 and summary["headline_rows"] == 3
    assert "rows: 3 of 12 in the headline; verdicts: FASTER 1, SAME 1, SLOWER 1" in out
    assert summary["verdicts"] == {"SLOWER": 1, "FASTER": 1, "SAME": 1}
    assert summary["excluded"] == {"timer_fallback": 2, "replay_fallback": 2, "timer_mixed": 1, "timer_mismatch": 1,
                                   "failed_b": 1, "incomplete_b": 2, "unpaired": 1, "clock_throttled": 1}
    assert ("excluded from the headline: clock_throttled 1, failed_b 1, incomplete_b 2, replay_fallback 2, "
            "timer_fallback 2, timer_mismatch 1, timer_mixed 1, unpaired 1") in out
    assert ("CLOCK_THROTTLED rows (a thermal or power slowdown hit their measurement; out of the headline): 1\n"
            "  add fp32 18: B hw_thermal_slowdown\n") in out
    # Per operator and overall: geometric mean of the rows' B/A with a 95% t interval over rows.
    assert summary["per_op"]["add"][0] == pytest.approx(math.sqrt(1.1 * 0.9))
    assert summary["per_op"]["mm"][0] == pytest.approx(1.0)
    logs = np.log([1.1, 0.9, 1.0])
    gm, lo, hi = summary["overall"]
    assert gm == pytest.approx(0.99 ** (1 / 3))
    expected = sps.t.interval(0.95, 2, loc=logs.mean(), scale=sps.sem(logs))
    assert (lo, hi) == pytest.approx(tuple(np.exp(expected)))
    assert f"overall geomean B/A: {gm:.4f} [{lo:.4f}, {hi:.4f}] (1.003x faster)" in out
    assert "  add: 0.9950" in out
    # mm has one headline row: its line shows that row's interval, not a bare ratio.
    mm = rows[(3,)]["comparison"]
    assert f"  mm: 1.0000 [{mm['lo']:.4f}, {mm['hi']:.4f}] (no change)" in out
    # The torch baseline as a control, over the same rows: ~1 here, or the machine drifted.
    assert summary["control"][0] == pytest.approx(1.02)
    assert "control (torch baseline) geomean B/A: 1.0200" in out
    assert code == 1


def _runs(root, side, rows_per_repeat):
    paths = []
    for i, rows in enumerate(rows_per_repeat):
        path = root / f"{side}{i}"
        path.mkdir(parents=True)
        (path / "results.json").write_text(json.dumps({"format": 1, "rows": rows}))
        paths.append(path)
    return paths


def test_sides_ratio_and_verdict_come_from_one_statistic(tmp_path, capsys):
    """Repeats whose medians say B is faster (7.19 < 7.32) while their geometric means say slower:
    the columns must show the statistic the ratio and verdict use, so all three agree."""
    a = _runs(tmp_path, "a", [[_row("rms_norm", [4], ms, 1.0)] for ms in (7.0, 7.32, 7.9)])
    b = _runs(tmp_path, "b", [[_row("rms_norm", [4], ms, 1.0)] for ms in (7.19, 7.19, 9.5)])
    ab.report(tmp_path / "out", [{"A": a, "B": b}], {"name": "t"}, [], {"cuda"})
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("rms_norm")]
    a_ms, b_ms, ratio = (float(x) for x in line.split()[3:6])
    assert b_ms > a_ms and ratio > 1 and b_ms / a_ms == pytest.approx(ratio, abs=2e-4)
    assert a_ms == pytest.approx((7.0 * 7.32 * 7.9) ** (1 / 3), abs=1e-4)
    header = out.split("\n\n", 1)[1].splitlines()[0]
    assert "A ms (gm)" in header and "B ms (gm)" in header
    csv_head = (tmp_path / "out" / "report.csv").read_text().splitlines()[0]
    assert "a_ms_geomean,b_ms_geomean" in csv_head


def test_profiled_rows_show_each_sides_top_kernels(tmp_path, capsys):
    ka = [{"name": "rms_kernel", "launches_per_call": 1, "time_ms": 0.01, "share": 0.97},
          {"name": "fill", "launches_per_call": 2, "time_ms": 0.0003, "share": 0.03}]
    kb = [{"name": "rms_kernel_v2", "launches_per_call": 1, "time_ms": 0.01, "share": 1.0}]
    a = _runs(tmp_path, "a", [[dict(_row("rms_norm", [4], 1.0 * j, 1.0), kernels=ka), _row("add", [4], 1.0, 1.0)]
                              for j in JITTER])
    b = _runs(tmp_path, "b", [[dict(_row("rms_norm", [4], 1.1 * j, 1.0), kernels=kb), _row("add", [4], 1.0, 1.0)]
                              for j in JITTER])
    ab.report(tmp_path / "out", [{"A": a, "B": b}], {"name": "t"}, [], {"cuda"})
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if "rms_kernel" in ln]  # the unprofiled add row gets none
    assert line.split()[:3] == ["rms_norm", "fp32", "4"]
    assert "rms_kernel 97%, fill 3% (x2)" in line and "rms_kernel_v2 100%" in line
    assert "rms_kernel_v2 100%" in (tmp_path / "out" / "report.md").read_text()
    report = load(tmp_path / "out" / "report.json")
    assert report["rows"][0]["kernels"] == {"a": ka, "b": kb}


def test_an_ab_whose_passes_ran_once_takes_each_sides_kernels_from_its_passes_run(tmp_path, capsys):
    # Timing-only repeats carry no kernels; each side's passes step (20% slow: the profiler ran there) does.
    ka = [{"name": "rms_kernel", "launches_per_call": 1, "time_ms": 0.01, "share": 1.0}]
    kb = [{"name": "rms_kernel_v2", "launches_per_call": 1, "time_ms": 0.01, "share": 1.0}]
    a = _runs(tmp_path, "a", [[_row("rms_norm", [4], 1.0 * j, 1.0)] for j in JITTER])
    b = _runs(tmp_path, "b", [[_row("rms_norm", [4], 1.1 * j, 1.0)] for j in JITTER])
    (passes_a,) = _runs(tmp_path, "pa", [[dict(_row("rms_norm", [4], 1.2, 1.0), kernels=ka)]])
    (passes_b,) = _runs(tmp_path, "pb", [[dict(_row("rms_norm", [4], 1.3, 1.0), kernels=kb)]])
    groups = [{"A": a, "B": b, compare.passes_key("A"): [passes_a], compare.passes_key("B"): [passes_b]}]
    ab.report(tmp_path / "out", groups, {"name": "t"}, [], {"cuda"}, expected=3)
    assert "rms_kernel 100%" in capsys.readouterr().out
    (row,) = load(tmp_path / "out" / "report.json")["rows"]
    assert row["kernels"] == {"a": ka, "b": kb}
    assert row["comparison"]["ratio"] == pytest.approx(1.1)  # the passes runs' timings reach no verdict


def _paired(n: int, a_ms=(1.0, 1.01), b_ms=(1.1, 1.11)):
    from reports import compare, stats

    rows = []
    for shape in range(n):
        r = compare.PairedRow("softmax", "bf16", (1024, shape), list(a_ms), list(b_ms), [], [], {"graph"}, [], {}, {})
        r.comparison = stats.compare(r.a_ms, r.b_ms)
        rows.append(r)
    return rows


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_the_ratios_plot_has_a_log_axis_and_names_a_first():
    from reports import ab_report

    fig = ab_report.figure(_paired(3), {"name": "t", "a": "fusion on", "b": "fusion off"})
    (ax,) = fig.axes
    assert ax.get_yscale() == "log" and len(ax.containers) == 3
    assert fig.get_suptitle() == "A/B t: fusion on vs fusion off"


@pytest.mark.parametrize("note", [None, table.not_performance_note("interpreter")])
def test_a_ratios_plot_with_nothing_to_plot_says_so(note):
    from reports import ab_report

    # No rows at all; or rows whose ratios the tables call n/a, so the plot shows none either.
    fig = ab_report.figure([] if note is None else _paired(2), {"name": "t"}, note)
    (ax,) = fig.axes
    assert not ax.containers and not ax.axison
    assert _texts(fig) == ["no rows to plot" if note is None else "no ratios to plot: see the note above"]


def test_the_plot_title_fits_inside_the_figure(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from reports import ab_report, compare, stats

    rows = []
    for n in (1, 4):
        for shape in range(n):
            r = compare.PairedRow("softmax", "bf16", (1024, shape), [1.0, 1.01], [1.1, 1.11], [], [], {"graph"}, [],
                                  {}, {})
            r.comparison = stats.compare(r.a_ms, r.b_ms)
            rows.append(r)
        context = {"name": "TRITON_DEFAULT_FP_FUSION_ON_VERSUS_OFF_WITH_A_LONG_NAME",
                   "a": "TRITON_DEFAULT_FP_FUSION=1 (AS INSTALLED)", "b": "TRITON_DEFAULT_FP_FUSION=0 (SWITCHED OFF)"}
        for note in (None, table.not_performance_note("interpreter")):
            fig = ab_report.figure(rows[-n:], context, note)
            canvas = FigureCanvasAgg(fig)
            canvas.draw()
            box, title = fig.bbox, fig.get_suptitle()
            extent = fig._suptitle.get_window_extent(canvas.get_renderer())
            assert "TRITON_DEFAULT_FP_FUSION=0 (SWITCHED OFF)" in title.replace("\n", " ")
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1, (n, note, extent, box)


def test_a_plan_of_gpu_sized_shipped_shapes_runs_the_backends_own_on_the_interpreter(capsys):
    plan = ab.resolve_plan(cli.parse_request(["ab", str(REPO / "ops" / "ab_f32_ieee.yaml"),
                                                          "--backend", "interpreter"]))
    assert plan.options.shapes == REPO / "shapes" / "tiny.yaml"
    assert capsys.readouterr().out.startswith(f"note: backend 'interpreter' runs {REPO / 'shapes' / 'tiny.yaml'} "
                                              f"instead of the plan's {REPO / 'shapes' / 'default.yaml'} (sized for "
                                              "a GPU, far too slow here); --shapes picks another\n")
    chosen = ab.resolve_plan(cli.parse_request(["ab", str(REPO / "ops" / "ab_f32_ieee.yaml"),
                                                            "--backend", "interpreter", "--shapes",
                                                            str(REPO / "shapes" / "default.yaml")]))
    assert chosen.options.shapes == REPO / "shapes" / "default.yaml"  # asked for: as asked


def test_a_steps_cases_show_as_they_land(capsys):
    for line in ("zl_bench record: op=mm\n", "[1/4] mm fp32-8 SUCCESS baseline ...\n", "    TIMER_FALLBACK\n",
                 "[2/4] mm fp32-9 FAILED x\n"):
        ab_steps.case_progress(line)
    assert capsys.readouterr().out == " 1/4 2/4"


def test_a_broken_ops_path_module_is_said_once_before_the_steps(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "scale.py").write_text((REPO / "tests" / "resources" / "user_ops" / "scale.py").read_text())
    plan = ab.Plan(name="p", ops=["path:scale3"], a=ab.Side("A", "a"), b=ab.Side("B", "b"),
                   options=RunOptions(ops_paths=[str(tmp_path)]))
    ab_session.check_plan(plan)
    assert capsys.readouterr().err == (f"warning: skipped operator module {tmp_path / 'broken.py'}, which does not "
                                       f"import: {tmp_path / 'broken.py'}:1: SyntaxError: invalid syntax\n")
