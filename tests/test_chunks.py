"""An A/B that chunks its ops (`--chunk K`): each repeat of a chunk's ops is timed in one measuring host a
side (harness.child.host), each op keeping a step, a run dir and an outcome of its own. A crash costs the
crashing op's rows and the chunk's later ops go on in a new host; what one op's run changed for its
process does not reach the next op's; an interrupted chunk goes on from its last completed step. The
steps and hosts are real processes on the interpreter."""

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import AB_SHAPES, REPO, ab_dir_in, ab_request, exits_of, harness_env, load, run_dir_of, wait_for

from harness import cli
from harness.core import options
from harness.core.errors import UsageError
from harness.measure import device_gate
from harness.sessions import ab
from harness.sessions.ab.plan import PlanError, plan_from_data

CHUNK_OPS = REPO / "tests" / "resources" / "chunk_ops"
PROBE = REPO / "tests" / "resources" / "user_ops" / "switch_probe.py"




def _run_json(step_dir: Path) -> dict:
    (run_dir,) = step_dir.iterdir()
    return load(run_dir / "run.json")


def _host(step_dir: Path) -> dict | None:
    return _run_json(step_dir)["observed"].get("measuring_host")


def _run_file(step_dir: Path, name: str) -> str:
    (run_dir,) = step_dir.iterdir()
    return (run_dir / name).read_text()


@pytest.mark.e2e
def test_a_chunks_repeat_runs_in_one_host_a_side_each_op_keeping_its_own_step(tmp_path, capsys):
    code = ab.run_from_args(ab_request(tmp_path, ["switch_probe", "add"], "--ops-path", str(PROBE), "--b-env",
                                     "ZL_TEST_SWITCH=1", "--repeats", "2", "--chunk", "2", "--chunk-records", "beside"))
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    hosts = {}
    for r in (1, 2):
        for side in "AB":
            first, second = _host(d / "switch_probe" / f"{side}-{r}"), _host(d / "add" / f"{side}-{r}")
            # One host for the repeat's side: the first op was its first run, the second its next.
            assert first["pid"] == second["pid"] and (first["runs_before"], second["runs_before"]) == (0, 1)
            hosts[(r, side)] = first["pid"]
    assert len(set(hosts.values())) == 4  # a host per repeat and side: repeats stay processes of their own
    # Each side's host runs its children in that side's environment.
    assert set(_run_file(d / "switch_probe" / "B-1", "switch_seen.txt").split()) == {"1"}
    assert set(_run_file(d / "switch_probe" / "A-2", "switch_seen.txt").split()) == {"unset"}
    # The records and passes are a process an op, untouched by chunks.
    for op in ("switch_probe", "add"):
        assert _host(d / op / "A-record") is None and _host(d / op / "B-passes") is None
    state = load(d / "ab.json")
    steps = {s["step"]: s for s in state["steps"]}
    for op in ("switch_probe", "add"):  # each op its record, B's passes, then its repeats as they alternate
        assert [s["step"].split("/")[1] for s in state["steps"] if s["step"].startswith(f"{op}/")] == [
            "A-record", "B-passes", "A-1", "B-1", "A-2", "B-2"]
    # The records and passes ran in a thread beside the repeats: add's began before switch_probe's repeats ended.
    assert {k for k, s in steps.items() if s.get("beside")} == {f"{op}/{k}" for op in ("switch_probe", "add")
                                                                 for k in ("A-record", "B-passes")}
    last = steps["switch_probe/B-2"]
    assert steps["add/A-record"]["started"] < last["started"] + last["seconds"]
    assert all(s["usable"] for s in state["steps"]) and state["plan"]["chunk"] == 2
    assert "device_gate" not in state  # named while the chunk's records ran beside, no longer
    # They shared the device through the A/B's gate: each repeat held it while timing its rows, each record and
    # passes step while its cases ran.
    gates = {k: _run_json(d / k)["observed"]["device_gate"] for k in steps}
    assert len({g["path"] for g in gates.values()}) == 1
    for k, gate in gates.items():
        assert gate["held"] >= 1 and gate["role"].startswith("beside" if steps[k].get("beside") else "timed"), k
    rows = load(d / "report.json")["rows"]
    assert len(rows) == 4 and all(len(r["a_ms"]) == 2 and len(r["b_ms"]) == 2 for r in rows)


@pytest.mark.e2e
def test_a_crash_in_a_host_costs_its_op_and_the_chunks_later_ops_go_on_in_a_new_host(tmp_path, capsys):
    code = ab.run_from_args(ab_request(tmp_path, ["host_crash", "add"], "--ops-path", str(CHUNK_OPS), "--b-env",
                                     "ZL_TEST_CRASH=1", "--repeats", "2", "--chunk", "2"))
    out = capsys.readouterr().out
    assert code == 1, out  # an op with nothing to compare
    d = ab_dir_in(out)
    state = load(d / "ab.json")
    failed = [s["step"] for s in state["steps"] if not s["usable"]]
    assert failed == ["host_crash/B-passes", "host_crash/B-1", "host_crash/B-2"]  # passes: a process of its own
    assert "the measuring host ended during this run" in _run_file(d / "host_crash" / "B-1", "run.log")
    for r in (1, 2):
        crashed = _host(d / "host_crash" / f"B-{r}")
        assert crashed is None  # it died before it could say
        after = _host(d / "add" / f"B-{r}")
        assert after["runs_before"] == 0  # a new host: the crashed one served nothing more
        assert _host(d / "add" / f"A-{r}")["runs_before"] == 1  # A's host took both ops
    assert "measuring host ended during an earlier op: a new one" in out
    rows = load(d / "report.json")["rows"]
    assert [len(r["b_ms"]) for r in rows if r["op"] == "add"] == [2, 2]  # the op after the crash: measured
    assert [len(r["b_ms"]) for r in rows if r["op"] == "host_crash"] == [0, 0]


@pytest.mark.e2e
def test_what_one_ops_run_changed_for_the_host_does_not_reach_the_next_op(tmp_path, capsys):
    code = ab.run_from_args(ab_request(tmp_path, ["leaky", "leak_witness"], "--ops-path", str(CHUNK_OPS),
                                     "--repeats", "2", "--chunk", "2"))
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    for step in ("A-1", "B-1", "A-2", "B-2"):
        leaked = _host(d / "leaky" / step)
        assert "sys.path" in leaked["put_back_after"]
        witness = _host(d / "leak_witness" / step)
        assert witness["pid"] == leaked["pid"] and witness["runs_before"] == 1
        assert set(_run_file(d / "leak_witness" / step, "witness.txt").splitlines()) == {
            f"env=unset path=False cwd={REPO} cycles=0"}


@pytest.mark.e2e
def test_two_ops_sharing_an_autotuned_kernel_each_replay_their_own_records_configs_in_one_host(tmp_path, capsys):
    """The tuner outlives the first op's run in the host: the second op's run still injects from its own record
    (a tuner left wrapped by the first run's patch answered the first run's picks, and its rows named none)."""
    code = ab.run_from_args(ab_request(tmp_path, ["twin_a", "twin_b"], "--ops-path", str(CHUNK_OPS), "--repeats", "2",
                                     "--chunk", "2"))
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    for op in ("twin_a", "twin_b"):
        (record,) = (d / op / "A-record").iterdir()
        picked = [row["configs"] for row in load(record / "results.json")["rows"]]
        assert len(picked) == 2 and all(picked)
        for step in ("A-1", "B-1", "A-2", "B-2"):
            assert _host(d / op / step)["runs_before"] == (op == "twin_b")
            assert _run_json(d / op / step)["observed"]["autotune"]["injected"] == 2
            (run_dir,) = (d / op / step).iterdir()
            assert [row["configs"] for row in load(run_dir / "results.json")["rows"]] == picked


@pytest.mark.e2e
def test_a_host_whose_run_set_what_it_cannot_put_back_ends_after_it_and_the_next_op_gets_a_new_one(tmp_path,
                                                                                                   capsys):
    code = ab.run_from_args(ab_request(tmp_path, ["allocator_setter", "add"], "--ops-path", str(CHUNK_OPS),
                                     "--repeats", "2", "--chunk", "2"))
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    for step in ("A-1", "B-1", "A-2", "B-2"):
        setter, after = _host(d / "allocator_setter" / step), _host(d / "add" / step)
        assert setter["ended_after"] == "the run set Triton's allocator (triton.set_allocator)"
        assert after["runs_before"] == 0 and after["pid"] != setter["pid"] and "ended_after" not in after
    assert "ended during an earlier op" not in out  # an orderly end, not a crash
    assert all(s["usable"] for s in load(d / "ab.json")["steps"])


@pytest.mark.e2e
def test_a_flaggems_op_of_another_checkout_than_the_hosts_runs_its_child_in_a_process_of_its_own(tmp_path, capsys):
    """Two checkouts whose package has one name: the hosts' worker preloaded the first; the second's timed runs
    are declined by the host and run in their steps' own processes, importing their own checkout's package."""
    import shutil

    first = REPO / "tests" / "resources" / "flaggems_checkout"
    second = shutil.copytree(first, tmp_path / "second_checkout", ignore=shutil.ignore_patterns("__pycache__"))
    shapes = tmp_path / "fg_shapes.yaml"
    shapes.write_text("softmax:\n  shapes: [[2, 8]]\n  dtypes: [fp32]\n")
    request = cli.parse_request(["ab", "--ops", "flaggems:softmax", "other:softmax", "--flaggems-dir", str(first),
                                 "--flaggems-dir", f"other={second}", "--backend", "interpreter", "--shapes",
                                 str(shapes), "--repeats", "2", "--chunk", "2", "--out", str(tmp_path / "runs")])
    code = ab.run_from_args(request)
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    for step in ("A-1", "B-2"):
        assert _host(d / "flaggems-softmax" / step)["runs_before"] == 0
        assert _host(d / "other-softmax" / step) is None
        assert (f"the child runs in a process of its own, not the measuring host: flag_gems was preloaded from "
                f"{first / 'src'}, this run's checkout is {second}") in _run_file(d / "other-softmax" / step, "run.log")
        package = _run_json(d / "other-softmax" / step)["observed"]["flaggems"]["package_file"]
        assert Path(package).is_relative_to(second)


# The main thread's steps (the repeats; with records first, the records and passes too) before the stop, and in
# the continuation, and the runs add's repeat 2 found its host had served (softmax's repeat 2, where it ran).
INTERRUPTED = {
    "first": (["softmax/A-1", "softmax/B-1", "add/A-1"],
              ["add/A-1", "add/B-1", "softmax/A-2", "softmax/B-2", "add/A-2", "add/B-2"], 1),
    "beside": (["softmax/A-1", "softmax/B-1", "softmax/A-2", "softmax/B-2", "add/A-1"],
               ["add/A-1", "add/B-1", "add/A-2", "add/B-2"], 0),
}


@pytest.mark.e2e
@pytest.mark.parametrize("records", sorted(INTERRUPTED))
def test_an_interrupted_chunk_goes_on_from_its_last_completed_step_running_none_twice(tmp_path, monkeypatch,
                                                                                       capsys, records):
    real_launch = ab.Runner._launch
    launched: list[str] = []

    def launch(runner, side, request, host=None):
        launched.append(f"{request.run_dir.parent.parent.name}/{request.run_dir.parent.name}")
        code, interrupted = real_launch(runner, side, request, host)
        if launched[-1] == "add/A-1" and runner.earlier == {}:
            return code, signal.SIGINT  # stopped as it ran: its rows are not the A/B's
        return code, interrupted

    monkeypatch.setattr(ab.Runner, "_launch", launch)
    extra = ("--repeats", "2", "--chunk", "2", "--chunk-records", records)
    assert ab.run_from_args(ab_request(tmp_path, ["softmax", "add"], *extra)) == 128 + signal.SIGINT
    first = ab_dir_in(capsys.readouterr().out)
    before = load(first / "ab.json")
    stopped_at, then, served = INTERRUPTED[records]
    assert launched[-len(stopped_at):] == stopped_at and not before["complete"]
    launched.clear()
    assert ab.run_from_args(ab_request(tmp_path, ["softmax", "add"], *extra, "--continue", str(first))) == 0
    second = ab_dir_in(capsys.readouterr().out)
    assert launched == then
    state = load(second / "ab.json")
    taken_over = sorted(s["step"] for s in state["steps"] if s.get("taken_over"))
    assert taken_over == sorted(s["step"] for s in before["steps"])
    # The continuation's hosts: A's first served add alone (softmax's repeat 1 was taken over).
    assert _host(second / "add" / "A-1")["runs_before"] == 0
    assert _host(second / "add" / "A-2")["runs_before"] == served


@pytest.mark.e2e
def test_sequential_rounds_of_a_chunk_time_only_the_ops_with_open_rows_in_the_rounds_host(tmp_path, monkeypatch,
                                                                                            capsys):
    from reports import sequential

    def settle(rows, schedule, fdr):  # softmax's rows settle at the first look, add's stay open to the cap
        return {r.label: "same" if r.op == "softmax" else sequential.OPEN for r in rows}

    monkeypatch.setattr(sequential, "settle", settle)
    code = ab.run_from_args(ab_request(tmp_path, ["softmax", "add"], "--repeats", "auto", "--max-repeats", "4",
                                     "--chunk", "2"))
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    assert not (d / "softmax" / "A-4").exists()
    round_2 = _host(d / "add" / "A-4")
    assert round_2["runs_before"] == 0 and round_2["pid"] != _host(d / "add" / "A-3")["pid"]
    state = load(d / "ab.json")
    assert [len(state["rounds"][op]) for op in ("softmax", "add")] == [1, 2]


def test_a_hosts_put_back_frees_the_runs_garbage_in_cycles_and_names_what_else_it_restored(monkeypatch):
    """What a run left for the next in its host, put back by the host as the run ends (in-process: the e2e test
    above shows it through real runs, where an automatic collection may have come first)."""
    import gc
    import os
    import sys
    import weakref

    from harness.child import host

    monkeypatch.setattr(sys, "path", list(sys.path))
    before = host._ProcessState()

    class Cycle:
        pass

    gc.disable()  # only the put-back's own collection may free it
    try:
        left = Cycle()
        left.me = left
        alive = weakref.ref(left)
        del left
        sys.path.append("/zl-left")
        os.environ["ZL_LEFT"] = "1"
        try:  # a failed case's traceback, as pytest leaves it: its frames hold the case's tensors
            raise ValueError("a failed case")
        except ValueError as exc:
            sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        changed = before.restore()
        assert alive() is None
    finally:
        gc.enable()
    assert changed == ["sys.path"] and "/zl-left" not in sys.path and "ZL_LEFT" not in os.environ
    assert not any(hasattr(sys, name) for name in ("last_type", "last_value", "last_traceback"))
    assert before.unrestorable() is None


def test_a_process_freezes_its_imports_once_whatever_its_interpreter_froze_as_it_started(monkeypatch):
    """child.plugins.heap freezes a process's imports as its first run's cases are collected, though the
    interpreter froze some objects as it started (CPython 3.12: 375); a later run in the same process, or a
    run in a host (frozen as it started), freezes nothing: that would keep its pytest session, plugins and
    timer, or an earlier run's garbage, for the process's life."""
    import gc

    from harness.child.plugins import heap

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(heap, "_imports_frozen", False)  # put back after: this process's own is not ours
    heap.HeapPlugin(None).pytest_collection_finish(None)
    assert frozen == [True]
    heap.HeapPlugin(None).pytest_collection_finish(None)
    assert frozen == [True]


def test_a_host_freezes_its_imports_before_it_listens(monkeypatch, tmp_path):
    """Else each run it serves freezes its own pytest session and plugins for the host's life."""
    import gc

    from harness.child import host, runner  # noqa: F401 (imported before socket is stood in for)
    from harness.child.plugins import heap

    class Listening(Exception):
        pass

    serving = []

    def listen(*args):
        serving.append(heap._imports_frozen)
        raise Listening

    monkeypatch.setattr(heap, "_imports_frozen", False)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # the test process's heap stays as it is
    monkeypatch.setattr(host.socket, "socket", listen)
    with pytest.raises(Listening):
        host.serve(str(tmp_path / "host.sock"))
    assert serving == [True]


def test_a_run_counts_its_collections_and_their_seconds_by_generation_in_run_json(tmp_path):
    """What the garbage collector cost the run (a FlagGems benchmark collects after every row): counted from
    configure to the session's end, the callback gone after."""
    import gc
    import types

    from harness.child.plugins import heap

    (tmp_path / "run.json").write_text("{}")
    plugin = heap.HeapPlugin(types.SimpleNamespace(run_dir=tmp_path))
    plugin.pytest_configure(None)
    gc.collect()
    gc.collect(0)
    gc.collect()
    plugin.pytest_sessionfinish(None)
    assert plugin._on_gc not in gc.callbacks
    gc.collect()  # after the session: not counted
    observed = json.loads((tmp_path / "run.json").read_text())["observed"]["gc"]
    assert observed["collections"]["2"] == 2 and observed["collections"]["0"] >= 1
    assert observed["seconds"].keys() == observed["collections"].keys()
    assert all(v >= 0 for v in observed["seconds"].values())
    assert observed["imports_frozen"] is heap._imports_frozen


@pytest.mark.parametrize("chunk", [0, options.MAX_CHUNK + 1, "4", 1.5])
def test_a_plans_chunk_outside_its_range_is_refused_in_one_line(tmp_path, chunk):
    with pytest.raises(PlanError, match=f"'chunk' must be an integer from 1 to {options.MAX_CHUNK}"):
        plan_from_data({"ops": ["add"], "chunk": chunk}, tmp_path / "p.yaml")


def test_the_command_lines_chunk_is_the_plans_and_round_trips_through_its_stored_form(tmp_path):
    plan = ab.resolve_plan(ab_request(tmp_path, ["add", "softmax"], "--chunk", "3"))
    assert plan.chunk == 3
    assert plan_from_data(plan.to_dict(), "stored", Path("/")).chunk == 3
    with pytest.raises(SystemExit):
        cli.parse_request(["ab", "--ops", "add", "--chunk", "0"])


@pytest.mark.e2e
def test_flaggems_ops_in_one_host_each_get_their_own_rows_the_benchmark_patch_undone_between(tmp_path, capsys):
    """The FlagGems plugin patches the checkout's Benchmark class for its run; in a host the next op's run
    patches the originals, not the last run's wrappers (which would feed its cases to the last run too).
    log_softmax's kernel is softmax's, behind a LibEntry that caches the tuner's pick per argument key: the
    next op's run finds it empty and replays its own record's configs."""
    checkout = REPO / "tests" / "resources" / "flaggems_checkout"
    shapes = tmp_path / "fg_shapes.yaml"
    shapes.write_text("softmax:\n  shapes: [[2, 8], [3, 16]]\n  dtypes: [fp32]\n"
                      "log_softmax:\n  shapes: [[4, 8]]\n  dtypes: [fp32]\n")
    request = cli.parse_request(["ab", "--ops", "flaggems:softmax", "flaggems:log_softmax@softmax", "--flaggems-dir",
                                 str(checkout), "--backend", "interpreter", "--shapes", str(shapes), "--repeats", "2",
                                 "--chunk", "2", "--out", str(tmp_path / "runs")])
    code = ab.run_from_args(request)
    out = capsys.readouterr().out
    assert code == 0, out
    d = ab_dir_in(out)
    for step in ("A-1", "B-2"):
        (first,), (second,) = ((d / op / step).iterdir() for op in ("flaggems-softmax", "flaggems-log_softmax-softmax"))
        assert _host(first.parent)["pid"] == _host(second.parent)["pid"]
        assert [r["case"] for r in load(first / "results.json")["rows"]] == ["fp32-2x8", "fp32-3x16"]
        assert [r["case"] for r in load(second / "results.json")["rows"]] == ["fp32-4x8"]
        # Each run left the benchmark package's modules to be imported anew: the second imported them again.
        assert all(load(run / "run.json")["observed"]["flaggems"]["benchmark_modules_dropped"] >= 3
                   for run in (first, second))
        for op, run_dir in (("flaggems-softmax", first), ("flaggems-log_softmax-softmax", second)):
            (record,) = (d / op / "A-record").iterdir()
            picked = [r["configs"] for r in load(record / "results.json")["rows"]]
            assert all(picked) and [r["configs"] for r in load(run_dir / "results.json")["rows"]] == picked
            assert load(run_dir / "run.json")["observed"]["autotune"]["injected"] == len(picked)


def test_chunks_refuse_passes_on_every_step_whose_hooks_would_reach_the_next_ops_run(tmp_path):
    with pytest.raises(UsageError, match="chunk 2: a chunk's hosts run timing-only repeats"):
        ab.resolve_plan(ab_request(tmp_path, ["add", "softmax"], "--chunk", "2", "--step-passes", "every"))


@pytest.mark.e2e
def test_a_host_runs_timing_replays_handed_to_it_and_refuses_any_other_run(tmp_path, harness):
    """The host's protocol alone, through the command line a step runs: a replay that collects IR and profiles
    (its passes) is refused, its step told why; a timing-only replay runs in the host; a SIGTERM while it
    waits ends it, its socket removed."""
    import subprocess
    import sys

    record = harness("record", "add", "--backend", "interpreter", "--out", tmp_path)
    assert record.returncode == 0, record.stdout + record.stderr
    sock = tmp_path / "host.sock"
    env = harness_env()
    host = subprocess.Popen([sys.executable, "-c", "import sys; from harness.child import host; "
                             "sys.exit(host.serve(sys.argv[1]))", str(sock)], cwd=REPO, env=env)
    try:
        assert wait_for(sock.exists, 120)
        refused = harness("replay", run_dir_of(record), "--measuring-host", sock, "--run-dir", tmp_path / "passes")
        assert refused.returncode != 0
        assert "the measuring host runs timing-only replays, not passes (replay, with IR and profiling)" in (
            refused.stdout)
        timed = harness("replay", run_dir_of(record), "--timing-only", "--measuring-host", sock,
                        "--run-dir", tmp_path / "timed")
        assert timed.returncode == 0, timed.stdout + timed.stderr
        hosted = load(tmp_path / "timed" / "run.json")["observed"]["measuring_host"]
        assert hosted["pid"] == host.pid and hosted["runs_before"] == 0  # the refused run counts for nothing
        assert len(load(tmp_path / "timed" / "results.json")["rows"]) == 2
    finally:
        host.terminate()
        assert host.wait(60) == 0
    assert not sock.exists()


@pytest.mark.e2e
def test_a_stop_during_a_record_beside_the_repeats_stops_that_record_too_and_reports_what_completed(tmp_path):
    # hang_op's record hangs in its first case, holding the device beside fp32_op's repeats (which wait for it):
    # a SIGINT to the A/B stops the repeat under way and that record, each writing its outcome, and the A/B
    # reports what completed; nothing it started is left (the autouse fixture).
    import os
    import subprocess
    import sys

    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(AB_SHAPES)
    env = harness_env()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ab", "--ops", "fp32_op", "hang_op", "--ops-path",
                             str(REPO / "tests" / "resources" / "batch_ops"), "--backend", "interpreter", "--shapes",
                             str(shapes), "--dtypes", "fp32", "--repeats", "2", "--chunk", "2", "--chunk-records",
                             "beside", "--out",
                             str(tmp_path / "runs")], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        def hanging() -> bool:
            for path in (tmp_path / "runs").glob("ab_*/ab.json"):
                beside = json.loads(path.read_text() or "{}").get("running_beside") or {}
                if beside.get("what", "").endswith("hang_op] A records"):
                    run_json = Path(beside["run_dir"]) / "run.json"
                    return run_json.is_file() and load(run_json)["observed"].get("running_case") is not None
            return False

        assert wait_for(hanging, 180)
        # The hung record holds the device, and the A/B's state names the gate that says so (a corpus A/B's
        # timeout charges the holder's op).
        (view,) = (tmp_path / "runs").glob("ab_*/ab.json")
        # Waited for: the record names its case before it takes the gate, and a repeat may be timing a row.
        assert wait_for(lambda: device_gate.held_by(json.loads(view.read_text())["device_gate"]) == device_gate.BESIDE,
                        180)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode in exits_of(signal.SIGINT), out
    assert "INCOMPLETE" in out
    d = ab_dir_in(out)
    state = load(d / "ab.json")
    # Where it stopped, as a stopped step of the main thread's stays `running`: a continuation runs it again.
    record = state["running_beside"]
    assert record["what"].endswith("hang_op] A records") and "hang_op/A-record" not in [s["step"] for s in
                                                                                         state["steps"]]
    outcome = load(Path(record["run_dir"]) / "run.json")["observed"]["outcome"]
    assert outcome["status"] == "INCOMPLETE" and "interrupted" in outcome["reason"]


@pytest.mark.e2e
def test_each_ops_own_report_is_written_and_one_that_fails_costs_its_op_alone(tmp_path, capsys, monkeypatch):
    """A chunk's ops' own reports (--op-dir, as a corpus A/B gives them) are written in processes forked from
    the A/B (harness.sessions.ab.reporting.op_reports): one that cannot be written fails that op's report alone,
    said, the A/B's exit 1."""
    from reports import ab_report

    dirs = {op: tmp_path / "ops" / op for op in ("switch_probe", "add")}
    write = ab_report.write

    def write_or_fail(out_dir, *args, **kwargs):
        if out_dir == dirs["switch_probe"]:
            raise OSError(28, "No space left on device")
        return write(out_dir, *args, **kwargs)

    monkeypatch.setattr(ab_report, "write", write_or_fail)
    code = ab.run_from_args(ab_request(tmp_path, ["switch_probe", "add"], "--ops-path", str(PROBE), "--repeats", "2",
                                     "--chunk", "2", *(a for op, d in dirs.items() for a in ("--op-dir", f"{op}={d}"))))
    captured = capsys.readouterr()
    assert code == 1, captured.out
    assert f"error: the report of {dirs['switch_probe']} could not be written" in captured.err
    rows = load(dirs["add"] / "report.json")["rows"]
    assert {r["op"] for r in rows} == {"add"} and all(len(r["a_ms"]) == 2 for r in rows)
    assert (dirs["add"] / "report.html").is_file() and (dirs["add"] / "ratios.png").is_file()
    assert not (dirs["switch_probe"] / "report.json").exists() and (dirs["switch_probe"] / "ab.json").is_file()
    assert {r["op"] for r in load(ab_dir_in(captured.out) / "report.json")["rows"]} == {"switch_probe", "add"}


def _report_jobs(tmp_path: Path, n: int) -> list[tuple]:
    """op_reports' jobs for ops op0..op<n-1>, each a dir of its own under tmp_path."""
    for i in range(n):
        (tmp_path / f"op{i}").mkdir()
    return [(tmp_path / f"op{i}", {"A": [], "B": []}, {}, []) for i in range(n)]


def test_a_slow_op_report_holds_its_own_slot_alone_while_the_later_ones_are_written(tmp_path, monkeypatch):
    from harness.sessions.ab import reporting

    def report(op_dir, *args):
        if op_dir.name == "op0":  # slow: under way until the last op's report is written, or 20 s
            seen = wait_for(lambda: (tmp_path / "op3" / "report.txt").is_file(), timeout=20)
            (op_dir / "report.txt").write_text(f"saw op3 written: {seen}")
        else:
            (op_dir / "report.txt").write_text("written")
        return 0

    monkeypatch.setattr(reporting, "report", report)
    monkeypatch.setattr(reporting.precompile, "usable_cpus", lambda: 4)  # two at once
    assert reporting.op_reports(_report_jobs(tmp_path, 4), {"interpreter"}, 2, 0.05) == []
    assert (tmp_path / "op0" / "report.txt").read_text() == "saw op3 written: True"


def test_op_reports_run_in_forked_processes_at_most_report_jobs_at_once(tmp_path, monkeypatch):
    from harness.sessions.ab import reporting

    running = tmp_path / "running"
    running.mkdir()

    def report(op_dir, groups, context, warnings, *args):
        mine = running / op_dir.name
        mine.touch()
        # Two under way at once before either ends: the reports overlap, whatever the machine's load.
        wait_for(lambda: len(list(running.iterdir())) >= 2 or op_dir.name in ("op4", "op5"), timeout=15)
        (op_dir / "report.txt").write_text(f"{os.getpid()} {len(list(running.iterdir()))}")
        mine.unlink()
        return 0

    monkeypatch.setattr(reporting, "report", report)
    monkeypatch.setattr(reporting.precompile, "usable_cpus", lambda: 8)
    assert reporting.op_reports(_report_jobs(tmp_path, 6), {"interpreter"}, 2, 0.05) == []
    written = [(tmp_path / f"op{n}" / "report.txt").read_text().split() for n in range(6)]
    assert all(int(pid) != os.getpid() for pid, _ in written)
    assert 2 <= max(int(at_once) for _, at_once in written) <= reporting.REPORT_JOBS
