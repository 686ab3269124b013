"""A corpus A/B in chunks (`--chunk K` with batch options): each device's ops K at a time as one A/B, each op
keeping its own A/B dir, status row and report; a chunk past its timeout and a kill -9 inside a chunk lose no
completed step. Real processes on the interpreter (the chunk's hosts themselves: tests/test_chunks.py)."""

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, harness_env, load, pids_mentioning, wait_for

from harness.core import abstate

CHUNK_OPS = REPO / "tests" / "resources" / "chunk_ops"


def _host(step_dir: Path) -> dict | None:
    (run_dir,) = step_dir.iterdir()
    return load(run_dir / "run.json")["observed"].get("measuring_host")


# --- a corpus A/B's chunks -----------------------------------------------------------------------
BATCH_OPS = REPO / "tests" / "resources" / "batch_ops"


@pytest.fixture
def corpus(tmp_path):
    """`python -m harness ab ARGS` (a corpus A/B in chunks of 2) in its own session; killed at teardown if
    a failed test left it running."""
    started = []

    def start(*args, chunked: bool = True) -> subprocess.Popen:
        env = harness_env()
        base = ["--backend", "interpreter", "--repeats", "2", "--dtypes", "fp32", "--devices", "0", "--chunk", "2",
                "--ops-path", str(BATCH_OPS), "--ops-path", str(CHUNK_OPS), "--out", str(tmp_path / "out")]
        started.append(subprocess.Popen(
            [sys.executable, "-m", "harness", "ab", *(base if chunked else []), *map(str, args)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)


def _statuses(batch_dir: Path) -> dict[str, dict]:
    with open(batch_dir / "ops_status.csv", newline="") as f:
        return {r["op"]: r for r in csv.DictReader(f)}


def _chunk_ab(batch_dir: Path) -> list[Path]:
    return sorted((batch_dir / "chunks").glob("chunk_*/ab"))


@pytest.mark.e2e
def test_a_corpus_chunk_is_one_ab_whose_ops_each_keep_their_own_dir_row_and_report(corpus, tmp_path):
    proc = corpus("--ops", "builtin:add", "fp32_op", "--b-env", "ZL_SIDE=b")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    d = next((tmp_path / "out").iterdir())
    (chunk,) = _chunk_ab(d)
    st = _statuses(d)
    for op, key in (("add", "builtin__add"), ("fp32_op", "path__fp32_op")):
        row = st[op]
        assert row["status"] == "PASS" and row["attempts"] == "1" and row["verdicts"] == "n/a 2"
        assert row["notes"] == f"timed with 1 other ops in chunks/{chunk.parent.name}"
        own = d / row["run_dir"]
        assert own.parent == d / "ops" / key / "attempt1"
        state = load(own / "ab.json")  # a single-op A/B's, its steps in the chunk's dir
        assert state["plan"]["ops"] == [load(chunk / "ab.json")["plan"]["ops"][0 if op == "add" else 1]]
        assert state["complete"] and state["chunk"] == str(chunk) and len(state["steps"]) == 6
        assert all(s["run_dir"].startswith(str(chunk)) for s in state["steps"])
        assert len(load(own / "report.json")["rows"]) == 2
    hosts = {(op, step): _host(chunk / op / step)["pid"] for op in ("add", "fp32_op") for step in ("A-1", "B-2")}
    assert hosts[("add", "A-1")] == hosts[("fp32_op", "A-1")] != hosts[("add", "B-2")] == hosts[("fp32_op", "B-2")]
    assert load(d / "report.json")["summary"]["ops_compared"] == 2  # the corpus report reads each op's own dir


OP_TIMEOUT = 120  # fp32_op's own A/B: ~20 s alone, over 45 s on a loaded 2-core host (75 s left too thin a margin)


@pytest.mark.e2e
@pytest.mark.parametrize("records", ["first", "beside", "together"])
def test_an_op_past_its_timeout_in_a_chunk_times_out_there_and_the_others_go_on_in_their_own_jobs(corpus, tmp_path,
                                                                                                  records):
    # fp32_op's record and passes complete in the chunk, hang_op's record hangs: the chunk is ended as hang_op's
    # steps pass --op-timeout (not at the chunk's own bound), hang_op is TIMEOUT there, not run again;
    # fp32_op's own job takes over its steps and times its repeats. Together (--record-jobs 2), fp32_op's steps
    # beside the hung record wait for the device it holds: not charged to fp32_op. Together is a corpus A/B's default.
    how = {"first": ("--chunk-records", "first", "--record-jobs", "1"), "beside": ("--chunk-records", "beside"),
           "together": ()}[records]
    proc = corpus("--ops", "fp32_op", "hang_op", "--op-timeout", str(OP_TIMEOUT), *how)
    out, _ = proc.communicate(timeout=OP_TIMEOUT * 3 + 240)
    assert proc.returncode == 1, out
    d = next((tmp_path / "out").iterdir())
    st = _statuses(d)
    assert st["fp32_op"]["status"] == "PASS" and st["fp32_op"]["verdicts"] == "n/a 2", (st, out)
    own = load(d / st["fp32_op"]["run_dir"] / "ab.json")
    # Its record and passes, and the repeats it completed beside hang_op's record before that hung holding the device.
    taken_over = [s["step"].split("/")[1] for s in own["steps"] if s.get("taken_over")]
    if records == "together":  # no repeat ran in the chunk: its records had not all ended
        assert set(taken_over) <= {"A-record", "B-passes"}
    else:
        assert taken_over[:2] == ["A-record", "B-passes"] and set(taken_over[2:]) <= {"A-1", "B-1", "A-2", "B-2"}
    (chunk,) = _chunk_ab(d)
    assert st["hang_op"]["status"] == "TIMEOUT" and st["hang_op"]["notes"].startswith(
        f"timeout after {OP_TIMEOUT} s during case fp32-300 in {chunk.parent.relative_to(d)} (killed, not retried)")
    assert st["hang_op"]["run_dir"].endswith(f"hang_op/attempt1/{Path(st['hang_op']['run_dir']).name}")
    assert sorted(p.name for p in (d / Path(st["hang_op"]["run_dir"]).parent.parent).glob("attempt*")) == ["attempt1"]
    # Ended for hang_op: its record step ran about --op-timeout, not the chunk's whole timeout.
    # Running as the chunk's A/B stopped it (beside fp32_op's repeats: there, or ended by the kill just before,
    # fp32_op's repeat under way waiting for the device it held).
    state = load(chunk / "ab.json")
    record = next(s for s in (*abstate.running_steps(state), *state["steps"]) if s["what"].startswith("[2/2 hang_op]"))
    assert record["what"] == "[2/2 hang_op] A records"
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))


@pytest.mark.e2e
def test_a_resume_that_lands_inside_a_chunk_runs_none_of_its_completed_steps_again(corpus, tmp_path):
    proc = corpus("--ops", "fp32_op", "builtin:add")
    d = _batch_dir_of(tmp_path / "out")

    def add_timed_once() -> bool:  # the chunk is in its repeats: both records done, add's A-1 too
        for view in d.glob("ops/builtin__add/attempt1/ab_*/ab.json"):
            try:
                return any(s["step"].endswith("/A-1") for s in load(view)["steps"])
            except (OSError, ValueError):
                return False
        return False

    assert wait_for(add_timed_once, 400)
    os.kill(proc.pid, signal.SIGKILL)  # the chunk's guard sees its batch go and ends the chunk's A/B
    proc.communicate(timeout=60)
    assert wait_for(lambda: not pids_mentioning(str(d)), 60), pids_mentioning(str(d))
    before = {op: [s["step"] for s in load(next(d.glob(f"ops/{key}/attempt1/ab_*/ab.json")))["steps"]]
              for op, key in (("add", "builtin__add"), ("fp32_op", "path__fp32_op"))}
    resumed = corpus("--resume", "--batch-dir", d, chunked=False)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    st = _statuses(d)
    assert {r["status"] for r in st.values()} == {"PASS"}
    first, second = _chunk_ab(d)
    steps = load(second / "ab.json")["steps"]
    taken = [s["step"] for s in steps if s.get("taken_over")]
    assert sorted(taken) == sorted(step for steps_before in before.values() for step in steps_before)
    ran = [s["step"] for s in steps if not s.get("taken_over")]
    assert not set(ran) & set(taken) and "add/A-1" not in ran


def _batch_dir_of(out_dir: Path) -> Path:
    assert wait_for(lambda: out_dir.is_dir() and any(out_dir.iterdir()), 120)
    return next(out_dir.iterdir())
