"""The batch dir's files (harness.core.batchdir): op dirs, completion markers, the status and
summary CSVs, a new dir's checks and the owner lock, on hand-written dirs."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from batch_fakes import ADD
from result_rows import result_row

from harness.core import batchdir, rundir
from harness.core.errors import UsageError
from harness.providers.catalog import Entry


def test_op_dir_names_only_the_repo_separator_and_slashes():
    nested = Entry("flaggems", "scale", "special/nested:x", "f.py", qualified=True)
    assert batchdir.op_dir(Path("/b"), nested.key) == Path("/b/ops/flaggems__scale@special.nested:x")
    assert batchdir.op_dir(Path("/b"), ADD.key) == Path("/b/ops/builtin__add")


def test_completed_counts_only_a_settled_marker(tmp_path):
    d = batchdir.op_dir(tmp_path, ADD.key)
    assert batchdir.completed(tmp_path, ADD.key) is None  # no op dir
    d.mkdir(parents=True)
    assert batchdir.completed(tmp_path, ADD.key) is None  # no marker
    for text, expected in (("PASS\n", "PASS"), (" SKIP \n", "SKIP"), ("FAIL\n", None), ("TIMEOUT", None),
                           ("pass", None), ("FAIL_UPSTREAM\n", "FAIL_UPSTREAM"), ("FAIL_UPSTREAM 240\n", None),
                           ("TIMEOUT_UPSTREAM 240\n", "TIMEOUT_UPSTREAM"), ("TIMEOUT_UPSTREAM\n", None),
                           ("TIMEOUT_UPSTREAM x\n", None)):
        (d / ".complete").write_text(text)
        assert batchdir.completed(tmp_path, ADD.key, 240.0) == expected, text
    # Upstream's timeout is settled for the budget it ran under, and for shorter ones; a longer one reruns it.
    (d / ".complete").write_text("TIMEOUT_UPSTREAM 240\n")
    assert batchdir.completed(tmp_path, ADD.key, 239.0) == "TIMEOUT_UPSTREAM"
    assert batchdir.completed(tmp_path, ADD.key, 241.0) is None
    (d / ".complete").unlink()
    (d / ".complete").mkdir()  # not a file
    assert batchdir.completed(tmp_path, ADD.key) is None


def test_read_status_keys_rows_by_id(tmp_path):
    assert batchdir.read_status(tmp_path) == {}
    (tmp_path / "ops_status.csv").write_text("op,repo,op_file,status\nadd,builtin,add,PASS\nmm,builtin,,FAIL\n")
    got = batchdir.read_status(tmp_path)
    assert list(got) == ["builtin:add@add", "builtin:mm@"]
    assert got["builtin:mm@"].status == "FAIL" and got["builtin:add@add"].op == "add"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "ops_status.csv").write_text("op,repo,status\nadd,builtin,PASS\n")  # before op_file
    assert list(batchdir.read_status(tmp_path / "old")) == ["builtin:add@"]


def test_a_status_row_reads_back_as_written(tmp_path):
    rows = {r.id: r for r in (
        batchdir.StatusRow("add", "builtin", "add", "PASS", exit_code=0, attempts=1, elapsed_s=2.2, backend="cuda",
                           device=3, timer="graph", rows=2, timer_fallback_rows=0, replay_fallback_rows=1,
                           run_dir="ops/builtin__add/attempt1/run", notes="a, b; c", extra={"verdicts": ""}),
        batchdir.StatusRow("mm", "builtin", "mm", "TIMEOUT", attempts=1, elapsed_s=20.0, device=0, rows=0,
                           extra={"verdicts": ""}),
        batchdir.StatusRow("x", "path", "x", "FAIL", attempts=0, elapsed_s=0, backend="cuda", device=1, rows=0,
                           notes="its Ray task was lost twice", extra={"verdicts": "faster 2"}))}
    columns = (*batchdir.STATUS_COLUMNS, "verdicts")
    batchdir.write_status(tmp_path, rows, columns)
    text = (tmp_path / batchdir.STATUS_CSV).read_text()
    assert text.splitlines()[1:] == ['add,builtin,add,PASS,0,1,2.2,cuda,3,graph,2,0,1,ops/builtin__add/attempt1/run,'
                                     '"a, b; c",', "mm,builtin,mm,TIMEOUT,,1,20.0,,0,,0,,,,,",
                                     "x,path,x,FAIL,,0,0,cuda,1,,0,,,,its Ray task was lost twice,faster 2"]
    read = batchdir.read_status(tmp_path)
    assert read == rows
    batchdir.write_status(tmp_path, read, columns)
    assert (tmp_path / batchdir.STATUS_CSV).read_text() == text  # a resume rewrites the rows it read unchanged
    (tmp_path / batchdir.STATUS_CSV).write_text(text.replace(",20.0,", ",soon,"))
    with pytest.raises(UsageError, match=r"ops_status.csv is corrupt \(could not convert string to float: 'soon'\)"):
        batchdir.read_status(tmp_path)


def test_write_summary_is_one_row_per_case_of_each_op_with_a_run(tmp_path, capsys):
    (tmp_path / "ops" / "b" / "run").mkdir(parents=True)
    (tmp_path / "ops" / "b" / "run" / rundir.RESULTS_JSON).write_text(json.dumps({"format": 1, "rows": [
        result_row("mm", "fp16", (2, 3, 4), baseline_ms=1.5, candidate_ms=1.0, speedup=1.5,
                   metrics={"gbps": 10.0, "tflops": 0.5}, timer="graph", markers=["TIMER_FALLBACK a", "B"],
                   measures_performance=False),
        result_row("mm", "fp32", None, "SKIPPED")]}))
    (tmp_path / "ops" / "a" / "run").mkdir(parents=True)
    (tmp_path / "ops" / "a" / "run" / rundir.RESULTS_JSON).write_text(json.dumps({"format": 1, "rows": [
        result_row("add", "fp32", (8,), "FAILED")]}))
    with open(tmp_path / "ops_status.csv", "w") as f:
        f.write("op,repo,op_file,status,run_dir\n")
        f.write("mm,zz,mm,PASS,ops/b/run\n")
        f.write("add,aa,add,FAIL,ops/a/run\n")
        f.write("gone,aa,gone,FAIL,ops/gone/run\n")  # its run dir holds no results
        f.write("none,aa,none,FAIL,\n")  # never got a run dir
    path = batchdir.write_summary(tmp_path)
    assert path == tmp_path / "summary.csv"
    assert path.read_bytes().decode() == (
        "repo,op,dtype,shape,status,baseline_ms,candidate_ms,speedup,gbps,tflops,timer,measures_performance,markers,"
        "run_dir\n"
        "aa,add,fp32,8,FAILED,,,,,,,True,,ops/a/run\n"
        "zz,mm,fp16,2x3x4,SUCCESS,1.5,1.0,1.5,10.0,0.5,graph,False,TIMER_FALLBACK a | B,ops/b/run\n"
        "zz,mm,fp32,,SKIPPED,,,,,,,True,,ops/b/run\n")
    (tmp_path / "ops_status.csv").unlink()
    assert batchdir.write_summary(tmp_path).read_text() == (
        "repo,op,dtype,shape,status,baseline_ms,candidate_ms,speedup,gbps,tflops,timer,measures_performance,markers,"
        "run_dir\n")


# --- the dir and its owner --------------------------------------------------------------------------------
def test_a_new_batch_needs_a_new_or_empty_dir(tmp_path):
    batchdir.check_new(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    batchdir.check_new(tmp_path / "empty")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / batchdir.BATCH_JSON).write_text("{}")
    with pytest.raises(UsageError) as info:
        batchdir.check_new(tmp_path / "old")
    assert str(info.value) == (f"--batch-dir {tmp_path / 'old'} is an existing batch dir: to continue it add "
                               "--resume; for a new batch give a new or empty dir")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError) as info:
        batchdir.check_new(tmp_path / "file")
    assert str(info.value) == f"--batch-dir {tmp_path / 'file'} is a file, not a directory"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    with pytest.raises(UsageError) as info:
        batchdir.check_new(tmp_path / "full")
    assert str(info.value) == (f"--batch-dir {tmp_path / 'full'} is not empty and is not a batch dir (it has no "
                               "batch.json): give a new or empty dir")


def test_new_batch_dir_is_claimed_or_created(tmp_path):
    out = tmp_path / "runs"
    claimed = batchdir.new(None, out)
    assert claimed.parent == tmp_path / "runs" and claimed.name.startswith("batch_") and claimed.is_dir()
    assert batchdir.new(tmp_path / "a" / "b", out) == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    assert batchdir.new(tmp_path / "a" / "b", out) == tmp_path / "a" / "b"  # an empty one is fine
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError) as info:
        batchdir.new(tmp_path / "f" / "sub", out)
    assert str(info.value) == f"--batch-dir {tmp_path / 'f' / 'sub'}: cannot create it: Not a directory"


def test_own_holds_the_lock_and_names_the_live_owner(tmp_path):
    (tmp_path / batchdir.OWNER_LOCK).write_text("stale 123\n")
    with batchdir.own(tmp_path):
        assert (tmp_path / batchdir.OWNER_LOCK).read_text() == f"{os.getpid()}\n"
        with pytest.raises(UsageError) as info:
            batchdir.own(tmp_path)
        assert str(info.value) == (f"batch dir {tmp_path} belongs to batch pid {os.getpid()}, which is still "
                                   f"running: wait for it, or stop it (kill {os.getpid()}) and resume then")
    with batchdir.own(tmp_path):  # released with its file
        pass
    with open(tmp_path / batchdir.OWNER_LOCK, "w") as f:  # locked before any pid was written
        fcntl.flock(f, fcntl.LOCK_EX)
        with pytest.raises(UsageError, match="belongs to batch pid unknown, which is still running"):
            batchdir.own(tmp_path)


@pytest.mark.parametrize("text,said", [
    ("op,repo,status\nadd,builtin,PASS" + "x" * 200_000 + "\n", "field larger than field limit (131072)"),
    ("op,repo\n\"unterminated\n", "a row has no repo: "),
    ("op,status\nadd,PASS\n", "a row has no repo: "),
])
def test_an_ops_status_csv_torn_or_edited_is_one_usage_error_naming_it(tmp_path, text, said):
    # A cell past csv's limit raised csv.Error, a row short of a required cell a TypeError: tracebacks.
    (tmp_path / batchdir.STATUS_CSV).write_text(text)
    with pytest.raises(UsageError) as refused:
        batchdir.read_status(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / batchdir.STATUS_CSV} is corrupt ({said}")
    assert str(refused.value).endswith("); the op dirs are intact: start a new --batch-dir")
