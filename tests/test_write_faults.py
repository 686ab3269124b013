"""No state without an outcome (issue 47, item 4): a write that fails for good (no space, a file-size
limit, an I/O error) at any point of a run's life ends the run with its outcome recorded (exit 75), or
with no run dir left; never a traceback, never a run dir a replay would call killed. Each write point
of a real record, in the harness process and in its pytest child, is failed in turn through the seam
of tests/resources/write_faults/sitecustomize.py; one real EFBIG comes from RLIMIT_FSIZE."""

import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, harness_env

from harness.core import rundir

SEAM = REPO / "tests" / "resources" / "write_faults"
ERRNOS = ("ENOSPC", "EFBIG", "EIO")


def test_a_failed_write_is_a_write_fault_naming_the_file_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    rundir.atomic_write_json(path, {"rows": 1})
    for code in (errno.EFBIG, errno.EIO):
        def fail(fd, code=code):
            raise OSError(code, os.strerror(code))  # as a write's own error: no file named

        monkeypatch.setattr(os, "fsync", fail)
        with pytest.raises(rundir.WriteFault) as raised:
            rundir.atomic_write_json(path, {"rows": 2})
        assert raised.value.errno == code and raised.value.filename == str(path)
        assert str(raised.value) == f"{os.strerror(code).lower()} writing {path}"
        assert raised.value.reason == f"write failed: {raised.value}"
        assert json.loads(path.read_text()) == {"rows": 1} and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_write_fault_is_found_behind_raw_errors_and_chains():
    assert isinstance(rundir.write_fault(OSError(errno.ENOSPC, "full", "/r/run.log")), rundir.DiskFull)
    big = rundir.write_fault(OSError(errno.EFBIG, "big"), "/r/results.json")
    assert (type(big), big.path, big.errno) == (rundir.WriteFault, Path("/r/results.json"), errno.EFBIG)
    wrapped = RuntimeError("a hook failed")
    wrapped.__context__ = OSError(errno.EIO, "io", "/r/run.json")
    assert rundir.write_fault(wrapped).path == Path("/r/run.json")
    assert rundir.write_fault(OSError(errno.EACCES, "denied", "/r/x")) is None  # not the run's write failing


def _record(out: Path, env: dict, preexec=None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(SEAM), str(REPO), full.get("PYTHONPATH")) if p)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "harness", "record", "add", "--backend", "interpreter", "--out",
                           str(out)], cwd=REPO, env=full, capture_output=True, text=True, timeout=600,
                          preexec_fn=preexec)


def _write_points(tmp_path) -> list[tuple[str, int, str]]:
    """(role, n, file) of each rundir.open_write call of a record that nothing fails: every call of the
    harness process, and of its child the first of each file and the last (its outcome)."""
    log = tmp_path / "writes.log"
    proc = _record(tmp_path / "counted", {"ZL_TEST_WRITE_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The file each call is for: an atomic write's temporary `.NAME.PID-TID.tmp` is NAME's.
    calls = [(role, int(n), re.sub(r"\.\d+-\d+\.tmp$", "", Path(path).name.lstrip(".")))
             for role, n, path in (line.split(" ", 2) for line in log.read_text().splitlines())]
    child = [c for c in calls if c[0] == "child"]
    first = {}
    for call in child:
        first.setdefault(call[2], call)
    points = [c for c in calls if c[0] == "parent"] + sorted(set(first.values()) | {child[-1]})
    assert {name for _, _, name in points} >= {"shapes.yaml", "run.json", "run.json.lock", "space_reserve",
                                                "run.log", "results.json", "meta.json", "add.json"}, calls
    return points


@pytest.mark.e2e
def test_a_write_failing_at_any_point_of_a_run_leaves_no_run_without_its_outcome(tmp_path):
    points = _write_points(tmp_path)
    for i, (role, n, name) in enumerate(points):
        code = ERRNOS[i % len(ERRNOS)]
        out = tmp_path / f"{role}{n}"
        proc = _record(out, {"ZL_TEST_WRITE_FAULT": f"{role}:{n}:{code}"})
        said = f"{role} write {n} ({name}) failing with {code}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, said
        run_dirs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
        if not run_dirs:  # failed before anything ran: said in one line, and nothing left
            assert proc.returncode == rundir.EXIT_DISK_FULL, said
            assert proc.stderr.strip().splitlines()[-1].startswith("error: "), said
            continue
        [run_dir] = run_dirs
        outcome = json.loads((run_dir / rundir.RUN_JSON).read_text()).get("observed", {}).get("outcome")
        assert outcome is not None and outcome["exit_code"] == proc.returncode, said
        if name != "run.log":  # run.log is the human log: a run whose log stops goes on, and says so
            assert proc.returncode == rundir.EXIT_DISK_FULL and outcome["status"] == "INCOMPLETE", said
        else:
            assert "run.log stops there" in proc.stdout, said
        assert not (run_dir / rundir.RESERVE).exists(), said


@pytest.mark.e2e
def test_a_real_file_size_limit_is_one_line_and_leaves_no_run_dir(tmp_path):
    """RLIMIT_FSIZE below the space a run keeps for its outcome: its write gets EFBIG (SIGXFSZ ignored,
    as Python itself has it), which was a traceback."""
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (rundir.RESERVE_BYTES // 2, rundir.RESERVE_BYTES // 2))

    out = tmp_path / "out"
    proc = _record(out, {}, preexec=limited)
    assert proc.returncode == rundir.EXIT_DISK_FULL, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: file too large writing ") and rundir.RESERVE in line, line
    assert [d for d in out.iterdir() if d.is_dir()] == []


@pytest.mark.e2e
def test_an_ab_whose_step_ends_by_a_failed_write_stops_there_and_exits_so(tmp_path):
    """A step's own write fault (its exit 75) stops the A/B, which reports what completed and exits 75; it
    went on to every next step, each failing alike, and blamed a step (exit 1). The warm workers it no
    longer needs end quietly (a reset socket was a traceback in ab.log)."""
    def limited():  # below the space each step's run keeps for its outcome: A's record fails first
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (rundir.RESERVE_BYTES // 2, rundir.RESERVE_BYTES // 2))

    env = harness_env()
    proc = subprocess.run([sys.executable, "-m", "harness", "ab", "--ops", "softmax", "--backend", "interpreter",
                           "--repeats", "2", "--out", str(tmp_path / "runs")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, preexec_fn=limited)
    assert proc.returncode == rundir.EXIT_DISK_FULL, proc.stdout + proc.stderr
    assert "[1/1 softmax] A records stopped: a write failed in its run dir " in proc.stdout
    [ab_dir] = (tmp_path / "runs").iterdir()
    state = json.loads((ab_dir / "ab.json").read_text())
    assert [s["exit"] for s in state["steps"]] == [rundir.EXIT_DISK_FULL]  # no step after it
    assert "Traceback" not in (ab_dir / "ab.log").read_text() + proc.stderr
    assert (ab_dir / "report.md").read_text().count("INCOMPLETE") == 1


@pytest.mark.e2e
def test_a_batch_whose_ops_status_write_fails_says_so_in_one_line_and_exits_75(tmp_path):
    """A full disk met by a device thread (ops_status.csv) was `RuntimeError: a device thread of the batch
    failed` under three tracebacks, exit 1: the DiskFull named no file, so it was not passed on as one."""
    def batch(d: Path, env: dict) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        full["PYTHONPATH"] = os.pathsep.join(p for p in (str(SEAM), str(REPO), full.get("PYTHONPATH")) if p)
        return subprocess.run([sys.executable, "-m", "harness", "batch", "--ops", "softmax", "--backend", "interpreter",
                               "--op-start", "fresh", "--batch-dir", str(d)], cwd=REPO, env={**full, **env},
                              capture_output=True, text=True, timeout=600)

    d = tmp_path / "faulted"
    proc = batch(d, {"ZL_TEST_WRITE_FAULT": "parent:*:ENOSPC:/.ops_status.csv."})
    assert proc.returncode == rundir.EXIT_DISK_FULL, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: no space left on device writing {d / 'ops_status.csv'}"]


@pytest.mark.e2e
def test_a_batch_whose_op_ends_by_a_failed_write_stops_there_and_exits_75(tmp_path):
    """An op whose run met a file-size limit (exit 75) was a FAIL blamed on the op, retried, and the batch went
    on to every next op, each failing alike (exit 1). It stops now, in one line, and a resume runs the op."""
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (rundir.RESERVE_BYTES // 2, rundir.RESERVE_BYTES // 2))

    env = harness_env()
    d = tmp_path / "batch"
    proc = subprocess.run([sys.executable, "-m", "harness", "batch", "--ops", "softmax", "add", "--backend",
                           "interpreter", "--devices", "0", "--batch-dir", str(d)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, preexec_fn=limited)
    assert proc.returncode == rundir.EXIT_DISK_FULL, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert re.fullmatch(rf"error: builtin:(softmax|add) stopped: a write failed in its run dir {d}/ops/\S+/attempt1/"
                        rf"\S+ \(exit 75\)", line), line
    assert not (d / "ops_status.csv").exists()  # no op done: each left for a resume, none marked FAIL
    assert len(list((d / "ops").iterdir())) == 1  # the next op never started
