"""Batch decisions, fast: no operator runs. The process boundary (launch.start, the op's guarded
`python -m harness record|replay` or upstream's pytest node) is a fake that writes what a child
would have written (run.json, results.json, log lines) and exits with a scripted code, after a
scripted time on a fake clock. Everything above it is the real batch code on hand-written dirs."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
from batch_fakes import (
    ADD,
    CHECKOUT,
    FG,
    MM,
    OPS,
    UNCLAIMED_RUN_DIR,
    Clock,
    FakeChild,
    FakeWorker,
    HangingOp,
    Launcher,
    Step,
    options,
    parse,
    row,
    status_rows,
    write_run,
)
from conftest import wait_for

from harness import cli
from harness.core import batchdir, forkserver, launch, opguard, paths, rundir
from harness.core.batchdir import StatusRow
from harness.core.errors import DtypeRejected, UsageError
from harness.core.options import BatchOptions, RunOptions
from harness.providers import catalog, selection
from harness.providers.catalog import Entry
from harness.sessions import batch, ray_executor, slurm_executor
from harness.sessions.batch import executor as batch_executor
from harness.sessions.batch import facts as batch_facts
from harness.sessions.batch import resume as batch_resume
from harness.sessions.batch import session as batch_session


# --- the fake process boundary (batch_fakes), put in place --------------------------------------------
@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(batch_executor, "time", c)
    return c


@pytest.fixture
def launcher(monkeypatch, clock):
    # Each attempt's run dir is `attemptK/run`, as the expectations below spell it (not `<op>_<ts>`).
    monkeypatch.setattr(rundir, "unclaimed_run_dir", lambda root, op: root / "run")
    fake = Launcher(clock)
    monkeypatch.setattr(launch, "start", fake)
    monkeypatch.setattr(batch.Batch, "_new_worker", lambda self, log, preload=None: fake.worker(log))
    return fake


def runner_for(tmp_path, launcher=None, op_dtypes=None, **opts) -> batch.Batch:
    opts.setdefault("op_timeout", 20.0)
    r = batch.Batch(tmp_path, options(**opts), op_dtypes or {})
    if launcher is not None:
        launcher.runner = r
    return r


# --- pure helpers ------------------------------------------------------------------------------------
def test_shard_is_the_documented_stable_hash_and_spreads():
    # The definition, not hash(): a resumed batch (another process) puts each op on the same device.
    keys = [f"builtin:op{i}@op{i}" for i in range(64)]
    for n in (1, 3, 4, 7):
        assert [batch.shard(k, n) for k in keys] == [
            int.from_bytes(bytes.fromhex(hashlib.sha256(k.encode()).hexdigest()[:8]), "big") % n for k in keys]
    assert set(batch.shard(k, 4) for k in keys) == {0, 1, 2, 3}


def test_run_facts_counts_rows_timers_fallbacks_and_the_skip_reason(tmp_path):
    empty = {"rows": 0, "timer": "", "timer_fallback_rows": 0, "replay_fallback_rows": 0, "statuses": {},
             "skip_reason": ""}
    assert batch_facts.run_facts(None) == empty
    assert batch_facts.run_facts(tmp_path) == empty  # no results.json
    run = write_run(tmp_path, [
        row(timer="graph", markers=["TIMER_FALLBACK: graph capture failed", "X"]),
        row(timer="direct", markers=["AUTOTUNE_REPLAY_FALLBACK x", "TIMER_FALLBACK y"]),
        row(status="SKIPPED", timer=None, markers=[], error=""),
        row(status="SKIPPED", timer="", markers=["NOT_TIMER_FALLBACK"], error="no fp16 here"),
        row(status="SKIPPED", error="second reason"),
        row(status="FAILED", markers=["xAUTOTUNE_REPLAY_FALLBACK"])])
    assert batch_facts.run_facts(run) == {"rows": 6, "timer": "direct+graph", "timer_fallback_rows": 2,
                                     "replay_fallback_rows": 1, "statuses": {"SUCCESS": 2, "SKIPPED": 3, "FAILED": 1},
                                     "skip_reason": "no fp16 here"}
    run = write_run(tmp_path, [row(status="SKIPPED"), {**row(), "timer": None}], name="r2")
    assert batch_facts.run_facts(run)["skip_reason"] == "" and batch_facts.run_facts(run)["timer"] == "direct"


def test_dtype_rejected_reads_our_exit_code_or_the_childs_run_json(tmp_path):
    assert DtypeRejected.exit_code == 65
    assert batch_facts.dtype_rejected(65, None) is True  # before any run dir
    assert batch_facts.dtype_rejected(1, None) is False
    assert batch_facts.dtype_rejected(1, tmp_path / "missing") is False
    assert batch_facts.dtype_rejected(1, write_run(tmp_path, [], {"dtype_rejected": False}, name="a_run")) is False
    assert batch_facts.dtype_rejected(1, write_run(tmp_path, [], {"dtype_rejected": True}, name="b_run")) is True
    assert batch_facts.dtype_rejected(1, write_run(tmp_path, [], {"dtype_rejected": "yes"}, name="c_run")) is False
    assert batch_facts.dtype_rejected(3, write_run(tmp_path, [], {}, name="d_run")) is False
    (tmp_path / "e_run").mkdir()
    (tmp_path / "e_run" / rundir.RUN_JSON).write_text("{half")  # a child killed while writing it
    assert batch_facts.dtype_rejected(1, tmp_path / "e_run") is False
    (tmp_path / "f_run").mkdir()
    (tmp_path / "f_run" / rundir.RUN_JSON).write_text("{}")  # nothing observed yet
    assert batch_facts.dtype_rejected(1, tmp_path / "f_run") is False


def test_pytest_line_is_the_first_error_or_the_final_summary(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text("collected 1 item\n\nFAILED a.py::t - boom\nE   RuntimeError: first\nE   second\n"
                   "ERROR b.py\n==== 1 failed in 0.1s ====\n")
    assert batch_facts.pytest_line(log, 1) == "RuntimeError: first"  # an E line before FAILED/ERROR ones
    log.write_text("x\nERROR b.py - collection\nFAILED a.py::t - boom\n= 1 failed =\n")
    assert batch_facts.pytest_line(log, 1) == "FAILED a.py::t - boom"
    log.write_text("x\n  ERROR b.py - collection  \n= 1 error =\n")
    assert batch_facts.pytest_line(log, 2) == "ERROR b.py - collection"
    log.write_text("E   not an error of a pass\nt.py .\n===== 1 passed in 0.12s =====\n\n")
    assert batch_facts.pytest_line(log, 0) == "1 passed in 0.12s"
    log.write_text("Error: no E-line prefix\n== 1 failed ==\n")
    assert batch_facts.pytest_line(log, 1) == "1 failed"
    log.write_text("\n  \n")
    assert batch_facts.pytest_line(log, 4) == "pytest exited 4"
    log.write_bytes(b"E   bad byte \xff\n")
    assert batch_facts.pytest_line(log, 1) == "bad byte \ufffd"


def test_killed_during_names_the_case_or_says_why_none(tmp_path):
    assert batch_facts.killed_during(tmp_path / "a") == "before its run dir was written (the op never started a case)"
    write_run(tmp_path, [], {"running_case": "fp32 [8]"}, name="a")
    assert batch_facts.killed_during(tmp_path / "a") == "during case fp32 [8]"
    write_run(tmp_path, [], {"outcome": {"running_case": "fp16 [2, 700]"}}, name="b")
    assert batch_facts.killed_during(tmp_path / "b") == "during case fp16 [2, 700]"
    write_run(tmp_path, [row(), row()], {"outcome": {"running_case": None}}, name="c")
    assert batch_facts.killed_during(tmp_path / "c") == "with no case running (2 rows done)"
    write_run(tmp_path, [row()], {"running_case": "", "outcome": None}, name="d")
    assert batch_facts.killed_during(tmp_path / "d") == "with no case running (1 row done)"
    write_run(tmp_path, [], {}, name="e")
    assert batch_facts.killed_during(tmp_path / "e") == "before its first case started"
    write_run(tmp_path, None, {}, name="f")
    assert batch_facts.killed_during(tmp_path / "f") == "before its first case started"
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / rundir.RUN_JSON).write_text("{}")  # killed before it wrote anything observed
    assert batch_facts.killed_during(tmp_path / "g") == "before its first case started"


def test_killed_note_goes_to_the_batch_log_and_the_killed_runs_log(tmp_path):
    log = tmp_path / "batch.log"
    log.write_text("before\n")
    other, killed = write_run(tmp_path / "a1", [], name="r1"), write_run(tmp_path / "a1", [], name="r2")
    batch_facts.killed_note(killed, log, "timeout after 5 s during case x")
    note = "\nkilled by the batch's --op-timeout: timeout after 5 s during case x\n"
    assert log.read_text() == "before\n" + note
    assert (killed / rundir.RUN_LOG).read_text() == "run log\n" + note
    assert (other / rundir.RUN_LOG).read_text() == "run log\n"
    batch_facts.killed_note(tmp_path / "a1" / "never_claimed", log, "x")  # killed before its run dir: batch log only
    assert not (tmp_path / "a1" / "never_claimed").exists() and log.read_text().endswith("op-timeout: x\n")


def test_write_status_is_every_row_sorted_in_the_columns(tmp_path):
    r = runner_for(tmp_path)
    r.record(MM, StatusRow("mm", "builtin", "mm", "FAIL", notes="a, b; c", extra={"extra": "dropped"}))
    r.record(ADD, StatusRow("add", "builtin", "add", "PASS"))
    text = (tmp_path / "ops_status.csv").read_bytes().decode()  # as written: no newline translation
    lines = text.split("\n")
    assert lines[0] == ",".join(batchdir.STATUS_COLUMNS)
    assert lines[1] == "add,builtin,add,PASS,,,,,,,,,,," and lines[2].startswith("mm,builtin,mm,FAIL,")
    assert lines[2].endswith(',"a, b; c"') and lines[3] == "" and len(lines) == 4 and "\r" not in text
    r.record(ADD, StatusRow("add", "builtin", "add", "TIMEOUT"))  # replaces the row
    assert [(x["op"], x["status"]) for x in status_rows(tmp_path)] == [("add", "TIMEOUT"), ("mm", "FAIL")]
    # A resumed batch starts from the rows its dir holds.
    again = runner_for(tmp_path)
    again.record(Entry("path", "z", "z", "z.py"), StatusRow("z", "path", "z", "SKIP"))
    assert [x["op"] for x in status_rows(tmp_path)] == ["add", "mm", "z"]
    assert list(tmp_path.iterdir()) == [tmp_path / "ops_status.csv"]  # written atomically: no temp file left


# --- one attempt -------------------------------------------------------------------------------------
def test_attempt_runs_under_the_guard_and_forgets_the_child_after(tmp_path, launcher, clock):
    r = runner_for(tmp_path, launcher, op_timeout=7.5)
    op_dir = tmp_path / "ops" / "x"
    op_dir.mkdir(parents=True)
    (op_dir / "batch.log").write_text("earlier\n")
    launcher.plan["t"] = [Step(code=3, seconds=2.5, log="child says\n")]
    code, seconds = r._attempt(["python", "-m", "harness", "record", "t"], op_dir / "batch.log", cwd="/c")
    assert (code, seconds) == (3, 2.5)
    call = launcher.calls[0]
    assert call["running"] == str(op_dir / opguard.RUNNING)  # what --resume looks for
    assert call["cmd"] == ["python", "-m", "harness", "record", "t"] and call["cwd"] == "/c"
    assert call["with_parent"] is False and call["log"] == str(op_dir / "batch.log") and call["mode"] == "a"
    assert (op_dir / "batch.log").read_text() == "earlier\nchild says\n"
    pid, timeout, running_then = launcher.waits[0]
    assert timeout == 7.5 and running_then == {pid}  # stop() could reach it while it ran
    assert r.children == {} and not (op_dir / opguard.RUNNING).exists()
    assert launcher.children[0].stops == []
    launcher.plan["t"] = [Step(code=0, running_left=False)]  # its guard removed .running itself
    assert r._attempt(["python", "-m", "harness", "record", "t"], op_dir / "batch.log")[0] == 0


def test_attempt_stops_a_timed_out_child_and_never_lets_one_started_during_a_stop_run(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    (tmp_path / "o").mkdir()
    launcher.plan["t"] = [Step(code=None, seconds=20.0)]
    assert r._attempt(["p", "-m", "harness", "record", "t"], tmp_path / "o" / "l.log") == (None, 20.0)
    assert launcher.children[0].stops == [batch.KILL_GRACE_S]
    assert not (tmp_path / "o" / opguard.RUNNING).exists()
    r.stopping.set()
    launcher.plan["t"] = [Step(code=128 + 15)]  # what a child that finds its start gate closed exits with
    with pytest.raises(batch.NotStarted):
        r._attempt(["p", "-m", "harness", "record", "t"], tmp_path / "o" / "l.log")
    assert r.children == {} and launcher.children[1].stops == []  # waited for at its gate, not killed


def test_hold_names_the_ops_group_and_keeps_its_lock_while_open(tmp_path):
    """What a forked op (and the guard) writes into `.running`, and the lock a resume tests it by."""
    running = tmp_path / opguard.RUNNING
    held = opguard.hold(running, 42, ["python", "-m", "harness", "record", "x"])
    assert json.loads(running.read_text()) == {"pid": os.getpid(), "pgid": os.getpgid(0), "batch_pid": 42,
                                               "command": ["python", "-m", "harness", "record", "x"]}
    with open(running) as f:
        assert not opguard._lock_free(f)
        held.close()
        assert opguard._lock_free(f)
    assert [p.name for p in tmp_path.iterdir()] == [opguard.RUNNING]  # nothing left aside


def test_the_running_file_is_found_whole_and_locked_or_not_at_all(tmp_path, monkeypatch):
    """A batch watching its op, or a test, that opens `.running` as soon as it exists finds the group
    named and the lock held: never an empty file whose guard is alive (read as one that died before it
    wrote, its op left running)."""
    running = tmp_path / opguard.RUNNING
    seen = []
    dump = opguard.json.dump

    def dump_and_look(facts, f):
        seen.append(running.exists())
        dump(facts, f)

    monkeypatch.setattr(opguard.json, "dump", dump_and_look)
    held = opguard.hold(running, 42, ["python"])
    try:
        assert seen == [False] and json.loads(running.read_text())["batch_pid"] == 42
    finally:
        held.close()


def test_a_forked_step_waited_for_from_two_threads_reads_its_exit_once():
    """A batch waits for its forked op from the op's device thread (up to --op-timeout) while a stop
    waits for it from the main thread (its grace): one reads the worker's answer, the other waits for it."""
    from harness.core import forkserver

    release = threading.Event()
    reads = []

    class Answers:  # the worker's side of the socket: the exit code once the step ended
        def exit_code(self, pid, timeout):  # the step's pid: whose group it kills if the worker died
            reads.append((pid, timeout))
            if not release.wait(timeout):
                raise subprocess.TimeoutExpired(str(pid), timeout)
            return -15

    step = forkserver._Step(Answers(), 123)
    got = []
    reader = threading.Thread(target=lambda: got.append(step.wait()))
    reader.start()
    assert wait_for(lambda: reads, 5)
    with pytest.raises(subprocess.TimeoutExpired):  # the other thread reads: this one waits its timeout out
        step.wait(0.3)
    release.set()
    reader.join(5)
    assert got == [-15] and step.wait(0.3) == -15 and reads == [(123, None)]
    assert launch.Child(step, own_group=True).pid == 123  # whose group a stop signals
    # Two waiters without a limit both get it, however long the step takes; one with a limit reads
    # for what is left of it.
    release.clear()
    reads.clear()
    step, got = forkserver._Step(Answers(), 124), []
    waiters = [threading.Thread(target=lambda: got.append(step.wait())) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    threading.Timer(1.5, release.set).start()
    for waiter in waiters:
        waiter.join(10)
    assert got == [-15, -15] and reads == [(124, None)]
    release.clear()
    reads.clear()
    step = forkserver._Step(Answers(), 125)
    threading.Timer(0.3, release.set).start()
    assert step.wait(30) == -15 and reads[0][0] == 125 and 29 < reads[0][1] <= 30


def test_stop_kills_every_running_child_and_stops_scheduling(tmp_path):
    r = runner_for(tmp_path)
    children = [FakeChild(None, Step(), 1), FakeChild(None, Step(), 2)]
    r.children = {c.pid: c for c in children}
    r.stop()
    assert r.stopping.is_set() and [c.stops for c in children] == [[batch.KILL_GRACE_S]] * 2


# --- one op: status, retries, dtypes, notes -----------------------------------------------------------
def test_a_pass_is_done_with_its_run_facts(tmp_path, launcher):
    r = runner_for(tmp_path, launcher, devices=[0, 3])
    launcher.plan["add"] = [Step(code=0, seconds=2.24, rows=[
        row(timer="graph", markers=["TIMER_FALLBACK x"]), row(markers=["AUTOTUNE_REPLAY_FALLBACK y"])])]
    op_dir = batchdir.op_dir(tmp_path, ADD.key)
    got = r.run_op(ADD, 3)
    assert got == StatusRow("add", "builtin", "add", "PASS", exit_code=0, attempts=1, elapsed_s=2.2,
                            backend="interpreter", device=3, timer="direct+graph", rows=2, timer_fallback_rows=1,
                            replay_fallback_rows=1, run_dir="ops/builtin__add/attempt1/run", notes="")
    assert (op_dir / ".complete").read_text() == "PASS\n"
    assert batchdir.completed(tmp_path, ADD.key) == "PASS"
    assert status_rows(tmp_path)[0]["status"] == "PASS" and r.status[ADD.id] is got
    cmd = launcher.calls[0]["cmd"]
    assert cmd[3:5] == ["record", "add"] and cmd[cmd.index("--device") + 1] == "3"
    assert cmd[cmd.index("--run-dir") + 1] == str(op_dir / "attempt1" / "run") and launcher.calls[0]["log"] == str(
        op_dir / "batch.log")


def test_a_pass_whose_every_case_skipped_is_a_skip_with_the_reason(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(rows=[row(status="SKIPPED", error="needs a GPU"), row(status="SKIPPED")])]
    got = r.run_op(ADD, 0)
    assert (got.status, got.notes) == ("SKIP", "skipped: needs a GPU")
    assert batchdir.completed(tmp_path, ADD.key) == "SKIP"
    launcher.plan["add"] = [Step(rows=[row(status="SKIPPED", error="x"), row()])]  # one case ran
    assert r.run_op(ADD, 0).status == "PASS"
    launcher.plan["add"] = [Step(rows=[])]  # nothing to run is no skip
    assert r.run_op(ADD, 0).status == "PASS"
    launcher.plan["add"] = [Step(code=1, rows=[row(status="SKIPPED", error="x")])]
    assert r.run_op(ADD, 0).status == "FAIL"  # a failure is never a skip


def test_bad_input_is_not_retried_and_its_error_is_the_note(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    # Each attempt's output starts at its `$ command` line, as launch.start writes it.
    launcher.plan["add"] = [Step(code=2, rows=None, log="$ cmd\nerror: s.yaml: no entry for 'add' (keys tried: add)\n"),
                            Step(code=0, rows=[row()])]
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts) == ("FAIL", 1)
    assert got.notes == "bad input, not retried: s.yaml: no entry for 'add' (keys tried: add)"
    launcher.plan["add"] = [Step(code=2, rows=None, log="$ cmd\nTraceback\n")]  # the earlier error is not this one
    assert r.run_op(ADD, 0).notes == "bad input, not retried: see batch.log"


def test_the_error_line_of_a_log_with_no_command_line_and_bytes_that_are_not_utf8(tmp_path):
    log = tmp_path / "batch.log"
    log.write_bytes(b"error: shape file \xff.yaml does not exist\nusage: ...\n")
    assert batch_facts.error_line(log) == "shape file \ufffd.yaml does not exist"


def test_the_same_exit_twice_is_deterministic_and_ends_the_retries(tmp_path, launcher, clock, monkeypatch):
    # Run dirs r1, r2, ... in the order the attempts start: an attempt dir reused later holds earlier runs too.
    monkeypatch.setattr(rundir, "unclaimed_run_dir", lambda root, op: root / f"r{len(launcher.calls) + 1}")
    r = runner_for(tmp_path, launcher)
    op_dir = batchdir.op_dir(tmp_path, ADD.key)
    op_dir.mkdir(parents=True)
    (op_dir / ".complete").write_text("PASS\n")  # an earlier batch's: this run decides again
    launcher.plan["add"] = [Step(code=3, seconds=1.0, rows=[row()]), Step(code=3, seconds=2.0, rows=[row(), row()])]
    got = r.run_op(ADD, 0)
    assert (got.status, got.exit_code, got.attempts, got.elapsed_s) == ("FAIL", 3, 2, 3.0)
    assert got.notes == "retry after exit 3; exit 3 twice in a row: deterministic, not retried further"
    assert not (op_dir / ".complete").exists() and batchdir.completed(tmp_path, ADD.key) is None
    assert [c["cmd"][c["cmd"].index("--run-dir") + 1] for c in launcher.calls] == [
        str(op_dir / "attempt1" / "r1"), str(op_dir / "attempt2" / "r2")]
    assert (got.run_dir, got.rows) == ("ops/builtin__add/attempt2/r2", 2)  # the last attempt's
    launcher.plan["add"] = [Step(code=3, rows=[row()]), Step(code=3, rows=None)]
    got = r.run_op(ADD, 0)
    assert (got.run_dir, got.rows) == ("ops/builtin__add/attempt1/r3", 1)  # the last attempt that wrote one
    launcher.plan["add"] = [Step(code=3, rows=None), Step(code=3, rows=None)]
    got = r.run_op(ADD, 0)
    assert (got.run_dir, got.rows) == ("", 0)  # the runs already in its attempt dirs are not this row's


def test_an_attempt_is_read_back_from_the_run_dir_the_batch_named_never_a_stray_one(tmp_path, launcher, monkeypatch):
    monkeypatch.setattr(rundir, "unclaimed_run_dir", UNCLAIMED_RUN_DIR)  # the real names
    r = runner_for(tmp_path, launcher)
    op_dir = batchdir.op_dir(tmp_path, ADD.key)
    write_run(op_dir / "attempt1", [row()], {"outcome": {"status": "COMPLETE", "exit_code": 0}},
              name="add_19990101-000000")  # a passed run left in the attempt dir: not this attempt's
    launcher.plan["add"] = [Step(code=0, rows=None)]  # exits 0 having claimed nothing
    got = r.run_op(ADD, 0)
    assert (got.status, got.run_dir, got.rows) == ("FAIL", "", 0)
    named = [Path(c["cmd"][c["cmd"].index("--run-dir") + 1]) for c in launcher.calls]
    assert [d.parent for d in named] == [op_dir / "attempt1", op_dir / "attempt2"]
    assert all(re.fullmatch(r"add_\d{8}-\d{6}", d.name) for d in named), named


def test_changing_exits_retry_until_the_cap(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(code=11), Step(code=12), Step(code=13), Step(code=14), Step(code=0)]
    got = r.run_op(ADD, 0)
    assert batch.MAX_RETRIES == 2
    assert (got.status, got.exit_code, got.attempts) == ("FAIL", 13, 3)
    assert got.notes == "retry after exit 11; retry after exit 12; exit 13"
    assert (got.run_dir, got.rows, got.timer) == ("", 0, "")  # no attempt wrote a run dir


def incomplete(reason: str, case: str = "fp32-8") -> dict:
    return {"outcome": {"status": "INCOMPLETE", "rows_done": 1, "rows_planned": 2, "reason": reason,
                        "running_case": case, "exit_code": 3}}


def test_an_exit_0_is_a_pass_only_when_its_run_recorded_it_complete(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(code=0, rows=[row()], observed=incomplete("child exited 0 unexpectedly"))]
    got = r.run_op(ADD, 0)
    assert got.status == "FAIL"
    assert got.notes.startswith("retry after exit 0 (INCOMPLETE 1/2 rows: child exited 0 unexpectedly during case "
                                   "fp32-8); exit 0 twice in a row the same way")


def test_the_same_exit_code_with_another_recorded_reason_is_retried(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(code=3, rows=[row()], observed=incomplete("child exited 11 unexpectedly")),
                            Step(code=3, rows=[row()], observed=incomplete("child exited 12 unexpectedly", "fp32-4")),
                            Step(code=3, rows=[row()], observed=incomplete("child exited 12 unexpectedly", "fp32-4"))]
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts) == ("FAIL", 3)
    assert got.notes.endswith("; exit 3 twice in a row the same way: deterministic, not retried further")


def test_a_flaky_op_passes_on_its_retry(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(code=1, seconds=1.0), Step(code=-9, seconds=1.0), Step(code=0, rows=[row()])]
    got = r.run_op(ADD, 0)
    assert (got.status, got.exit_code, got.attempts, got.elapsed_s) == ("PASS", 0, 3, 3.0)
    assert got.notes == "retry after exit 1; retry after exit -9"
    assert got.run_dir == "ops/builtin__add/attempt3/run"


def test_a_timeout_is_killed_not_retried_and_says_where(tmp_path, launcher):
    r = runner_for(tmp_path, launcher, op_timeout=20.4)
    launcher.plan["add"] = [Step(code=None, seconds=20.4, rows=[row()], observed={"running_case": "fp32 [2, 700]"})]
    got = r.run_op(ADD, 0)
    what = "timeout after 20 s during case fp32 [2, 700]"
    assert (got.status, got.exit_code, got.attempts) == ("TIMEOUT", None, 1)
    assert got.notes == f"{what} (killed, not retried)"
    assert launcher.children[0].stops == [batch.KILL_GRACE_S] and launcher.waits[0][1] == 20.4
    op_dir = batchdir.op_dir(tmp_path, ADD.key)
    note = f"\nkilled by the batch's --op-timeout: {what}\n"
    assert (op_dir / "batch.log").read_text().endswith(note)
    assert (op_dir / "attempt1" / "run" / rundir.RUN_LOG).read_text().endswith(note)
    assert not (op_dir / ".complete").exists()
    launcher.plan["add"] = [Step(code=3), Step(code=None)]  # a timeout after a failure
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts, got.exit_code) == ("TIMEOUT", 2, None)
    assert got.notes == ("retry after exit 3; timeout after 20 s before its run dir was written (the op never "
                            "started a case) (killed, not retried)")


def test_requested_dtypes_narrow_to_the_ones_a_builtin_op_takes(tmp_path, launcher):
    r = runner_for(tmp_path, launcher, dtypes=["fp16", "bf16", "fp32"], op_dtypes={ADD.id: ("fp32", "bf16")})
    launcher.plan["add"] = [Step(code=65), Step(code=0, rows=[row()])]
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts) == ("PASS", 2)
    assert got.notes == "dtype fallback fp16,bf16,fp32 -> bf16,fp32"  # in the order asked for
    dtypes = [c["cmd"][c["cmd"].index("--dtypes") + 1] for c in launcher.calls]
    assert dtypes == ["fp16,bf16,fp32", "bf16,fp32"]


def test_a_rejection_with_nothing_to_narrow_to_runs_without_a_dtype_filter(tmp_path, launcher):
    # Nothing accepted; all accepted already (the op claims them but rejects); a FlagGems op (no
    # known dtypes): each goes straight to the rescue.
    for op_dtypes in ({ADD.id: ("fp32",)}, {ADD.id: ("fp16", "bf16", "fp32")}, {}):
        launcher.calls.clear()
        r = runner_for(tmp_path, launcher, dtypes=["fp16", "bf16"], op_dtypes=op_dtypes)
        if op_dtypes.get(ADD.id) == ("fp16", "bf16", "fp32"):
            launcher.plan["add"] = [Step(code=1, observed={"dtype_rejected": True}), Step(code=0, rows=[row()])]
        else:
            launcher.plan["add"] = [Step(code=65), Step(code=0, rows=[row()])]
        got = r.run_op(ADD, 0)
        assert (got.status, got.attempts) == ("PASS", 2), op_dtypes
        assert got.notes == "dtype rescue: fp16,bf16 rejected, ran without a dtype filter"
        assert "--dtypes" in launcher.calls[0]["cmd"] and "--dtypes" not in launcher.calls[1]["cmd"]


def test_narrowing_then_a_rescue_then_failures(tmp_path, launcher):
    r = runner_for(tmp_path, launcher, dtypes=["fp16", "fp32"], op_dtypes={ADD.id: ("fp32",)})
    launcher.plan["add"] = [Step(code=65), Step(code=65), Step(code=65)]
    got = r.run_op(ADD, 0)
    # Without a dtype filter a 65 is an ordinary failure: retried, then deterministic.
    assert (got.status, got.attempts, got.exit_code) == ("FAIL", 4, 65)
    assert got.notes == ("dtype fallback fp16,fp32 -> fp32; dtype rescue: fp32 rejected, ran without a dtype "
                            "filter; retry after exit 65; exit 65 twice in a row: deterministic, not retried further")


def test_a_replay_without_an_earlier_pass_fails_without_running(tmp_path, launcher):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "ops_status.csv").write_text(
        "op,repo,op_file,status,run_dir\nadd,builtin,add,PASS,ops/builtin__add/attempt2/run\n"
        "mm,builtin,mm,FAIL,ops/builtin__mm/attempt1/run\nrms_norm,builtin,rms_norm,PASS,\n")
    d = tmp_path / "b"
    d.mkdir()
    r = runner_for(d, launcher, replay_root=earlier)
    for e in (MM, Entry("builtin", "rms_norm", "rms_norm", "x"), Entry("builtin", "softmax", "softmax", "x")):
        got = r.run_op(e, 0)
        assert (got.status, got.attempts, got.exit_code) == ("FAIL", 0, None), e
        assert got.notes == f"no PASSed run of this op to replay in {earlier}"
    assert launcher.calls == []
    got = r.run_op(ADD, 0)
    assert got.status == "PASS" and launcher.calls[0]["cmd"][3:5] == [
        "replay", str(earlier / "ops/builtin__add/attempt2/run")]


def test_a_stop_during_an_attempt_interrupts_the_op(tmp_path, launcher):
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(code=-15, rows=[row()], during=r.stop)]
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts, got.exit_code) == ("INTERRUPTED", 1, -15)
    assert launcher.children[0].stops == [batch.KILL_GRACE_S]  # stop() reached the running child
    assert batchdir.completed(tmp_path, ADD.key) is None
    launcher.calls.clear()
    got = r.run_op(MM, 0)  # stopped before it started (a Slurm task cancelled as it starts): not a failure
    assert (got.status, got.attempts, launcher.calls) == ("INTERRUPTED", 0, [])
    assert batchdir.completed(tmp_path, MM.key) is None


def test_an_op_that_passed_just_before_a_stop_is_a_pass(tmp_path, launcher):
    # The stop came after the op's run had ended: its result stands, and a resume skips it.
    r = runner_for(tmp_path, launcher)
    launcher.plan["add"] = [Step(code=0, rows=[row()], during=r.stop)]
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts, got.exit_code) == ("PASS", 1, 0)
    assert batchdir.completed(tmp_path, ADD.key) == "PASS"
    other = runner_for(tmp_path / "other", launcher)
    launcher.plan["mm"] = [Step(code=1, rows=[row()], during=other.stop)]  # a failure is not retried after a stop
    got = other.run_op(MM, 0)
    assert (got.status, got.attempts) == ("INTERRUPTED", 1)
    assert batchdir.completed(tmp_path / "other", MM.key) is None


# --- triage ---------------------------------------------------------------------------------------------
@pytest.fixture
def fg_runner(tmp_path, launcher):
    return runner_for(tmp_path, launcher, backend="cuda", dtypes=["fp16", "bf16"], level="comprehensive",
                      flagtune="1", flaggems_dirs={"flaggems": str(CHECKOUT)})


def test_triage_reruns_a_failing_flaggems_op_as_the_upstream_node(tmp_path, launcher, fg_runner, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    node = "benchmark/test_triage.py::test_broken_upstream"
    upstream = tmp_path / "ops" / "flaggems__broken_upstream" / "upstream"
    upstream.mkdir(parents=True)
    (upstream / "stale").write_text("a resumed batch's earlier triage")
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=1, seconds=1.0)]
    launcher.plan[node] = [Step(code=1, seconds=4.0, log="collected 1\nE   RuntimeError: broken upstream\n")]
    got = fg_runner.run_op(FG, 2)
    where = "ops/flaggems__broken_upstream/upstream/pytest.log"
    assert (got.status, got.attempts, got.exit_code, got.elapsed_s) == (batchdir.FAIL_UPSTREAM, 2, 1, 6.0)
    assert got.notes == ("retry after exit 1; exit 1 twice in a row: deterministic, not retried further; "
                            f"upstream fails too: RuntimeError: broken upstream ({where})")
    call = launcher.calls[-1]
    assert call["cmd"] == [sys.executable, "-m", "pytest", node, "--level", "comprehensive",
                           "--dtypes", "float16", "--dtypes", "bfloat16"]
    assert call["cwd"] == CHECKOUT and call["log"] == str(upstream / "pytest.log")
    assert call["env"] == {"GEMS_VENDOR": "nvidia", "USE_FLAGTUNE": "1"}
    assert call["visible"][0].name == "cuda" and call["visible"][1] == 2
    assert call["pythonpath"] == os.pathsep.join([str(CHECKOUT / "src"), paths.harness_pythonpath("/inherited")])
    assert sorted(p.name for p in upstream.iterdir()) == ["pytest.log"]
    assert batchdir.completed(tmp_path, FG.key) == batchdir.FAIL_UPSTREAM  # settled: a resume keeps it


def test_triage_keeps_fail_when_upstream_passes_or_is_undecided(tmp_path, launcher, clock):
    r = runner_for(tmp_path, launcher, flaggems_dirs={"flaggems": str(CHECKOUT)}, op_timeout=30.0)
    node = "benchmark/test_triage.py::test_broken_upstream"
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=2)]
    launcher.plan[node] = [Step(code=0, log="E   a passing test's own output\n==== 1 passed in 0.5s ====\n")]
    got = r.run_op(FG, 0)
    where = "ops/flaggems__broken_upstream/upstream/pytest.log"
    assert (got.status, got.notes.rsplit("; ", 2)[-2:]) == ("FAIL", [
        "ours: upstream passes (1 passed in 0.5s", f"{where})"])
    call = launcher.calls[-1]
    # No level, dtypes, vendor or FlagTune asked for: upstream's defaults; the checkout's src first.
    assert call["cmd"][3:] == [node, "--level", "core"] and call["env"] == {}
    assert call["pythonpath"].split(os.pathsep)[0] == str(CHECKOUT / "src")
    launcher.plan[node] = [Step(code=None, seconds=30.0)]
    got = r.run_op(FG, 0)
    assert got.status == "FAIL" and got.notes.endswith(
        f"; triage undecided: the upstream rerun timed out after 30 s (killed; {where})")
    assert launcher.children[-1].stops == [batch.KILL_GRACE_S]
    launcher.plan[node] = [Step(code=-15, during=r.stop)]
    got = r.run_op(FG, 0)
    assert got.status == "INTERRUPTED" and got.notes.endswith("; triage: interrupted during the upstream rerun")


def test_a_timed_out_flaggems_op_stays_timeout_and_says_whether_upstream_alone_finishes(tmp_path, launcher, clock):
    r = runner_for(tmp_path, launcher, flaggems_dirs={"flaggems": str(CHECKOUT)}, op_timeout=30.0)
    node = "benchmark/test_triage.py::test_broken_upstream"
    where = "ops/flaggems__broken_upstream/upstream/pytest.log"
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=None, seconds=30.0)]
    launcher.plan[node] = [Step(code=None, seconds=30.0)]
    got = r.run_op(FG, 0)
    assert (got.status, got.attempts, got.elapsed_s) == (batchdir.TIMEOUT_UPSTREAM, 1, 60.0)
    assert got.notes.endswith(
        f"(killed, not retried); upstream too: the bare node did not finish in 30 s either (killed; {where})")
    assert launcher.calls[-1]["cmd"][3:] == [node, "--level", "core"]
    # Settled for this budget: a resume under it skips the op, one with a longer budget reruns it.
    assert batchdir.completed(tmp_path, FG.key, 30.0) == batchdir.TIMEOUT_UPSTREAM
    assert batchdir.completed(tmp_path, FG.key, 60.0) is None
    launcher.plan[node] = [Step(code=0, seconds=12.4, log="==== 1 passed in 12.1s ====\n")]
    got = r.run_op(FG, 0)
    assert got.status == "TIMEOUT" and got.notes.endswith(
        f"; ours: upstream passes in 12 s (1 passed in 12.1s; {where})")
    assert batchdir.completed(tmp_path, FG.key, 30.0) is None  # ours: a resume tries it again
    launcher.plan[node] = [Step(code=1, seconds=3.0, log="E   RuntimeError: broken upstream\n")]
    got = r.run_op(FG, 0)
    assert got.status == "TIMEOUT" and got.notes.endswith(
        f"; upstream fails in 3 s (RuntimeError: broken upstream; {where})")
    launcher.plan[node] = [Step(code=-15, during=r.stop)]
    got = r.run_op(FG, 0)
    assert got.status == "INTERRUPTED" and got.notes.endswith("; triage: interrupted during the upstream rerun")


def test_triage_of_a_checkout_without_its_package_and_a_silent_upstream_failure(tmp_path, launcher, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    bare = tmp_path / "bare_checkout"  # benchmark/ only: FlagGems comes from the environment
    bare.mkdir()
    r = runner_for(tmp_path, launcher, flaggems_dirs={"flaggems": str(bare)})
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=1)]
    launcher.plan["benchmark/test_triage.py::test_broken_upstream"] = [Step(code=5, log="")]
    got = r.run_op(FG, 0)
    assert got.status == batchdir.FAIL_UPSTREAM and got.notes.endswith(
        "; upstream fails too: pytest exited 5 (ops/flaggems__broken_upstream/upstream/pytest.log)")
    assert launcher.calls[-1]["pythonpath"] == paths.harness_pythonpath("/inherited")
    assert launcher.calls[-1]["cwd"] == bare


def test_triage_runs_only_for_a_failed_flaggems_op_with_its_checkout(tmp_path, launcher, monkeypatch):
    node = "benchmark/test_triage.py::test_broken_upstream"
    checkout = {"flaggems": str(CHECKOUT)}
    cases = [  # (runner options, entry, record steps): none of these triage
        (dict(flaggems_dirs=checkout, triage=False), FG, [Step(code=1)]),
        (dict(flaggems_dirs=checkout, triage=False), FG, [Step(code=None)]),  # a timeout, triage off
        (dict(flaggems_dirs=checkout), FG, [Step(code=0, rows=[row()])]),
        (dict(flaggems_dirs={"builtin": str(CHECKOUT)}), Entry("builtin", "broken_upstream", "triage",
                                                             "benchmark/test_triage.py"), [Step(code=1)]),
    ]
    for opts, entry, steps in cases:
        launcher.calls.clear()
        launcher.plan[entry.op] = launcher.plan[f"{entry.repo}:{entry.op}@{entry.op_file}"] = steps
        launcher.plan[node] = [Step(code=1)]
        runner_for(tmp_path, launcher, **opts).run_op(entry, 0)
        assert all(c["cmd"][2] == "harness" for c in launcher.calls), opts
    # A path op (no checkout needed) is never triaged, even with a checkout named like its repo.
    monkeypatch.setattr(catalog, "needs_checkout", lambda repo: False)
    launcher.calls.clear()
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=1)]
    runner_for(tmp_path, launcher, flaggems_dirs=checkout).run_op(FG, 0)
    assert all(c["cmd"][2] == "harness" for c in launcher.calls)


# --- all ops ------------------------------------------------------------------------------------------
def test_run_shards_ops_over_devices_serially_within_each(tmp_path, launcher):
    r = runner_for(tmp_path, launcher, devices=[5, 7, 9])
    todo = [Entry("path", f"op{i}", f"op{i}", "x.py") for i in range(12)]
    done = []
    r.run(todo, done.append)
    assert sorted(x.op for x in done) == sorted(e.op for e in todo)
    for e in todo:
        assert r.status[e.id].device == [5, 7, 9][batch.shard(e.id, 3)]
    for device in (5, 7, 9):  # in todo's order on each device
        mine = [c["target"] for c in launcher.calls if c["cmd"][c["cmd"].index("--device") + 1] == str(device)]
        assert mine == [e.op for e in todo if [5, 7, 9][batch.shard(e.id, 3)] == device]
    assert len({c["target"] for c in launcher.calls}) == 12


def test_each_devices_ops_are_forked_by_its_own_warm_worker_begun_before_its_first_and_closed_after(
        tmp_path, launcher):
    r = runner_for(tmp_path, launcher, devices=[5, 7, 9])
    todo = [Entry("path", f"op{i}", f"op{i}", "x.py") for i in range(6)]
    used = {[5, 7, 9][batch.shard(e.id, 3)] for e in todo}
    r.run(todo, lambda row: None)
    assert len(launcher.workers) == len(used) and all(w.begun and w.closed for w in launcher.workers)
    assert r.workers == {}  # each device thread closed its own
    assert all(w.log.closed and w.log.name == str(tmp_path / batchdir.WORKERS_LOG) for w in launcher.workers)
    for device in used:  # one worker forks every op of its device, each holding the op dir's .running
        mine = [c for c in launcher.calls if c["cmd"][c["cmd"].index("--device") + 1] == str(device)]
        assert len({c["forked_by"] for c in mine}) == 1
        assert all(c["running"] == str(tmp_path / "ops" / f"path__{c['target']}" / opguard.RUNNING) for c in mine)
        assert all(c["cmd"][:4] == [sys.executable, "-m", "harness", "record"] for c in mine)
    assert len(launcher.calls) == 6 and not list(tmp_path.glob("ops/*/" + opguard.RUNNING))
    # --op-start fresh: every op under its guard, and no worker.
    launcher.workers.clear()
    launcher.calls.clear()
    (tmp_path / "fresh").mkdir()
    r = runner_for(tmp_path / "fresh", launcher, devices=[5, 7, 9], op_start="fresh")
    r.run(todo, lambda row: None)
    assert launcher.workers == [] and len(launcher.calls) == 6 and all("forked_by" not in c for c in launcher.calls)
    assert all(c["cmd"][:4] == [sys.executable, "-m", "harness", "record"] for c in launcher.calls)
    assert not (tmp_path / "fresh" / batchdir.WORKERS_LOG).exists()


def test_a_devices_worker_has_this_interpreter_and_the_backends_child_environment(tmp_path):
    log = open(tmp_path / batchdir.WORKERS_LOG, "a")
    worker = batch.Batch(tmp_path, options(backend="interpreter"), {})._new_worker(log)
    # The interpreter's TRITON_INTERPRET: importing triton in the worker must see it, as the op's child does.
    assert (worker.python, worker.env, worker.backend, worker.log) == (sys.executable, {"TRITON_INTERPRET": "1"},
                                                                       "interpreter", log)
    assert (worker.pythonpath, worker.cache_root, worker.child) == (None, None, None)  # begun by its device thread
    log.close()


def test_a_fault_in_a_device_thread_stops_the_batch_and_is_raised_not_hung_on(tmp_path, launcher, monkeypatch):
    r = runner_for(tmp_path, launcher, devices=[0, 1])
    todo = [Entry("path", f"op{i}", f"op{i}", "x.py") for i in range(4)]
    broken = next(e for e in todo if r.device_of(e) == 0)
    measure = batch.Batch.measure_op

    def measure_op(self, entry, device):
        if entry is broken:
            raise ValueError("a bug of ours")
        return measure(self, entry, device)

    monkeypatch.setattr(batch.Batch, "measure_op", measure_op)
    with pytest.raises(RuntimeError) as raised:
        r.run(todo, lambda row: None)
    assert str(raised.value) == ("a device thread of the batch failed (its running ops were stopped; resume with "
                                 "--resume --batch-dir)")
    assert isinstance(raised.value.__cause__, ValueError) and r.stopping.is_set()
    assert r.workers == {} and all(w.closed for w in launcher.workers)


def test_a_worker_that_cannot_start_leaves_its_device_to_fresh_ops_and_says_so(tmp_path, launcher, monkeypatch):
    def refused(self):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(FakeWorker, "begin", refused)
    r = runner_for(tmp_path, launcher, devices=[0])
    done = []
    r.run([Entry("path", f"op{i}", f"op{i}", "x.py") for i in range(2)], done.append)
    assert [c["target"] for c in launcher.calls] == ["op0", "op1"] and all("forked_by" not in c for c in launcher.calls)
    assert [x.notes for x in done] == ["its device's warm worker could not start ([Errno 11] Resource temporarily "
                                       "unavailable): device 0's ops start fresh", ""]


def test_a_job_that_does_not_fork_starts_every_op_fresh(tmp_path, launcher):
    class Unforked(batch.Batch):
        FORKS = False

    r = Unforked(tmp_path, options(), {})
    launcher.runner = r
    r.run([ADD], lambda row: None)
    assert launcher.workers == [] and [c["target"] for c in launcher.calls] == ["add"]
    assert "forked_by" not in launcher.calls[0]


def test_a_worker_that_cannot_fork_leaves_its_device_to_fresh_ops_and_says_so(tmp_path, launcher, monkeypatch):
    def refused(self, argv, log, on_stdout, guard=None, gate=None):
        raise forkserver.WorkerDied("the warm worker of python did not start (exited 1; see the log)")

    monkeypatch.setattr(FakeWorker, "start", refused)
    r = runner_for(tmp_path, launcher, devices=[0])
    todo = [Entry("path", f"op{i}", f"op{i}", "x.py") for i in range(2)]
    done = []
    r.run(todo, done.append)
    (worker,) = launcher.workers
    assert worker.closed and [c["target"] for c in launcher.calls] == ["op0", "op1"]
    assert all("forked_by" not in c for c in launcher.calls)  # both under their guards
    why = ("its warm worker could not fork it (the warm worker of python did not start (exited 1; see the log)): "
           "device 0's ops start fresh from here")
    assert [(x.op, x.status, x.notes) for x in done] == [("op0", "PASS", why), ("op1", "PASS", "")]
    assert why in (tmp_path / "ops" / "path__op0" / "batch.log").read_text()


def test_a_worker_that_died_during_an_attempt_is_said_and_the_retry_forked_again(tmp_path, launcher, monkeypatch):
    forked = FakeWorker.start

    def dies_once(self, argv, log, on_stdout, guard=None, gate=None):
        self.died = not any("forked_by" in c for c in self.launcher.calls)  # during the first attempt only
        return forked(self, argv, log, on_stdout, guard, gate)

    monkeypatch.setattr(FakeWorker, "start", dies_once)
    launcher.plan["op0"] = [Step(code=-9), Step(rows=[row()])]
    r = runner_for(tmp_path, launcher, devices=[0])
    done = []
    r.run([Entry("path", "op0", "op0", "x.py")], done.append)
    said = "its warm worker died during the attempt, which was killed with it"
    assert [(x.status, x.attempts) for x in done] == [("PASS", 2)]
    assert done[0].notes == f"{said}; retry after exit -9"
    assert [c["forked_by"] for c in launcher.calls] == [0, 0]
    assert said in (tmp_path / "ops" / "path__op0" / "batch.log").read_text()


def test_run_waits_for_an_op_slower_than_its_poll(tmp_path, launcher):
    import time
    r = runner_for(tmp_path, launcher, devices=[0])
    launcher.plan["slow"] = [Step(rows=[row()], during=lambda: time.sleep(0.8))]  # longer than a queue poll
    done = []
    r.run([Entry("path", "slow", "slow", "x.py")], done.append)
    assert [x.op for x in done] == ["slow"]


def test_progress_counts_each_finished_op(tmp_path, launcher, monkeypatch, capsys):
    import tqdm
    bars = []

    class Bar:
        def __init__(self, **kw):
            self.kw, self.postfix, self.updates = kw, [], []
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def set_postfix(self, counts, refresh=True):
            self.postfix.append((dict(counts), refresh))

        def update(self, n):
            self.updates.append(n)

        def write(self, text):
            print(text)

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    launcher.plan["crash_op"] = [Step(code=3)]
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops-path", OPS, "--ops", "builtin:add", "crash_op",
                                     "fp32_op", "--devices", "0", "--batch-dir", tmp_path / "b")) == 1
    (bar,) = bars
    assert bar.kw == {"total": 3, "unit": "op", "dynamic_ncols": True, "disable": None}  # off when not a tty
    assert bar.updates == [1, 1, 1] and [refresh for _, refresh in bar.postfix] == [False] * 3
    assert bar.postfix[-1][0] == {"FAIL": 1, "PASS": 2} and list(bar.postfix[-1][0]) == ["FAIL", "PASS"]
    assert sum(line.startswith(("PASS     ", "FAIL     ")) for line in lines(capsys)) == 3


def test_run_stops_scheduling_once_stopped_and_kills_on_ctrl_c(tmp_path, launcher):
    r = runner_for(tmp_path, launcher, devices=[0])
    todo = [Entry("path", f"op{i}", f"op{i}", "x.py") for i in range(4)]
    launcher.plan["op0"] = [Step(code=0, rows=[row()], during=r.stopping.set)]
    seen = []

    def on_done(got):
        seen.append(got.op)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        r.run(todo, on_done)
    assert seen == ["op0"] and [c["target"] for c in launcher.calls] == ["op0"] and r.stopping.is_set()
    r = runner_for(tmp_path, launcher, devices=[0])
    r.children = {1: FakeChild(None, Step(), 1)}
    r.run([], seen.append)  # nothing to do returns at once
    with pytest.raises(KeyboardInterrupt):
        r.run([todo[1]], on_done)
    assert r.stopping.is_set() and r.children[1].stops == [batch.KILL_GRACE_S]


def test_stop_leftovers_stops_each_running_op_and_says_so(tmp_path, monkeypatch):
    for name in ("b", "a", "c"):
        (tmp_path / "ops" / name).mkdir(parents=True)
        (tmp_path / "ops" / name / opguard.RUNNING).write_text("{}")
    (tmp_path / "ops" / "d").mkdir()
    (tmp_path / "ops" / "d" / "other").write_text("{}")
    seen = []

    def stop_leftover(running, grace_s):
        seen.append((running.parent.name, grace_s))
        return None if running.parent.name == "c" else {"batch_pid": 11, "pgid": ord(running.parent.name)}

    monkeypatch.setattr(opguard, "stop_leftover", stop_leftover)
    assert batch.stop_leftovers(tmp_path) == [
        "resume: stopped ops/a, still running from the dead batch pid 11 (process group 97), before reusing its device",
        "resume: stopped ops/b, still running from the dead batch pid 11 (process group 98), before reusing its device"]
    assert seen == [("a", batch.KILL_GRACE_S), ("b", batch.KILL_GRACE_S), ("c", batch.KILL_GRACE_S)]


# --- the job's hooks -----------------------------------------------------------------------------------
def test_batch_hooks_of_a_record_job(tmp_path):
    r = runner_for(tmp_path, devices=[4, 6])
    assert batch.Batch.prepare(parse("--batch-dir", tmp_path), {"backend": "x"}, r.opts.run) == (
        {}, r.opts.run, None)
    with pytest.raises(UsageError) as info:
        batch.Batch.prepare(parse("--batch-dir", tmp_path), {"plan": {}}, r.opts.run)
    assert str(info.value) == (f"--batch-dir {tmp_path} is a corpus A/B: resume it with nox -s ab -- --resume "
                               "--batch-dir DIR")
    assert batch.Batch.dir_prefix({}) == "batch"
    assert r.tally(StatusRow("add", "builtin", status="SKIP")) == {"SKIP": 1}
    line = StatusRow("add", "builtin", status="FAIL", device=6, elapsed_s=1.5, rows=2, notes="")
    assert r.done_line(line) == "FAIL     builtin:add device=6 1.5 s rows=2"
    assert r.done_line(dataclasses.replace(line, notes="retry after exit 3")) == (
        "FAIL     builtin:add device=6 1.5 s rows=2  retry after exit 3")
    assert r.summarize() == f"summary: {tmp_path / 'summary.csv'}" and (tmp_path / "summary.csv").is_file()
    e = Entry("path", "op1", "op1", "x.py")
    assert r.device_of(e) == [4, 6][batch.shard(e.id, 2)]


def test_slurm_params_fit_every_attempt_and_take_key_values():
    assert batch_session._slurm_params(None, 60.0) == {"timeout_min": 10}  # 5 attempts of a minute, plus 5
    assert batch_session._slurm_params(["partition=gpu", "qos=a=b"], 61.0) == {
        "timeout_min": 11, "slurm_partition": "gpu", "slurm_qos": "a=b"}
    for bad in ("partition", "=gpu"):
        with pytest.raises(UsageError) as info:
            batch_session._slurm_params([bad], 60.0)
        assert str(info.value) == f"--slurm-param {bad!r}: expected KEY=VAL (e.g. partition=gpu)"


# --- what a batch stores for its resume ---------------------------------------------------------------------
FULL = dict(backend="interpreter", devices=[0, 2], dtypes=["fp16"], shapes=Path("/s.yaml"), ops_paths=["/ops"],
            flaggems_dirs={"flaggems": "/fg"}, level="core", flagtune="1", libtuner_cache="user", op_timeout=5.0,
            replay_root=Path("/earlier"), triage=False, op_start="fresh")


def test_request_stores_options_as_the_command_line_gives_them():
    unmeasured = {"seed": None, "timer": None, "l2": None, "warmup_ms": None, "rep_ms": None, "windows": None,
                  "max_noise": None}
    assert batch_resume.stored_request(options(**FULL), [ADD, MM]) == {
        "backend": "interpreter", "devices": "0,2", "dtypes": ["fp16"], "shapes": "/s.yaml", "ops_paths": ["/ops"],
        "flaggems_dirs": ["flaggems=/fg"], "level": "core", "flagtune": "1", "libtuner_cache": "user",
        "op_timeout": 5.0, "replay_root": "/earlier", "triage": False, "op_start": "fresh",
        "selection": [ADD.id, MM.id], **unmeasured}
    assert batch_resume.stored_request(options(devices=[1]), []) == {
        "backend": "interpreter", "devices": "1", "dtypes": None, "shapes": None, "ops_paths": [],
        "flaggems_dirs": [], "level": None, "flagtune": None, "libtuner_cache": None,
        "op_timeout": batchdir.DEFAULT_OP_TIMEOUT, "replay_root": None, "triage": None, "op_start": None,
        "selection": [], **unmeasured}


def resumed(stored: dict, *argv):
    """What a resume of a batch that stored `stored` runs with, given `argv`: (run options, batch
    options, the line saying which came from where)."""
    args = parse("--resume", "--batch-dir", "/b", *argv)
    return batch_resume.resumed(stored, args.run, args.how,
                          Path("/b/batch.json"))


def test_a_resume_takes_what_the_command_line_does_not_give_from_batch_json():
    stored = json.loads(json.dumps(batch_resume.stored_request(options(**FULL), [ADD, MM])))
    run, how, line = resumed(stored)
    assert line == ("options from batch.json: --level --flagtune --libtuner-cache --backend --shapes --dtypes "
                    "--ops-path --flaggems-dir --devices --op-timeout --replay-root --no-triage --op-start; from the "
                    "command line: none")
    assert run == RunOptions(backend="interpreter", dtypes=("fp16",), shapes=Path("/s.yaml"), ops_paths=("/ops",),
                             flaggems_dirs=("flaggems=/fg",), level="core", flagtune="1", libtuner_cache="user")
    assert how == BatchOptions(devices="0,2", op_timeout=5.0, replay_root=Path("/earlier"), triage=False,
                               op_start="fresh")
    run, how, line = resumed(stored, "--backend", "cpu", "--op-timeout", "9", "--triage", "--ops", "add",
                             "--op-start", "fork")
    assert line == ("options from batch.json: --level --flagtune --libtuner-cache --shapes --dtypes --ops-path "
                    "--flaggems-dir --devices --replay-root; from the command line: --backend --op-timeout --triage "
                    "--op-start")
    assert (run.backend, how.op_timeout, how.triage, how.op_start, run.level) == ("cpu", 9.0, True, "fork", "core")
    # A batch.json written before the options took their fields' names.
    old = {k: v for k, v in stored.items() if k not in ("ops_paths", "flaggems_dirs")}
    old.update(ops_path=["/ops"], flaggems_dir=["flaggems=/fg"])
    assert resumed({batch_resume.RENAMED.get(k, k): v for k, v in old.items()}, "--ops", "add")[0] == resumed(stored)[0]


def test_a_batch_records_each_op_measured_as_asked(tmp_path, launcher):
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--timer", "host", "--seed", "0",
                                     "--devices", "0", "--batch-dir", tmp_path / "b")) == 0
    (call,) = launcher.calls
    cmd = call["cmd"]
    assert cmd[cmd.index("--timer") + 1] == "host" and cmd[cmd.index("--seed") + 1] == "0"


def test_how_records_measure_is_passed_on_stored_and_kept_by_a_resume(tmp_path, launcher):
    args = parse("--ops", "add", "--timer", "host", "--l2", "warm", "--seed", "0", "--warmup-ms", "2", "--windows", "2",
                 "--backend", "interpreter", "--devices", "0", "--batch-dir", tmp_path / "b")
    assert batch.run_from_args(args) == 0
    stored = rundir.read_json(tmp_path / "b" / batchdir.BATCH_JSON)["request"]
    assert {k: stored[k] for k in ("seed", "timer", "l2", "warmup_ms", "rep_ms", "windows")} == {
        "seed": 0, "timer": "host", "l2": "warm", "warmup_ms": 2.0, "rep_ms": None, "windows": 2}  # seed 0 was given
    run, _, line = resumed(stored, "--warmup-ms", "3")
    assert line == ("options from batch.json: --backend --seed --timer --l2 --windows --devices --op-timeout; "
                    "from the command line: --warmup-ms")
    assert run.measurement() == RunOptions(seed=0, timer="host", l2="warm", warmup_ms=3.0, windows=2)
    with pytest.raises(UsageError, match=r"--replay-root replays each op as it was recorded, measured the same way: "
                                         r"drop --timer --rep-ms$"):
        batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--replay-root", tmp_path, "--timer",
                                  "host", "--rep-ms", "3"))


def test_a_resume_names_the_selection_and_only_the_options_it_was_given(tmp_path):
    assert resumed({"selection": [ADD.id], "backend": "interpreter", "devices": None}, "--no-triage")[2] == (
        "options from batch.json: --backend; from the command line: --no-triage")
    assert resumed({})[2] == "options from batch.json: none; from the command line: none"
    assert batch_resume.stored_selection(parse("--resume").selection, {"selection": [ADD.id]}) == (
        "the selection stored in batch.json (1 op)")
    for given in (["--all"], ["--ops-file", "f"], ["--repos", "builtin"]):
        line = batch_resume.stored_selection(parse("--resume", *given).selection,
                                             {"selection": [ADD.id, MM.id, ADD.id]})
        assert line.startswith("the selection given on the command line (batch.json keeps its 3 ops"), given


# --- where the ops run ---------------------------------------------------------------------------------------
def where(*argv):
    args = parse(*argv)
    return batch_session._where(args.run, args.how)


def test_where_resolves_backend_devices_and_checkouts_and_ops_paths_are_absolute_as_parsed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    backend, devices, checkouts = where("--backend", "cpu", "--devices", " 0, 1,", "--flaggems-dir", f"fg={CHECKOUT}")
    assert (backend.name, devices, checkouts) == ("interpreter", [0, 1], {"fg": CHECKOUT})
    parsed = parse("--ops-path", "mine", "--ops-path", "some.module").run
    assert parsed.ops_paths == (str(tmp_path / "mine"), "some.module")
    backend, devices, checkouts = where("--backend", "interpreter")
    assert devices == backend.check_available(None) and checkouts == {}
    with pytest.raises(UsageError) as info:
        where("--backend", "interpreter", "--devices", "0,x")
    assert str(info.value) == "--devices 0,x: expected comma-separated device indices, e.g. 0,1"
    for devices, twice in (("0,0", "0"), (" 1, 0, 1,", "1")):  # two ops at once on one device
        with pytest.raises(UsageError) as info:
            where("--backend", "interpreter", "--devices", devices)
        assert str(info.value) == f"--devices {devices}: device {twice} given twice"
    with pytest.raises(UsageError, match=r"device\(s\) \[100000\] do not exist here"):
        where("--backend", "interpreter", "--devices", "100000")
    with pytest.raises(UsageError, match="--flaggems-dir 1x=/p: expected"):
        where("--backend", "interpreter", "--flaggems-dir", "1x=/p")
    with pytest.raises(UsageError, match="unknown backend 'nope'"):
        where("--backend", "nope")


# --- a whole batch, in process ---------------------------------------------------------------------------------
def lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_a_batch_runs_records_and_resumes(tmp_path, launcher, capsys, monkeypatch):
    d = tmp_path / "b"
    launcher.plan["crash_op"] = [Step(code=3)]
    code = batch.run_from_args(parse("--backend", "interpreter", "--ops-path", OPS, "--ops", "fp32_op", "crash_op",
                                     "builtin:add", "--devices", "0", "--batch-dir", d, "--dtypes", "fp32"))
    out = lines(capsys)
    assert code == 1
    assert out[:2] == [f"batch dir: {d}", "3 selected, 0 already done, 0 excluded; devices [0]; backend interpreter"]
    assert "FAIL     path:crash_op device=0 2.0 s rows=0  retry after exit 3; exit 3 twice in a row: deterministic, " \
           "not retried further" in out
    assert out[-2:] == [f"done: FAIL 1, PASS 2; summary: {d / 'summary.csv'}", "not passed: path:crash_op"]
    stored = rundir.read_json(d / batchdir.BATCH_JSON)
    ids = ["path:fp32_op@misbehaving", "path:crash_op@misbehaving", "builtin:add@add"]  # as given
    assert {k: v for k, v in stored.items() if k != "request"} == {
        "backend": "interpreter", "devices": [0], "flaggems_dirs": {}, "excluded": {}, "left_out_repos": {},
        "selected": ["path:fp32_op", "path:crash_op", "builtin:add"]}
    assert stored["request"] == {**batch_resume.stored_request(options(dtypes=["fp32"], ops_paths=[str(OPS)]), []),
                                 "selection": ids}
    assert [(x["op"], x["status"]) for x in status_rows(d)] == [("add", "PASS"), ("crash_op", "FAIL"),
                                                                ("fp32_op", "PASS")]
    assert (d / "summary.csv").read_text().count("\n") == 3  # header, add's row, fp32_op's row
    assert (d / batchdir.OWNER_LOCK).read_text() == f"{os.getpid()}\n"

    # The resume: stored options and selection, done ops skipped, leftovers of the dead batch stopped first.
    (d / "ops" / "path__crash_op" / opguard.RUNNING).write_text("{}")
    monkeypatch.setattr(opguard, "stop_leftover", lambda running, grace: {"batch_pid": 5, "pgid": 6})
    launcher.calls.clear()
    launcher.plan["crash_op"] = [Step(code=0, rows=[row()])]
    assert batch.run_from_args(parse("--resume", "--batch-dir", d)) == 0
    out = lines(capsys)
    assert out[:4] == [
        "resume: the selection stored in batch.json (3 ops); options from batch.json: --backend --dtypes --ops-path "
        "--devices --op-timeout; from the command line: none",
        "resume: stopped ops/path__crash_op, still running from the dead batch pid 5 (process group 6), before "
        "reusing its device",
        f"batch dir: {d}", "3 selected, 2 already done, 0 excluded; devices [0]; backend interpreter"]
    assert out[-1] == f"done: PASS 3; summary: {d / 'summary.csv'}"
    assert [c["target"] for c in launcher.calls] == ["crash_op"]
    assert launcher.calls[0]["cmd"][launcher.calls[0]["cmd"].index("--dtypes") + 1] == "fp32"
    assert rundir.read_json(d / batchdir.BATCH_JSON)["request"]["selection"] == ids
    # Without --resume the same dir is refused; a fresh dir under --out is claimed when none is given.
    with pytest.raises(UsageError, match="is an existing batch dir"):
        batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--batch-dir", d))
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--out", tmp_path / "runs")) == 0
    new = Path(lines(capsys)[0].removeprefix("batch dir: "))
    assert new.parent == tmp_path / "runs" and new.name.startswith("batch_") and (new / "ops_status.csv").is_file()


def test_a_resumed_batch_with_a_new_selection_runs_it_and_lists_exclusions(tmp_path, launcher, capsys):
    d = tmp_path / "b"
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--devices", "0",
                                     "--batch-dir", d)) == 0
    capsys.readouterr()
    launcher.calls.clear()
    launcher.waits.clear()
    launcher.plan["hang_op"] = [Step(code=None)]
    # (the real --ops-path probe imports torch within the --op-timeout: ample on a busy machine)
    assert batch.run_from_args(parse("--resume", "--batch-dir", d, "--ops-path", OPS, "--all", "--repos", "path",
                                     "--op-timeout", "60")) == 1
    out = lines(capsys)
    assert out[0] == ("resume: the selection given on the command line (batch.json keeps its 1 ops, and adds any "
                      "new: a plain --resume runs those not done); options from batch.json: --backend --devices; "
                      "from the command line: --ops-path --op-timeout")
    n = len([e for e in selection.all_entries([str(OPS)], {}) if e.repo == "path"])
    assert out[2] == f"{n - 1} selected, 0 already done, 1 excluded; devices [0]; backend interpreter"
    assert out[3] == "  excluded path:skip_op: skip mark: not meaningful on this backend"
    assert "not passed: path:hang_op" in out[-1] and "path:fp32_op" not in out[-1]
    assert {x["op"]: x["status"] for x in status_rows(d)}["hang_op"] == "TIMEOUT"
    assert {w[1] for w in launcher.waits} == {60.0}  # the --op-timeout given again
    assert rundir.read_json(d / batchdir.BATCH_JSON)["excluded"] == {"path:skip_op": "skip mark: not meaningful on "
                                                                                 "this backend"}


def test_failing_or_timing_out_upstream_too_is_listed_not_counted_and_kept_by_a_resume(tmp_path, launcher, capsys):
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=1)]
    launcher.plan["benchmark/test_triage.py::test_broken_upstream"] = [Step(code=1, log="E   boom\n")]
    launcher.plan["flaggems:ours_only@triage"] = [Step(code=None)]
    launcher.plan["benchmark/test_triage.py::test_ours_only"] = [Step(code=None)]
    d = tmp_path / "b"
    code = batch.run_from_args(parse("--backend", "interpreter", "--flaggems-dir", f"flaggems={CHECKOUT}", "--ops",
                                     "flaggems:ours_only", "flaggems:broken_upstream", "--devices", "0",
                                     "--op-timeout", "30", "--batch-dir", d))
    out = lines(capsys)
    assert code == 0
    assert out[-2:] == [f"done: FAIL_UPSTREAM 1, TIMEOUT_UPSTREAM 1; summary: {d / 'summary.csv'}",
                        "failing or timing out upstream too (not counted as ours; see their notes): "
                        "flaggems:broken_upstream, flaggems:ours_only"]
    # Both verdicts settled: a resume reruns neither, though upstream would pass now.
    for op in ("broken_upstream", "ours_only"):
        launcher.plan[f"flaggems:{op}@triage"] = [Step(code=1)]
        launcher.plan[f"benchmark/test_triage.py::test_{op}"] = [Step(code=0)]
    launcher.calls.clear()
    assert batch.run_from_args(parse("--resume", "--batch-dir", d)) == 0
    assert "2 selected, 2 already done" in lines(capsys)[3] and launcher.calls == []
    # A longer budget than the one upstream timed out under reopens the timeout, and only it.
    code = batch.run_from_args(parse("--resume", "--batch-dir", d, "--op-timeout", "60"))
    assert code == 1 and lines(capsys)[-2] == "not passed: flaggems:ours_only"
    assert {x["op"]: x["status"] for x in status_rows(d)} == {"broken_upstream": "FAIL_UPSTREAM", "ours_only": "FAIL"}


def test_a_skip_is_done_and_counts_as_passed(tmp_path, launcher, capsys):
    launcher.plan["add"] = [Step(rows=[row(status="SKIPPED", error="x")])]
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "mm", "--devices", "0",
                                     "--batch-dir", tmp_path / "b")) == 0
    assert lines(capsys)[-1] == f"done: PASS 1, SKIP 1; summary: {tmp_path / 'b' / 'summary.csv'}"


def test_a_selected_op_that_never_got_a_status_row_is_not_passed_and_fails_the_batch(tmp_path, launcher,
                                                                                      monkeypatch, capsys):
    def loses_the_last(self, todo, on_done):  # an executor whose device thread never reported its last op
        for entry in todo[:-1]:
            on_done(self.run_op(entry, 0))

    monkeypatch.setattr(batch.Batch, "run", loses_the_last)
    d = tmp_path / "b"
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "mm", "--devices", "0",
                                     "--batch-dir", d)) == 1
    assert lines(capsys)[-2:] == [f"done: PASS 1, no status row 1; summary: {d / 'summary.csv'}",
                                  "not passed: builtin:mm (no status row)"]


def test_usage_errors_before_anything_runs(tmp_path, launcher, monkeypatch, capsys):
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError) as info:
        batch.run_from_args(parse("--resume", "--batch-dir", tmp_path / "plain"))
    assert str(info.value) == f"--resume --batch-dir {tmp_path / 'plain'}: not a batch dir (it has no batch.json)"
    for argv in (["--backend", "interpreter", "--ops", "add"], []):  # with nothing selected, on no accelerator
        with pytest.raises(UsageError) as info:
            batch.run_from_args(parse("--resume", *argv))
        assert str(info.value) == "--resume needs --batch-dir (the batch dir to resume)"
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / batchdir.BATCH_JSON).write_text(json.dumps({"request": {"plan": {}}}))
    with pytest.raises(UsageError, match="is a corpus A/B"):
        batch.run_from_args(parse("--resume", "--batch-dir", tmp_path / "ab"))
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("ray", "submitit")
                        else real(name, *a))
    for executor, package in (("ray", "ray"), ("slurm", "submitit")):
        with pytest.raises(UsageError) as info:
            batch.run_from_args(parse("--executor", executor, "--summarize", tmp_path))
        assert str(info.value) == (f"--executor {executor} needs the {package} package in this environment "
                                   f"(pip install {package})")
    assert launcher.calls == [] and sorted(p.name for p in (tmp_path / "ab").iterdir()) == [".owner", "batch.json"]
    assert batch.run_from_args(parse("--summarize", tmp_path / "ab")) == 0
    assert lines(capsys) == [f"summary: {tmp_path / 'ab' / 'summary.csv'}"]


def test_slurm_absent_is_refused_before_the_batch_dir_is_made(tmp_path, launcher, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "submitit"
                        else real(name, *a))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match=r"--executor slurm: no Slurm here \(sbatch, squeue, scancel not found"):
        batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--executor", "slurm",
                                  "--batch-dir", tmp_path / "b"))
    assert not (tmp_path / "b").exists() and launcher.calls == []


def test_the_executor_option_picks_who_runs_the_ops(tmp_path, launcher, monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in ("ray", "submitit")
                        else real(name, *a))
    seen = []

    def ray_run(runner, todo, on_done, address, shard):
        seen.append(("ray", address, shard(ADD)))
        runner.run(todo, on_done)

    def slurm_run(runner, todo, on_done, params, shard):
        seen.append(("slurm", params, shard(ADD)))
        runner.run(todo, on_done)

    monkeypatch.setattr(ray_executor, "run", ray_run)
    monkeypatch.setattr(slurm_executor, "require_slurm", lambda: None)
    monkeypatch.setattr(slurm_executor, "run", slurm_run)
    common = ("--backend", "interpreter", "--ops", "add", "--devices", "0")
    assert batch.run_from_args(parse(*common, "--executor", "ray", "--ray-address", "h:1",
                                     "--batch-dir", tmp_path / "r")) == 0
    assert batch.run_from_args(parse(*common, "--executor", "slurm", "--slurm-param", "partition=p",
                                     "--op-timeout", "60", "--batch-dir", tmp_path / "s")) == 0
    assert seen == [("ray", "h:1", 0), ("slurm", {"timeout_min": 10, "slurm_partition": "p"}, 0)]
    assert [c["target"] for c in launcher.calls] == ["add", "add"]


def test_an_interrupted_batch_exits_with_its_signal_and_keeps_a_summary(tmp_path, launcher, monkeypatch, capsys):
    before = signal.getsignal(signal.SIGTERM)

    def interrupted(self, todo, on_done):
        on_done(self.run_op(todo[0], 0))
        raise KeyboardInterrupt

    def terminated(self, todo, on_done):
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)

    monkeypatch.setattr(batch.Batch, "run", interrupted)
    common = ("--backend", "interpreter", "--ops", "add", "mm", "--devices", "0")
    assert batch.run_from_args(parse(*common, "--batch-dir", tmp_path / "a")) == 128 + signal.SIGINT
    out = lines(capsys)
    assert out[-3:] == ["", f"interrupted (SIGINT): every running op was killed; resume with --resume --batch-dir "
                            f"{tmp_path / 'a'}", f"summary: {tmp_path / 'a' / 'summary.csv'}"]
    assert (tmp_path / "a" / "summary.csv").read_text().count("\n") == 2 and signal.getsignal(signal.SIGTERM) == before
    monkeypatch.setattr(batch.Batch, "run", terminated)
    assert batch.run_from_args(parse(*common, "--batch-dir", tmp_path / "t")) == 128 + signal.SIGTERM
    assert "interrupted (SIGTERM): every running op was killed" in lines(capsys)[-2]
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_command_lines_options_reach_the_ops_and_batch_json(tmp_path, launcher, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("{}\n")
    launcher.plan["flaggems:broken_upstream@triage"] = [Step(code=1)]
    code = batch.run_from_args(parse(
        "--backend", "interpreter", "--flaggems-dir", f"flaggems={CHECKOUT}", "--ops", "flaggems:broken_upstream",
        "--devices", "0", "--batch-dir", "b", "--shapes", "s.yaml", "--level", "comprehensive", "--flagtune", "1",
        "--libtuner-cache", "user", "--no-triage", "--dtypes", "fp16"))
    assert code == 1  # FAIL, ours: --no-triage
    assert all(c["cmd"][2] == "harness" for c in launcher.calls)
    cmd = launcher.calls[0]["cmd"]
    assert [cmd[cmd.index(flag) + 1] for flag in ("--shapes", "--level", "--flagtune", "--libtuner-cache")] == [
        str(tmp_path / "s.yaml"), "comprehensive", "1", "user"]
    request = rundir.read_json(tmp_path / "b" / batchdir.BATCH_JSON)["request"]
    assert {k: request[k] for k in ("shapes", "level", "flagtune", "libtuner_cache", "triage", "replay_root")} == {
        "shapes": str(tmp_path / "s.yaml"), "level": "comprehensive", "flagtune": "1", "libtuner_cache": "user",
        "triage": False, "replay_root": None}
    # A replay batch: each op from the earlier batch's PASSed run dir (a relative --replay-root resolved).
    capsys.readouterr()
    launcher.calls.clear()
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--devices", "0",
                                     "--batch-dir", "first")) == 0
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--devices", "0",
                                     "--batch-dir", "again", "--replay-root", "first")) == 0
    assert launcher.calls[-1]["cmd"][3:5] == ["replay", str(tmp_path / "first/ops/builtin__add/attempt1/run")]
    assert rundir.read_json(tmp_path / "again" / batchdir.BATCH_JSON)["request"]["replay_root"] == str(
        tmp_path / "first")


def test_a_batch_narrows_dtypes_to_what_its_ops_take(tmp_path, launcher, capsys):
    launcher.plan["fp32_op"] = [Step(code=65), Step(code=0, rows=[row()])]
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops-path", OPS, "--ops", "fp32_op", "--devices",
                                     "0", "--dtypes", "fp16,fp32", "--batch-dir", tmp_path / "b")) == 0
    assert status_rows(tmp_path / "b")[0]["notes"] == "dtype fallback fp16,fp32 -> fp32"


def test_a_resume_of_a_batch_json_without_a_request_is_refused_naming_the_file_and_the_field(tmp_path, launcher):
    # A batch writes its request with its first batch.json: one without it is no batch's record, and a
    # resume that took the command line alone would run whatever this host detects.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / batchdir.BATCH_JSON).write_text("{}")
    with pytest.raises(UsageError) as info:
        batch.run_from_args(parse("--resume", "--batch-dir", tmp_path / "b", "--backend", "interpreter", "--ops", "add",
                                  "--devices", "0"))
    assert str(info.value).startswith(f"--resume: {tmp_path / 'b' / 'batch.json'} is corrupt: it has no 'request' ")
    assert launcher.calls == []


@dataclasses.dataclass(frozen=True)
class FlavourOptions(batch.Options):
    flavour: str = ""


class FlavourBatch(batch.Batch):
    """Another job on the batch machinery, as harness.sessions.corpus_ab's: its own options, stored
    options, dir prefix and request fields."""

    OPTIONS = FlavourOptions

    def __init__(self, *args):
        super().__init__(*args)
        type(self).last = self

    @classmethod
    def prepare(cls, args, stored, run):
        return {"flavour": stored.get("flavour", "plain") + "!"}, run, None

    @classmethod
    def dir_prefix(cls, extra):
        return "flavour_" + extra["flavour"].rstrip("!")


def test_a_runner_class_brings_its_options_dir_prefix_and_stored_fields(tmp_path, launcher, capsys):
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "--devices", "0", "--out", tmp_path),
                               FlavourBatch) == 0
    d = Path(lines(capsys)[0].removeprefix("batch dir: "))
    assert d.parent == tmp_path and d.name.startswith("flavour_plain_")
    assert rundir.read_json(d / batchdir.BATCH_JSON)["request"]["flavour"] == "plain!"
    assert FlavourBatch.last.opts.flavour == "plain!"
    assert batch.run_from_args(parse("--resume", "--batch-dir", d, "--op-timeout", "9", "--ops", "mm"),
                               FlavourBatch) == 0
    assert lines(capsys)[0].endswith("options from batch.json: --backend --devices; from the command line: "
                                     "--op-timeout")
    assert rundir.read_json(d / batchdir.BATCH_JSON)["request"]["flavour"] == "plain!!"


def test_an_op_command_carries_the_batch_options_back_to_the_cli(tmp_path):
    opts = dict(backend="interpreter", devices=[0, 1], shapes="/s.yaml", ops_paths=["/ops"], level="comprehensive",
                flagtune="1", libtuner_cache="user", flaggems_dirs={"flaggems": "/fg"})
    r = runner_for(tmp_path, **opts)
    ns = cli.build_parser().parse_args(r._command(ADD, 1, ["fp16"], tmp_path / "a1" / "run"))
    assert (ns.command, ns.op, ns.backend, ns.device, ns.dtypes, ns.shapes, ns.ops_paths, ns.named_run_dir, ns.out,
            ns.color) == ("record", "add", "interpreter", 1, ["fp16"], Path("/s.yaml"), ["/ops"],
                          tmp_path / "a1" / "run", None, "never")
    assert (ns.flaggems_dirs, ns.level, ns.flagtune, ns.libtuner_cache) == (None, None, None, None)
    ns = cli.build_parser().parse_args(r._command(FG, 0, None, tmp_path / "a2"))
    assert (ns.op, ns.flaggems_dirs, ns.level, ns.flagtune, ns.libtuner_cache, ns.dtypes, ns.shapes) == (
        "flaggems:broken_upstream@triage", ["flaggems=/fg"], "comprehensive", "1", "user", None, Path("/s.yaml"))
    r = runner_for(tmp_path, **{**opts, "shapes": None})
    assert cli.build_parser().parse_args(r._command(ADD, 1, None, tmp_path / "a1")).shapes is None
    earlier = tmp_path / "earlier"
    r = runner_for(tmp_path, **opts, replay_root=earlier)
    r.replay_sources = {FG.id: StatusRow(FG.op, FG.repo, FG.op_file, "PASS", run_dir="ops/x/attempt1/run")}
    ns = cli.build_parser().parse_args(r._command(FG, 1, ["fp16"], tmp_path / "a3" / "run"))
    assert (ns.command, ns.run_dir, ns.device, ns.named_run_dir, ns.color, ns.ops_paths, ns.flaggems_dirs) == (
        "replay", earlier / "ops/x/attempt1/run", 1, tmp_path / "a3" / "run", "never", ["/ops"], ["flaggems=/fg"])
    assert (ns.backend, ns.dtypes, ns.level) == (None, None, None)  # a replay keeps the recorded ones


class HookBatch(batch.Batch):
    """A job whose attempts decide by their own files (as a corpus A/B's do): the hooks get the dirs."""

    COLUMNS = (*batchdir.STATUS_COLUMNS, "verdict")

    def _run_dir(self, entry, attempt_dir):
        return attempt_dir / "job"

    def _wrote(self, run_dir):
        return run_dir.is_dir()

    def _passed(self, code, run_dir):
        return (run_dir / "ok").is_file()

    def _rejected(self, code, run_dir):
        return (run_dir / "rejected").is_file()

    def _stopped_in(self, run_dir):
        return run_dir / "inner"

    def _facts(self, run_dir):
        return {**batch_facts.run_facts(run_dir), "verdict": run_dir.name}

    def _columns(self, facts):
        return {"verdict": facts["verdict"]}


def test_a_jobs_hooks_decide_its_status_from_its_attempt_dirs(tmp_path, launcher, monkeypatch):
    r = HookBatch(tmp_path, options(dtypes=["fp16"], op_timeout=20.0), {})
    launcher.runner = r
    op_dir = batchdir.op_dir(tmp_path, ADD.key)

    def mark(name):  # the running attempt leaves file `name` in its job dir
        def leave():
            job = op_dir / f"attempt{len(launcher.calls)}" / "job"
            job.mkdir(parents=True, exist_ok=True)
            (job / name).write_text("")
        return leave

    launcher.plan["add"] = [Step(code=7, during=mark("rejected")), Step(code=7, during=mark("ok"))]
    got = r.run_op(ADD, 0)
    assert (got.status, got.attempts, got.extra["verdict"], got.run_dir) == (
        "PASS", 2, "job", "ops/builtin__add/attempt2/job")
    assert got.notes == "dtype rescue: fp16 rejected, ran without a dtype filter"
    assert status_rows(tmp_path)[0]["verdict"] == "job"
    write_run(op_dir / "attempt1" / "job", [row()], {"running_case": "fp16 [4]"}, name="inner")
    launcher.plan["add"] = [Step(code=None)]
    got = r.run_op(ADD, 0)
    assert got.notes == "timeout after 20 s during case fp16 [4] (killed, not retried)"
    assert (op_dir / "attempt1" / "job" / "inner" / rundir.RUN_LOG).read_text().endswith(
        "killed by the batch's --op-timeout: timeout after 20 s during case fp16 [4]\n")


class StoppedRunner:
    """A batch runner whose run is stopped at once and whose summary is broken."""

    dir = Path("/nonexistent/batch")
    events = queue.Queue()  # no op's row left unshown

    def run(self, todo, on_done):
        raise KeyboardInterrupt

    def summarize(self):
        raise TypeError("interval [0.0, inf]")


def test_a_broken_summary_does_not_hide_the_exit_code_of_a_stop(capsys):
    args = types.SimpleNamespace(executor="local")
    assert batch_session._run(StoppedRunner(), [], [], args) == 128 + signal.SIGINT
    out = capsys.readouterr().out
    assert "interrupted (SIGINT)" in out and "summary failed: TypeError: interval [0.0, inf]" in out


class FinishedRunner:
    """A batch runner with nothing left to run; its statuses are in `dir`'s ops_status.csv."""

    def __init__(self, batch_dir: Path):
        self.dir = batch_dir

    def run(self, todo, on_done):
        pass

    def summarize(self):
        return "summary: summary.csv"


def test_the_exit_code_counts_our_failures_and_lists_upstreams_apart(tmp_path, capsys):
    def status_row(entry, status):
        return {"op": entry.op, "repo": entry.repo, "op_file": entry.op_file, "status": status}

    def write_statuses(*rows):
        with open(tmp_path / "ops_status.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=batchdir.STATUS_COLUMNS, restval="")
            writer.writeheader()
            writer.writerows(rows)

    args = types.SimpleNamespace(executor="local")
    slow = Entry("flaggems", "slow_upstream", "triage", "benchmark/test_triage.py")
    write_statuses(status_row(ADD, "FAIL"), status_row(MM, "FAIL"), status_row(FG, "FAIL_UPSTREAM"),
                   status_row(slow, "TIMEOUT_UPSTREAM"))
    assert batch_session._run(FinishedRunner(tmp_path), [], [ADD, MM, FG, slow], args) == 1
    out = capsys.readouterr().out
    assert "done: FAIL 2, FAIL_UPSTREAM 1, TIMEOUT_UPSTREAM 1; summary: summary.csv" in out
    assert "not passed: builtin:add, builtin:mm\n" in out
    assert "(not counted as ours; see their notes): flaggems:broken_upstream, flaggems:slow_upstream\n" in out
    write_statuses(status_row(ADD, "PASS"), status_row(MM, "TIMEOUT"), status_row(FG, "TIMEOUT_UPSTREAM"))
    assert batch_session._run(FinishedRunner(tmp_path), [], [ADD, MM, FG], args) == 1
    assert "not passed: builtin:mm\n" in capsys.readouterr().out
    write_statuses(status_row(ADD, "PASS"), status_row(MM, "SKIP"), status_row(FG, "TIMEOUT_UPSTREAM"))
    assert batch_session._run(FinishedRunner(tmp_path), [], [ADD, MM, FG], args) == 0
    assert "not passed" not in capsys.readouterr().out


def test_a_resume_given_its_own_selection_keeps_every_op_the_batch_had(tmp_path, launcher, capsys):
    d = tmp_path / "b"
    assert batch.run_from_args(parse("--backend", "interpreter", "--ops", "add", "mm", "--devices", "0",
                                     "--batch-dir", d)) == 0
    assert batch.run_from_args(parse("--resume", "--batch-dir", d, "--ops", "mm")) == 0
    stored = json.loads((d / batchdir.BATCH_JSON).read_text())
    assert stored["request"]["selection"] == [MM.id, ADD.id] and stored["selected"] == [MM.key, ADD.key]
    capsys.readouterr()
    assert batch.run_from_args(parse("--resume", "--batch-dir", d)) == 0
    assert "2 selected, 2 already done" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["{", "[1]", '{"request": [1]}'])
def test_a_resume_of_a_batch_json_that_does_not_read_is_one_line(tmp_path, text):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / batchdir.BATCH_JSON).write_text(text)
    with pytest.raises(UsageError, match=r"--resume: .*batch.json is corrupt"):
        batch.run_from_args(parse("--resume", "--batch-dir", tmp_path / "b"))


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_an_op_timeout_that_is_not_positive_is_refused(value, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--ops", "add", "--op-timeout", value)
    assert exc.value.code == 2 and "--op-timeout: must be > 0" in capsys.readouterr().err


def test_summarize_of_a_dir_that_is_no_batch_is_refused_and_writes_nothing(tmp_path):
    with pytest.raises(UsageError, match="not a batch dir"):
        batch.run_from_args(parse("--summarize", tmp_path))
    assert not list(tmp_path.iterdir())


# --- the timeout's group kill, on real processes ------------------------------------------------------
def test_a_timed_out_op_is_stopped_with_every_process_of_its_group(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_executor, "KILL_GRACE_S", 1)
    runner = runner_for(tmp_path, op_timeout=1.0)
    log = tmp_path / "attempt" / "batch.log"
    log.parent.mkdir()
    with HangingOp(tmp_path, monkeypatch) as hanging:
        op = [sys.executable, "-m", "harness", "record", "add"]  # replaced by the op that hangs
        code, _ = hanging.ended_by_its_timeout(runner, runner._attempt, op, log)
        assert code is None  # timed out
        assert hanging.left() == []
        assert runner.children == {} and not (log.parent / opguard.RUNNING).exists()


@pytest.mark.parametrize("checkout", [False, True])
def test_a_batch_given_no_selection_screens_the_whole_inventory_it_can_see(tmp_path, launcher, capsys, monkeypatch,
                                                                           checkout):
    monkeypatch.setattr(catalog, "load_dismissed", lambda: {"builtin:gelu": "broken here",
                                                                   "flaggems:log_softmax": "broken upstream"})
    d = tmp_path / "b"
    code = batch.run_from_args(parse("--backend", "interpreter", "--devices", "0", "--batch-dir", d,
                                     *(["--flaggems-dir", CHECKOUT] if checkout else [])))
    out = lines(capsys)
    chosen = sorted(json.loads((d / batchdir.BATCH_JSON).read_text())["selected"])
    builtin = ["builtin:add", "builtin:mm", "builtin:rms_norm", "builtin:softmax"]  # gelu dismissed
    theirs = ["flaggems:avg_pool2d", "flaggems:broken_upstream", "flaggems:direct_latency", "flaggems:mm",
              "flaggems:ours_only", "flaggems:own_shapes", "flaggems:scale_nested", "flaggems:softmax",
              "flaggems:sparse_input"]  # log_softmax dismissed, cholesky's skip mark holds
    assert chosen == sorted(builtin + (theirs if checkout else []))
    first = next(line for line in out if not line.startswith("NOTE: inventory_flaggems.csv differs"))
    assert first == (f"no selection given: the whole inventory, {len(chosen)} ops (builtin 4"
                     f"{', flaggems 9' if checkout else ''}); --ops or --ops-file to narrow")
    assert ("NOTE: the whole inventory leaves out the FlagGems inventories flaggems" in "\n".join(out)) != checkout
    assert code == 0 and not any(line.startswith("rough cost") for line in out)  # 13 ops: no cost said


def test_a_large_selection_is_told_its_rough_cost_and_that_a_stop_is_safe(tmp_path, launcher, capsys, monkeypatch):
    monkeypatch.setattr(batch.Batch, "LARGE_SELECTION", 3)
    d = tmp_path / "b"
    assert batch.run_from_args(parse("--backend", "interpreter", "--devices", "0,1", "--batch-dir", d,
                                     "--op-timeout", "600")) == 0
    out = lines(capsys)
    # Among the first lines, before any op runs: the selection, the batch dir, the counts, the cost.
    assert out[2:5] == [f"batch dir: {d}",
                        "5 selected, 0 already done, 0 excluded; devices [0, 1]; backend interpreter",
                        f"rough cost: 5 ops x ~21 s (a typical op on one H200) / 2 devices = ~0.0 h; no op runs past "
                        f"--op-timeout 600 s. Ctrl-C stops it safely; `--resume --batch-dir {d}` carries on where it "
                        "stopped"]


def ray_payload(scratch: Path, op: str, text: str) -> bytes:
    """A Ray task's tar.gz of its scratch batch dir's ops/ (ray_executor._run_remote's), one op dir."""
    import io
    import tarfile

    (scratch / "ops" / op).mkdir(parents=True)
    (scratch / "ops" / op / "ab.json").write_text(json.dumps({"run_dir": f"{scratch}/ops/{op}/A-1", "note": text}))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(scratch / "ops", arcname="ops")
    return buf.getvalue()


def test_a_ray_tasks_op_dir_lands_whole_or_not_at_all(tmp_path, monkeypatch):
    batch_dir, scratch = tmp_path / "batch", tmp_path / "scratch"
    (batch_dir / "ops" / "add").mkdir(parents=True)
    (batch_dir / "ops" / "add" / "left_by_an_earlier_run.json").write_text("{}")
    ray_executor._gather(batch_dir, ray_payload(scratch, "add", "first"), str(scratch))
    # Its paths point into the batch dir, and the op dir is the task's alone (an earlier run's files are gone).
    assert sorted(p.name for p in (batch_dir / "ops" / "add").iterdir()) == ["ab.json"]
    assert json.loads((batch_dir / "ops" / "add" / "ab.json").read_text())["run_dir"] == f"{batch_dir}/ops/add/A-1"
    assert sorted(p.name for p in batch_dir.iterdir()) == ["ops"]  # no staging left
    # Stopped midway (Ctrl-C while its files are rebased): no op dir half written, the one before untouched.
    calls = []

    def stopped(op_dir, old, new):
        calls.append(op_dir)
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_executor, "_rebase", stopped)
    with pytest.raises(KeyboardInterrupt):
        ray_executor._gather(batch_dir, ray_payload(tmp_path / "scratch2", "mul", "second"), str(tmp_path / "scratch2"))
    assert calls and not (batch_dir / "ops" / "mul").exists()
    assert sorted(p.name for p in batch_dir.iterdir()) == ["ops"]
