"""The A/B session end to end on the interpreter backend, plus plan parsing and validity."""

import json
import re

import pytest
from conftest import load

from harness import ab, ir
from reports import table

pytestmark = pytest.mark.e2e


def ab_dir_of(proc):
    for line in proc.stdout.splitlines():
        if line.startswith("ab dir: "):
            from pathlib import Path

            return Path(line[len("ab dir: "):].strip())
    raise AssertionError(proc.stdout + proc.stderr)


def test_ab_flow_pairs_rows_and_writes_every_report_file(harness, tmp_path):
    proc = harness("ab", "--ops", "add", "--backend", "interpreter", "--b-env", "ZL_TEST_SWITCH=1",
                   "--repeats", "2", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = ab_dir_of(proc)
    for name in ("report.md", "report.csv", "report.json", "ratios.png", "ab.json", "ab.log"):
        assert (d / name).is_file(), name
    state = load(d / "ab.json")
    assert state["complete"] is True
    # One record, then A and B interleaved.
    assert [s["what"].split(": ")[-1] for s in state["steps"]] == [
        "[1/1 add] A records", "A replays A", "B replays A", "A replays A", "B replays A"]
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
    assert (d / "report.md").read_text().splitlines()[2] == note
    assert (d / "report.csv").read_text().splitlines()[0] == f"# {note}"
    assert not re.search(r"x (slower|faster)|no change|FASTER|SLOWER|SAME|NOISY", printed)
    # B replayed A's configs: every row ran the same configs on both sides.
    assert all(not row["config_differs"] for row in report["rows"])


def test_incomplete_pairing_is_reported_as_such(harness, tmp_path):
    proc = harness("ab", "--ops", "add", "--backend", "interpreter", "--b-python", "/bin/false",
                   "--repeats", "2", "--out", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = load(ab_dir_of(proc) / "report.json")
    assert report["summary"]["headline_rows"] == 0
    assert all(row["comparison"] is None for row in report["rows"])
    assert any("step(s) failed" in w for w in report["warnings"])
    assert "UNPAIRED" in proc.stdout


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


def test_plan_errors_name_file_and_field(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("ops: [add]\nrepeats: 1\n")
    with pytest.raises(ab.PlanError, match=r"plan .*plan.yaml: 'repeats' must be an integer >= 2"):
        ab.load_plan(p)
    p.write_text("ops: [add]\nb: {env: {X: 1}, requirements: missing.txt}\n")
    with pytest.raises(ab.PlanError, match=r"requirements file .*missing.txt does not exist"):
        ab.load_plan(p)
    p.write_text("ops: [add]\nflavour: x\n")
    with pytest.raises(ab.PlanError, match=r"unknown fields \['flavour'\]"):
        ab.load_plan(p)


def test_repo_plans_load():
    for plan in ("ab_default.yaml", "ab_f32_ieee.yaml"):
        loaded = ab.load_plan(ab.REPO_ROOT / "ops" / plan)
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
                         capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert out == "0.9.0"
    assert tabulate.__version__ != "0.9.0"
    with open(tmp_path / "log", "a") as log:  # cached: the second call builds nothing
        assert ab.build_side_env(side, log, root=tmp_path / "envs") == python


@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="this machine has an NVIDIA GPU")
def test_ab_without_an_accelerator_fails_before_running(harness, tmp_path):
    proc = harness("ab", "--ops", "add", "--out", tmp_path)
    assert proc.returncode == 2 and "--backend interpreter" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing started


@pytest.mark.e2e
def test_ctrl_c_stops_the_running_side_and_reports_what_completed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ab", "--ops", "add", "--backend", "interpreter",
                             "--repeats", "3", "--out", str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    state = None
    while time.monotonic() < deadline:  # wait until A recorded and one replay finished
        found = list(tmp_path.glob("ab_*/ab.json"))
        state = load(found[0]) if found else None
        if state and len([s for s in state["steps"] if s["exit"] == 0]) >= 2:
            break
        time.sleep(0.5)
    assert state is not None
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "INCOMPLETE" in out
    d = next(tmp_path.glob("ab_*"))
    report = load(d / "report.json")
    assert report["warnings"][0].startswith("INCOMPLETE")
    assert report["rows"] and report["summary"]["headline_rows"] < report["summary"]["rows"] + 1
    assert all(r["flags"] for r in report["rows"])  # fewer repeats than planned: flagged, not headline
    assert load(d / "ab.json")["complete"] is False
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
    rows = [{"op": "add", "dtype": "fp32", "shape": [300], "status": "SUCCESS", "baseline_ms": 1.0,
             "candidate_ms": candidate_ms, "timer": "graph", "markers": [], "configs": {}}]
    (path / "results.json").write_text(json.dumps({"format": 1, "rows": rows}))
    return path


@pytest.mark.parametrize("backend", ["cuda", "interpreter"])
def test_verdicts_only_where_the_backend_measures_performance(tmp_path, capsys, backend):
    """B is clearly 10% slower: called SLOWER on a GPU backend; n/a on the interpreter, whose report
    still pairs the rows and writes every file, each headed by the note."""
    groups = [([_fake_run(tmp_path / f"a{i}", ms) for i, ms in enumerate((2.0, 2.002, 1.998))],
               [_fake_run(tmp_path / f"b{i}", ms) for i, ms in enumerate((2.2, 2.202, 2.198))])]
    code = ab.report(tmp_path / "out", groups, {"name": "t"}, [], {backend})
    out = capsys.readouterr().out
    report = load(tmp_path / "out" / "report.json")
    assert code == 0 and report["summary"]["headline_rows"] == 1
    assert report["rows"][0]["comparison"]["ratio"] == pytest.approx(1.1, rel=1e-3)
    note = table.not_performance_note(backend)
    if backend == "cuda":
        assert report["rows"][0]["comparison"]["verdict"] == "SLOWER" and report["measures_performance"] is True
        assert "1.100x slower" in out and note not in out
        assert (tmp_path / "out" / "report.csv").read_text().startswith("op,")
    else:
        assert report["rows"][0]["comparison"]["verdict"] == "n/a" and report["measures_performance"] is False
        assert out.strip().splitlines()[0] == note
        assert not re.search(r"x (slower|faster)|SLOWER|1\.1000", out)  # no ratio shown: B/A is 1.1
        assert "verdicts: n/a 1" in out
        assert (tmp_path / "out" / "report.csv").read_text().startswith(f"# {note}\nop,")
        assert note in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "ratios.png").is_file()
