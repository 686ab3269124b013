"""The A/B's warm workers (harness.core.forkserver) on the interpreter backend, which takes the same
worker path as a GPU: steps forked, one-off passes once per side, and every fault (Ctrl-C, SIGTERM,
kill -9 of the A/B, a worker that dies) leaving no process and no cache behind."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, exits_of, harness_env, load, pids_mentioning, wait_for

from harness.sessions import ab

pytestmark = pytest.mark.e2e

OPS = REPO / "tests" / "resources" / "batch_ops"
STEPS = ("A-record", "A-1", "B-1", "A-2", "B-2")  # an A/B of 2 repeats, in the order it runs them


def _ab(tmp_path: Path, *args, slow_s: float | None = None, slow_first_only: bool = False) -> subprocess.Popen:
    """`python -m harness ab ARGS --repeats 2` on the interpreter, in its own session; its steps forked
    by one warm worker a side unless ARGS say otherwise (prewarmed is the default). slow_first_only: only
    the first step's process of slow_op waits slow_s."""
    if "--step-start" not in args:
        args = (*args, "--step-start", "fork")
    env = harness_env()
    env["ZL_TEST_STATE_DIR"] = str(tmp_path)
    if slow_s is not None:
        env["ZL_TEST_SLOW_S"] = str(slow_s)
    if slow_first_only:
        env["ZL_TEST_SLOW_FIRST_ONLY"] = "1"
    return subprocess.Popen([sys.executable, "-m", "harness", "ab", "--backend", "interpreter", "--repeats", "2",
                             "--dtypes", "fp32", "--out", str(tmp_path / "out"), *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _ab_dir(tmp_path: Path) -> Path:
    assert wait_for(lambda: list((tmp_path / "out").glob("ab_*/ab.json")), 120)
    return next((tmp_path / "out").glob("ab_*"))


def _spec(step_dir: Path) -> dict:
    return load(next(step_dir.glob("*/run.json")))["spec"]


def _started(tmp_path: Path, count: int = 1) -> list[int]:
    """The pids of the slow op's runs that reached their first case (harness child processes)."""
    assert wait_for(lambda: len(list(tmp_path.glob("slow_started_*"))) >= count, 300)
    return sorted((int(p.name.rsplit("_", 1)[1]) for p in tmp_path.glob("slow_started_*")),
                  key=lambda pid: (tmp_path / f"slow_started_{pid}").stat().st_mtime)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _leftovers(ab_dir: Path) -> list[int]:
    """Processes of this A/B: its steps name its dir, its workers the root of its side caches."""
    roots = {str(Path(c["dir"]).parent) for c in load(ab_dir / "ab.json").get("triton_caches", {}).values()}
    return sorted({pid for text in [str(ab_dir), *roots] for pid in pids_mentioning(text)})


@pytest.mark.parametrize("start, passes", [("fork", "once"), ("fresh", "every"), ("prewarmed", "once")])
def test_steps_start_as_asked_and_one_off_passes_run_where_asked(tmp_path, start, passes):
    proc = _ab(tmp_path, "--ops", "add", "--step-start", start, "--step-passes", passes)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    d = _ab_dir(tmp_path)
    log = (d / "ab.log").read_text()
    steps = ("A-record", "B-passes", *STEPS[1:]) if passes == "once" else STEPS
    assert sorted(p.name for p in (d / "add").iterdir()) == sorted(steps)
    # fork: one worker per side forks every step; prewarmed: a worker of its own forks each step (all
    # begun as the op starts); fresh: a process per step, no worker.
    forked_by = re.findall(r"\(forked by worker (\d+)\)", log)
    assert len(forked_by) == (0 if start == "fresh" else len(steps))
    assert len(set(forked_by)) == {"fork": 2, "fresh": 0, "prewarmed": len(steps)}[start]
    assert log.count("-m harness.worker ") == len(set(forked_by))
    kinds = {step: _spec(d / "add" / step)["only"] for step in steps}
    # once: A's record and B's passes step, before the repeats, carry IR and attribution (what the reports
    # read) and time at a token budget (no verdict uses their timings); every repeat times only.
    assert kinds == ({"A-record": "passes", "B-passes": "passes", "A-1": "timing", "B-1": "timing", "A-2": "timing",
                      "B-2": "timing"} if passes == "once" else dict.fromkeys(STEPS))
    recorded = [(s["side"], s.get("passes", False)) for s in load(d / "ab.json")["steps"]]
    assert recorded == ([("A", True), ("B", True), ("A", False), ("B", False), ("A", False), ("B", False)]
                        if passes == "once" else [("A", False)] + [("A", False), ("B", False)] * 2)
    # The verdicts stand on the repeats alone: each row has 2 latencies a side, not 3.
    assert {len(r["a_ms"]) for r in load(d / "report.json")["rows"]} == {2}
    assert load(d / "ab.json")["plan"]["step_start"] == start
    assert load(d / "report.json")["rows"]
    assert _leftovers(d) == []


def test_a_plan_refuses_an_unknown_step_start():
    with pytest.raises(ab.PlanError, match="'step_start' must be one of fork, fresh, prewarmed"):
        ab.plan_from_data({"ops": ["add"], "step_start": "spawn"}, "plan.yaml")


@pytest.mark.parametrize("signum, start", [(signal.SIGINT, "fork"), (signal.SIGTERM, "fork"), (signal.SIGKILL, "fork"),
                                           (signal.SIGKILL, "prewarmed")])
def test_a_stopped_or_killed_ab_leaves_no_worker_step_or_cache(tmp_path, signum, start):
    proc = _ab(tmp_path, "--ops", "slow_op", "--ops-path", OPS, "--step-start", start, slow_s=60)
    d = _ab_dir(tmp_path)
    _started(tmp_path)  # A's record is in its first case, forked by A's worker
    caches = load(d / "ab.json")["triton_caches"]
    root = Path(next(iter(caches.values()))["dir"]).parent
    assert _leftovers(d), "no worker or step found running"
    os.kill(proc.pid, signum)
    out, _ = proc.communicate(timeout=120)
    if signum != signal.SIGKILL:
        assert proc.returncode in exits_of(signum), out
        assert f"interrupted ({signal.Signals(signum).name})" in out
    # kill -9: each worker got SIGTERM as its parent died, stopped its step (SIGTERM, then SIGKILL
    # after its grace) and removed the A/B's cache root: whichever ends last, nothing is left.
    assert wait_for(lambda: not _leftovers(d), 60), _leftovers(d)
    assert wait_for(lambda: not root.exists(), 10), list(root.rglob("*"))


def test_a_worker_that_dies_is_restarted_once_then_the_step_fails(tmp_path):
    proc = _ab(tmp_path, "--ops", "slow_op", "--ops-path", OPS, slow_s=30)
    d = _ab_dir(tmp_path)
    first = _started(tmp_path)[0]  # the record's pytest child, forked by its step, forked by the worker
    os.kill(_parent(_parent(first)), signal.SIGKILL)
    retried = _started(tmp_path, 2)[-1]  # the retry, under a new worker
    assert retried != first
    os.kill(_parent(_parent(retried)), signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    assert "(its warm worker died: restarted, the step retried) FAILED (exit -9)" in out
    assert (d / "ab.log").read_text().count("the warm worker died during the step: restarting it") == 1
    steps = load(d / "ab.json")["steps"]
    assert [(s["what"].split("] ")[1], s["usable"]) for s in steps] == [("A records", False)]
    assert wait_for(lambda: not _leftovers(d), 60), _leftovers(d)


def test_a_worker_restart_lets_the_step_through(tmp_path):
    # Only the record, whose worker is killed in its first case, waits: its retry and the 6 steps after
    # it need not (300 s each otherwise).
    proc = _ab(tmp_path, "--ops", "slow_op", "--ops-path", OPS, slow_s=300, slow_first_only=True)
    d = _ab_dir(tmp_path)
    os.kill(_parent(_parent(_started(tmp_path)[0])), signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert re.search(r"A records \.\.\. \(its warm worker died: restarted, the step retried\)[ 0-9/]* ok", out), out
    assert all(s["usable"] for s in load(d / "ab.json")["steps"])
    # The retry claimed the record's run dir afresh: one run in it, complete.
    assert len(list((d / "slow_op" / "A-record").iterdir())) == 1
    assert _leftovers(d) == []


def test_a_worker_begun_early_that_dies_while_importing_says_so_at_its_first_step_once(tmp_path):
    """`begin` starts the worker without waiting (the A/B starts both sides' at once); one that died
    during its imports is not started again behind the step's back: the step is told it did not start,
    and the A/B's one retry is what starts it again."""
    from harness.core import forkserver

    with open(tmp_path / "ab.log", "w+") as log:
        worker = forkserver.Worker("/bin/false", log, {}, None, None, "interpreter")
        worker.begin()
        first = worker.child.pid
        worker.begin()  # begun already: nothing more starts
        assert worker.child.pid == first
        assert wait_for(lambda: worker.child.proc.poll() is not None, 30)
        with pytest.raises(forkserver.WorkerDied, match="did not start"):
            worker.start(["replay", "x"], log=log, on_stdout=print)
        assert worker.child is None and worker.sock is None
        with pytest.raises(forkserver.WorkerDied, match="did not start"):  # the retry starts a new one
            worker.start(["replay", "x"], log=log, on_stdout=print)
        assert worker.child is None


def test_waiting_for_a_begun_workers_imports_readies_it_or_closes_one_that_died(tmp_path):
    """What an A/B does before its first timed step: a live worker is ready after the wait (its step then
    forks at once); one that died importing is closed, so its step begins another; one never begun is left."""
    from harness.core import forkserver

    with open(tmp_path / "ab.log", "w+") as log:
        dead = forkserver.Worker("/bin/false", log, {}, None, None, "interpreter")
        dead.begin()
        with pytest.raises(forkserver.WorkerDied, match="did not start"):
            dead.wait_ready()
        assert dead.child is None and dead.sock is None
        unbegun = forkserver.Worker(sys.executable, log, {}, None, None, "interpreter")
        unbegun.wait_ready()
        assert unbegun.child is None and not unbegun.ready
        live = forkserver.Worker(sys.executable, log, {}, str(REPO), None, "interpreter")
        live.begin()
        try:
            live.wait_ready()
            assert live.ready and live.child.proc.poll() is None
        finally:
            assert live.close() == 0


def test_a_worker_begun_in_a_thread_that_ended_is_begun_again_by_the_thread_that_uses_it(tmp_path):
    """A record job's spare: begun in one job's thread, which ended (the worker then gets SIGTERM), then used by
    another's. It is begun again where it is used and its step goes through (CI saw the step fail)."""
    import threading

    from harness.core import forkserver

    with open(tmp_path / "ab.log", "w+") as log:
        worker = forkserver.Worker(sys.executable, log, {}, str(REPO), None, "interpreter")

        def begin_and_end_once_it_has_imported():  # its word unread: a spare no step has used yet
            import select

            worker.begin()
            assert select.select([worker.sock], [], [], 120)[0]

        thread = threading.Thread(target=begin_and_end_once_it_has_imported)
        thread.start()
        thread.join()
        assert not worker.ready
        first = worker.child.pid
        assert wait_for(lambda: worker.child.proc.poll() is not None, 60)  # ended with its thread
        try:
            child = worker.start(["--version"], log=log, on_stdout=lambda line: None)
            assert child.wait(120) is not None and worker.child.pid != first
        finally:
            worker.close()
    assert "its starting thread ended before it served; begun again" in (tmp_path / "ab.log").read_text()


def test_the_worker_computes_once_what_every_step_would_and_touches_no_device():
    """harness.worker._warm, in a process of its own as a worker is: Triton's cache key computed (its
    lru cache filled, so a forked step's first compile or cache hit does not hash Triton again), the
    compiler identity cached, the step's modules imported (a correctness check imports nothing more), the
    backend's warm_fork done, and the device untouched."""
    probe = (
        "import sys, torch, triton\n"
        "from triton.runtime import cache\n"
        "from harness import worker\n"
        "from harness.core import identity\n"
        "worker._warm('cuda')\n"
        "warmed = set(sys.modules)\n"
        "torch.testing.assert_close(torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.float16))\n"
        "print(cache.triton_key.cache_info().currsize, identity._compiler_identity.cache_info().currsize,\n"
        "      all(m in sys.modules for m in worker.STEP_MODULES), '_pytest.junitxml' in sys.modules,\n"
        "      sorted(set(sys.modules) - warmed), len(torch._TritonLibrary.ops_table), torch.cuda.is_initialized())\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    # cuda's warm_fork: torch's Triton ops registered (queued for the device's lazy init), no device touched.
    assert done.stdout.split() == ["1", "1", "True", "True", "[]", "2", "False"]
