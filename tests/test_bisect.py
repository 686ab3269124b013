"""The bisect session: its search against an oracle of known answers, its builds (a YAML list, a git
range built into kept dirs), and end to end on the interpreter, whose host timings the tests' operator
makes mean something (tests/resources/bisect)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, exits_of, harness_env, load, run_harness

from harness.sessions.bisect import builds, search

RESOURCES = REPO / "tests" / "resources" / "bisect"
KNOBBED = RESOURCES / "knobbed.py"
SMALL, LARGE = "knobbed fp32 300", "knobbed fp32 2x700"


# --- the search, against an oracle whose answer is known ----------------------------------------------
def moves_at(first_bad: dict[str, int], direction: str = search.SLOWER):
    """An oracle: each row SAME before its first bad build, `direction` from it on (a confirm compares
    its two builds: moved when only B is past the row's first bad one)."""
    def oracle(probe: search.Probe) -> dict:
        said = {}
        for row in probe.rows:
            bad_a, bad_b = probe.a >= first_bad[row], probe.b >= first_bad[row]
            said[row] = {"verdict": direction if bad_b and not bad_a else search.SAME, "ratio": None}
        return said
    return oracle


def run_search(state: search.Search, oracle, skipped=()) -> list[search.Probe]:
    """The session's loop without processes: a build in `skipped` is found unusable when first needed."""
    probes = []
    while (probe := search.next_probe(state)) is not None:
        # The session asks again after a build proves unusable: one already known so would loop forever.
        assert not {probe.a, probe.b} & set(state.skipped), probe
        unusable = [k for k in (probe.a, probe.b) if k in skipped and k not in state.skipped]
        for k in unusable:
            state.skip(k, "does not import")
        if unusable:
            continue
        probes.append(probe)
        search.apply(state, {"probe": probe.to_dict(), "verdicts": oracle(probe)})
    return probes


def rows_of(*ids, direction=None):
    return [{"id": i, "op": i.split()[0], "direction": direction} for i in ids]


def bound(n: int) -> int:
    """Search probes and the confirm for a row known bad at the last build (from an A/B)."""
    return math.ceil(math.log2(n)) + 1


@pytest.mark.parametrize("n", range(2, 18))
def test_a_row_is_probed_at_the_last_build_first_then_bisected_in_log2_n_plus_two_probes_or_fewer(n):
    for first_bad in range(1, n + 1):  # n: the row never moves
        state = search.new(n, rows_of("op a 1"), 3, 12)
        probes = run_search(state, moves_at({"op a 1": first_bad}))
        row = state.rows["op a 1"]
        assert probes[0].b == n - 1
        assert len(probes) <= bound(n) + 1, (n, first_bad, probes)
        if first_bad < n:
            assert (row.lo, row.hi, row.direction, row.confirmed) == (first_bad - 1, first_bad, search.SLOWER, True)
            assert probes[-1] == search.Probe(search.CONFIRM, first_bad - 1, first_bad, 3, ("op a 1",))
        else:  # SAME at the last build: one probe, and nothing left to search
            assert len(probes) == 1 and (row.lo, row.hi, row.confirmed) == (n - 1, n, None)


@pytest.mark.parametrize("n", range(2, 18))
def test_a_row_from_an_ab_is_taken_as_moved_at_the_last_build_and_bisected_within_the_bound(n):
    for first_bad in range(1, n):
        state = search.new(n, rows_of("op a 1", direction=search.FASTER), 3, 12)
        probes = run_search(state, moves_at({"op a 1": first_bad}, search.FASTER))
        assert len(probes) <= bound(n)
        assert (state.rows["op a 1"].lo, state.rows["op a 1"].hi, state.rows["op a 1"].confirmed) == (
            first_bad - 1, first_bad, True)


def test_two_groups_that_moved_at_different_builds_are_told_apart_sharing_their_first_probe():
    state = search.new(8, rows_of("op a 1", "op a 2", "op b 1"), 3, 12)
    probes = run_search(state, moves_at({"op a 1": 3, "op a 2": 3, "op b 1": 6}))
    found = {r.id: (r.lo, r.hi, r.confirmed) for r in state.rows.values()}
    assert found == {"op a 1": (2, 3, True), "op a 2": (2, 3, True), "op b 1": (5, 6, True)}
    # The last build, then the middle, are every row's; the middle parts them, and the rows that moved
    # together stay one group (one probe each).
    assert [(p.b, set(p.rows)) for p in probes[:2]] == [(7, {"op a 1", "op a 2", "op b 1"})] * 1 + [
        (3, {"op a 1", "op a 2", "op b 1"})]
    assert all(set(p.rows) in ({"op a 1", "op a 2"}, {"op b 1"}) for p in probes[2:])
    for row in state.rows.values():
        assert len(row.seen) <= bound(8) + 1  # the last build first, then the bisection and its confirm


def test_a_build_that_will_not_import_is_skipped_and_the_first_bad_is_said_to_be_one_of_those_left():
    state = search.new(8, rows_of("op a 1"), 3, 12)
    probes = run_search(state, moves_at({"op a 1": 3}), skipped={2})
    row = state.rows["op a 1"]
    assert 2 not in {p.b for p in probes} | {p.a for p in probes}
    assert (row.lo, row.hi, row.confirmed) == (1, 3, True)
    assert search.between(row, state.skipped) == [2]
    assert len(probes) <= bound(8) + 1


def test_a_noisy_probe_is_run_again_at_twice_the_repeats_and_never_read_as_good_or_bad():
    answer = moves_at({"op a 1": 3})

    # A row from an A/B whose size of move is not known: a NOISY verdict is never read as either side.
    answer = moves_at({"op a 1": 2})

    def noisy_at_3_below_12_repeats(probe):
        if probe.b == 3 and probe.repeats < 12:
            return {r: {"verdict": search.NOISY, "ratio": 1.01, "lo": 0.99, "hi": 1.03} for r in probe.rows}
        return answer(probe)

    state = search.new(8, rows_of("op a 1", direction=search.SLOWER), 3, 12)
    probes = run_search(state, noisy_at_3_below_12_repeats)
    assert [(p.b, p.repeats) for p in probes[:3]] == [(3, 3), (3, 6), (3, 12)]
    assert (state.rows["op a 1"].lo, state.rows["op a 1"].hi) == (1, 2)

    def always_noisy_at_3(probe):
        if probe.b == 3:
            return {r: {"verdict": search.NOISY, "ratio": 1.01, "lo": 0.99, "hi": 1.03} for r in probe.rows}
        return answer(probe)

    state = search.new(8, rows_of("op a 1", direction=search.SLOWER), 3, 12)
    probes = run_search(state, always_noisy_at_3)
    row = state.rows["op a 1"]
    # Still NOISY at the cap: build 3 cannot be tested for the row, and the search goes around it.
    assert [(p.b, p.repeats) for p in probes[:3]] == [(3, 3), (3, 6), (3, 12)]
    assert row.untestable == {3: "NOISY at 12 repeats"} and (row.lo, row.hi, row.confirmed) == (1, 2, True)


def moves_by(first_bad: int, ratio: float, noisy_at: dict[int, tuple[float, float]]):
    """An oracle for one row that moves by `ratio` from `first_bad` on; at the builds of `noisy_at` a
    search probe is NOISY with that interval whatever its repeats."""
    def oracle(probe: search.Probe) -> dict:
        if probe.kind == search.SEARCH and probe.b in noisy_at:
            lo, hi = noisy_at[probe.b]
            return {r: {"verdict": search.NOISY, "ratio": (lo * hi) ** 0.5, "lo": lo, "hi": hi} for r in probe.rows}
        moved = probe.b >= first_bad > probe.a
        verdict = (search.SLOWER if ratio > 1 else search.FASTER) if moved else search.SAME
        r_ = ratio if moved else 1.0
        return {r: {"verdict": verdict, "ratio": r_, "lo": r_ * 0.995, "hi": r_ * 1.005} for r in probe.rows}
    return oracle


@pytest.mark.parametrize("ratio", [1.7, 1 / 1.7, 1.04])
def test_a_noisy_probe_is_read_by_the_size_of_the_move_where_its_interval_is_wholly_on_one_side(ratio):
    # Moved at 5 by `ratio`; builds 3 and 6 stay NOISY at any repeats (a row whose A/A noise is wider
    # than the verdict's band). Build 3's interval lies near 1, build 6's near the move: each is read at
    # its first probe (no retry), and the search ends where it would without the noise.
    toward = 1 if ratio > 1 else -1
    near_one = (1 - 0.015, 1 + 0.015) if ratio > 1 else (1 - 0.015, 1 + 0.015)
    near_move = tuple(sorted((ratio * (1 - 0.015 * toward), ratio * (1 + 0.01 * toward))))
    for direction in (None, search.SLOWER if ratio > 1 else search.FASTER):
        rows = [{"id": "op a 1", "op": "op", "direction": direction, "ratio": ratio if direction else None}]
        state = search.new(8, rows, 3, 12)
        probes = run_search(state, moves_by(5, ratio, {3: near_one, 6: near_move}))
        row = state.rows["op a 1"]
        assert (row.lo, row.hi, row.confirmed) == (4, 5, True), probes
        assert all(p.repeats == 3 for p in probes)  # nothing run again
        reads = {s["b"]: s.get("read_as") for s in row.seen if s["verdict"] == search.NOISY}
        assert reads.get(3, "good") == "good" and reads.get(6, "bad") == "bad" and reads, reads


def test_a_noisy_interval_that_reaches_past_half_the_move_is_run_again_and_never_read():
    # Moved at 5 by 1.7x; build 3 NOISY across the half-way point (1.3): it is retried to the cap, then
    # untestable, exactly as a row without a known move.
    state = search.new(8, [{"id": "op a 1", "op": "op", "direction": search.SLOWER, "ratio": 1.7}], 3, 12)
    probes = run_search(state, moves_by(5, 1.7, {3: (1.1, 1.45)}))
    row = state.rows["op a 1"]
    assert [(p.b, p.repeats) for p in probes[:3]] == [(3, 3), (3, 6), (3, 12)]
    assert row.untestable == {3: "NOISY at 12 repeats"} and (row.lo, row.hi, row.confirmed) == (4, 5, True)
    # Far beyond the move the other way is not near 1 either: not read as good.
    state = search.new(8, [{"id": "op a 1", "op": "op", "direction": search.SLOWER, "ratio": 1.7}], 3, 12)
    run_search(state, moves_by(5, 1.7, {3: (0.5, 0.6)}))
    assert state.rows["op a 1"].untestable == {3: "NOISY at 12 repeats"}


def test_a_row_whose_last_build_stays_noisy_is_undecided_after_that_probe_without_walking_down():
    state = search.new(8, rows_of("op a 1"), 3, 12)
    probes = run_search(state, moves_by(9, 1.0, {7: (0.98, 1.03)}))
    row = state.rows["op a 1"]
    assert [(p.b, p.repeats) for p in probes] == [(7, 3), (7, 6), (7, 12)]
    assert (row.lo, row.hi, row.direction) == (0, 8, None) and not state.open_rows()


def test_a_boundary_the_final_ab_does_not_call_is_unconfirmed_not_found():
    answer = moves_at({"op a 1": 3})

    def confirm_says_same(probe):
        if probe.kind == search.CONFIRM:
            return {r: {"verdict": search.SAME, "ratio": 1.0} for r in probe.rows}
        return answer(probe)

    state = search.new(8, rows_of("op a 1"), 3, 12)
    run_search(state, confirm_says_same)
    assert state.rows["op a 1"].confirmed is False


def test_a_move_the_other_way_is_not_the_move_searched_for():
    answer = moves_at({"op a 1": 5})

    def faster_at_3(probe):
        if probe.kind == search.SEARCH and probe.b == 3:
            return {r: {"verdict": search.FASTER, "ratio": 0.9} for r in probe.rows}
        return answer(probe)

    state = search.new(8, rows_of("op a 1", direction=search.SLOWER), 3, 12)
    probes = run_search(state, faster_at_3)
    row = state.rows["op a 1"]
    assert probes[0].b == 3
    assert (row.lo, row.hi, row.direction, row.confirmed) == (4, 5, search.SLOWER, True)
    assert row.untestable == {3: "moved the other way (FASTER)"}


def test_a_row_from_an_ab_whose_last_build_does_not_import_is_searched_without_it():
    # The A/B's B moved the row, but the list's last build cannot run: it is no longer taken as bad,
    # and the row, SAME up to the build before it, is undecided rather than found there.
    state = search.new(8, rows_of("op a 1", direction=search.SLOWER), 3, 12)
    probes = run_search(state, moves_at({"op a 1": 7}), skipped={7})
    row = state.rows["op a 1"]
    assert (row.lo, row.hi, row.confirmed) == (6, 8, None) and search.between(row, state.skipped) == [7]
    assert all(p.kind == search.SEARCH for p in probes)


# --- builds ---------------------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


# The "compiler" of the tiny checkout: a module the build installs into the build's venv, and its build
# command: copy it into that venv's site-packages (the venv's python is first on PATH).
BUILD_CMD = ("python -c \"import shutil, site; shutil.copy('zl_knob.py', site.getsitepackages()[0])\" "
             "&& echo built >> ../../builds.log")


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "compiler"
    repo.mkdir()
    _git(repo, "init", "-q")
    for i, slow in enumerate(["0", "0", "1"]):
        (repo / "zl_knob.py").write_text(f"SLOW = {slow}\nCOMMIT = {i}\n")
        _git(repo, "add", "zl_knob.py")
        _git(repo, "commit", "-q", "-m", f"change {i}")
    return repo


def test_a_git_range_is_its_commits_oldest_first_each_built_once_into_a_kept_dir(checkout, tmp_path):
    found = builds.from_git(checkout, "HEAD~2..HEAD")
    assert [b.commit["subject"] for b in found] == ["change 0", "change 1", "change 2"]
    assert found[0].commit["sha"] == _git(checkout, "rev-parse", "HEAD~2")
    cache = tmp_path / "cache"
    with open(tmp_path / "build.log", "w") as log:
        built = [builds.build_commit(b, checkout, BUILD_CMD, cache, log) for b in found]
        again = [builds.build_commit(b, checkout, BUILD_CMD, cache, log) for b in found]  # a rerun, a resume
    assert built == again and len({b.python for b in built}) == 3
    # One build a commit: the kept dir is keyed by commit and command, found complete the second time.
    assert (cache / "builds.log").read_text().splitlines() == ["built"] * 3  # ../.. of a build's tree: the cache
    for i, build in enumerate(built):
        builds.check_imports(build, {})  # torch and triton through the harness's environment
        knob = subprocess.run([build.python, "-c", "import zl_knob; print(zl_knob.COMMIT, zl_knob.SLOW)"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert knob == [str(i), "1" if i == 2 else "0"]


def test_a_commit_that_does_not_build_fails_once_and_is_not_built_again(checkout, tmp_path):
    build = builds.from_git(checkout, "HEAD~1..HEAD")[1]
    failing = "echo tried >> ../../tries.log && exit 3"
    with open(tmp_path / "build.log", "w") as log:
        for _ in range(2):
            with pytest.raises(builds.BuildFailed, match="exited 3"):
                builds.build_commit(build, checkout, failing, tmp_path / "cache", log)
    assert (tmp_path / "cache" / "tries.log").read_text() == "tried\n"


def test_a_build_whose_triton_does_not_import_is_refused_with_the_error(tmp_path):
    python = broken_python(tmp_path)
    with pytest.raises(builds.BuildFailed, match="this build of triton is broken"):
        builds.check_imports(builds.Build("broken", python=str(python)), {})


def broken_python(where: Path) -> Path:
    """An interpreter whose triton raises on import: the harness's, with a broken triton first on its path."""
    site = where / "broken_site" / "triton"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text('raise ImportError("this build of triton is broken")\n')
    python = where / "broken_python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site.parent}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_builds_file_with_fewer_than_two_builds_or_an_unknown_field_is_refused(tmp_path):
    one = tmp_path / "one.yaml"
    one.write_text("builds:\n  - {label: only}\n")
    with pytest.raises(builds.UsageError, match="at least two builds"):
        builds.from_file(one)
    odd = tmp_path / "odd.yaml"
    odd.write_text("builds:\n  - {label: a}\n  - {label: b, compiler: x}\n")
    with pytest.raises(builds.UsageError, match="unknown fields"):
        builds.from_file(odd)


def test_a_builds_list_whose_ends_are_not_the_abs_sides_is_named_in_a_note(capsys):
    from harness.sessions import ab
    from harness.sessions.bisect import session

    plan = ab.Plan(name="x", ops=["add"], a=ab.Side("A", "", {}), b=ab.Side("B", "", {"DISABLE_MMA_V3": "1"}))
    same = [builds.Build("good"), builds.Build("mid"), builds.Build("bad", env={"DISABLE_MMA_V3": "1"})]
    session._say_if_not_the_abs_sides(plan, same)
    assert capsys.readouterr().out == ""
    other = [builds.Build("good", python="/envs/other/bin/python"), builds.Build("bad", env={"DISABLE_LLVM_OPT": "1"})]
    session._say_if_not_the_abs_sides(plan, other)
    out = capsys.readouterr().out
    assert "first build (good) is not the A/B's side A" in out and "last build (bad) is not the A/B's side B" in out


# --- end to end ----------------------------------------------------------------------------------------
def measuring_harness(*args, timeout=900, **popen):
    """`python -m harness ARGS` with the interpreter's timings read as performance (see the script)."""
    env = harness_env()
    argv = [sys.executable, str(RESOURCES / "measuring_harness.py"), *map(str, args)]
    if popen:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, **popen)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def builds_file(tmp_path: Path, small_at: int, large_at: int, n: int, broken: tuple[int, ...] = ()) -> Path:
    entries = []
    for k in range(n):
        env = {**({"ZL_TEST_SLOW_SMALL": "1"} if k >= small_at else {}),
               **({"ZL_TEST_SLOW_LARGE": "1"} if k >= large_at else {})}
        entry = {"label": f"build {k}", "env": env}
        if k in broken:
            entry["python"] = str(broken_python(tmp_path / f"broken{k}"))
        entries.append(entry)
    path = tmp_path / "builds.yaml"
    path.write_text(json.dumps({"builds": entries}))  # JSON is YAML
    return path


def bisect_dir_of(text: str) -> Path:
    for line in text.splitlines():
        if line.startswith("bisect dir: "):
            return Path(line[len("bisect dir: "):].strip())
    raise AssertionError(text)


def test_a_bisect_whose_probes_ran_on_two_kinds_of_device_says_so_above_its_groups(tmp_path):
    """A resume on another machine (none of the first kind free) mixes their B/As: a confirm on one need not
    reproduce a search on the other. The report names each device's probes, from the steps' run.json."""
    from reports import bisect_report

    probes = []
    for i, device in enumerate(("NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3"), 1):
        run = tmp_path / f"probe-{i}" / "gelu" / "A-1" / "gelu_1"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"observed": {"device": {"device_name": device}}}))
        probes.append({"probe": {"kind": "search", "a": 0, "b": 7, "repeats": 3, "rows": []},
                       "dir": str(run.parents[2]), "verdicts": {}})
    state = {"spec": {"builds": [{"label": str(k), "commit": None} for k in range(8)], "from_ab": None,
                      "ops": ["gelu"], "repeats": 3, "max_repeats": 12},
             "builds": {}, "records": {}, "probes": probes, "complete": True}
    data = bisect_report.build(state, [], {})
    assert data["machines"] == {"NVIDIA H200": [1, 2], "NVIDIA H100 80GB HBM3": [3]}
    said = ("MIXED MACHINES: its probes ran on 2 kinds of device (NVIDIA H200: probes 1, 2; NVIDIA H100 80GB HBM3: "
            "probe 3)")
    assert said in bisect_report.render_text(data)
    bisect_report.write(tmp_path, data)
    assert said in (tmp_path / "bisect.md").read_text() and "MIXED MACHINES" in (tmp_path / "bisect.html").read_text()
    state["probes"] = probes[:2]
    assert "MIXED" not in bisect_report.render_text(bisect_report.build(state, [], {}))


@pytest.mark.e2e
def test_bisect_tells_two_groups_apart_skips_a_build_that_will_not_import_and_reports(tmp_path):
    # Row 300 slows at build 3, row 2x700 at build 6; build 2 does not import.
    listed = builds_file(tmp_path, small_at=3, large_at=6, n=8, broken=(2,))
    proc = measuring_harness("bisect", "--builds", listed, "--ops", "knobbed", "--ops-path", KNOBBED,
                             "--backend", "interpreter", "--repeats", "2", "--out", tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = bisect_dir_of(proc.stdout)
    report = load(d / "bisect_report.json")
    groups = {tuple(g["rows"]): g for g in report["groups"]}
    large, small = groups[(LARGE,)], groups[(SMALL,)]
    assert (large["status"], large["last_good"]["index"], large["first_bad"]["index"]) == ("found", 5, 6)
    # Build 2 lies between the last good and the first bad of row 300: the first bad is 2 or 3.
    assert (small["status"], small["last_good"]["index"], small["first_bad"]["index"]) == ("found among", 1, 3)
    assert [(b["index"], "does not import" in b["why"]) for b in small["untested_between"]] == [(2, True)]
    assert report["builds"][2]["status"] == "skipped" and "this build of triton is broken" in proc.stdout
    assert all(2 not in (p["a"], p["b"]) for p in report["probes"])
    for group in (large, small):
        assert group["direction"] == "SLOWER"
        assert len(group["probes"]) <= bound(8) + 1, group["probes"]
        confirm = group["probes"][-1]
        assert confirm["kind"] == "confirm" and confirm["rows"][group["rows"][0]]["verdict"] == "SLOWER"
    # Each probe is an A/B replaying the good build's one record, with its own report.
    state = load(d / "bisect.json")
    record = state["records"]["knobbed"]
    for done in state["probes"]:
        ab_state = load(Path(done["dir"]) / "ab.json")
        assert {s["args"][1] for s in ab_state["steps"]} == {record}
        assert (Path(done["dir"]) / "report.json").is_file()
    for name in ("bisect.md", "bisect.html"):
        text = (d / name).read_text()
        assert "FOUND" in text.upper() and "build 5" in text and "does not import" in text
        assert "MIXED MACHINES" not in text  # one machine ran every probe
    assert len(report["machines"]) == 1 and sorted(next(iter(report["machines"].values()))) == list(
        range(1, len(report["probes"]) + 1))


@pytest.mark.e2e
def test_a_resume_after_kill_9_runs_no_probe_twice(tmp_path):
    listed = builds_file(tmp_path, small_at=3, large_at=3, n=6)
    args = ("bisect", "--builds", listed, "--ops", "knobbed", "--ops-path", KNOBBED, "--backend", "interpreter",
            "--repeats", "2", "--run-dir", tmp_path / "bisect")
    proc = measuring_harness(*args, start_new_session=True)
    state_file = tmp_path / "bisect" / "bisect.json"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if state_file.is_file() and load(state_file)["probes"]:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(3)  # into the second probe
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the bisect and every process it started, at once
        proc.wait()
        proc.stdout.close()
    before = load(state_file)["probes"]
    assert len(before) >= 1 and not load(state_file)["complete"]
    resumed = measuring_harness("bisect", "--resume", tmp_path / "bisect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = load(state_file)["probes"]
    assert after[:len(before)] == before  # the done ones kept as they were, not run again
    keys = [(p["probe"]["kind"], p["probe"]["a"], p["probe"]["b"], p["probe"]["repeats"]) for p in after]
    assert len(keys) == len(set(keys)), keys
    # Exactly the probes an uninterrupted search asks for.
    expected = run_search(search.new(6, rows_of(SMALL, LARGE), 2, 8), moves_at({SMALL: 3, LARGE: 3}))
    assert keys == [(p.kind, p.a, p.b, p.repeats) for p in expected]
    report = load(tmp_path / "bisect" / "bisect_report.json")
    assert [(g["status"], g["first_bad"]["index"]) for g in report["groups"]] == [("found", 3)]


def test_a_bisect_refuses_a_backend_that_calls_no_verdict(tmp_path):
    listed = builds_file(tmp_path, small_at=1, large_at=1, n=2)
    proc = run_harness("bisect", "--builds", listed, "--ops", "knobbed", "--ops-path", KNOBBED,
                       "--backend", "interpreter", "--out", tmp_path / "runs")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "calls none" in proc.stderr and not (tmp_path / "runs").exists()


@pytest.mark.e2e
def test_the_rows_of_an_ab_are_bisected_replaying_its_own_record(tmp_path):
    ab = measuring_harness("ab", "--ops", "knobbed", "--ops-path", KNOBBED, "--backend", "interpreter",
                           "--b-env", "ZL_TEST_SLOW_SMALL=1", "--repeats", "2", "--out", tmp_path / "ab")
    assert ab.returncode == 0, ab.stdout + ab.stderr
    ab_dir = next((tmp_path / "ab").glob("ab_*"))
    listed = builds_file(tmp_path, small_at=2, large_at=99, n=4)
    proc = measuring_harness("bisect", "--builds", listed, "--from-ab", ab_dir, "--repeats", "2",
                             "--out", tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = bisect_dir_of(proc.stdout)
    state = load(d / "bisect.json")
    # Only the A/B's SLOWER row, known SLOWER at the last build; no record of the bisect's own.
    assert [{k: r[k] for k in ("id", "op", "direction")} for r in state["rows"]] == [
        {"id": SMALL, "op": "knobbed", "direction": "SLOWER"}]
    assert state["rows"][0]["ratio"] > 1.5  # the size of the move, by which a NOISY probe is read
    assert "note: the list's" not in proc.stdout  # its first and last builds are the A/B's sides
    a_record = next(s["run_dir"] for s in load(ab_dir / "ab.json")["steps"] if s["args"][0] == "record")
    assert state["records"] == {"knobbed": a_record} and not (d / "record").exists()
    assert [(p["probe"]["kind"], p["probe"]["a"], p["probe"]["b"]) for p in state["probes"]] == [
        ("search", 0, 1), ("search", 0, 2), ("confirm", 1, 2)]
    # Each probe replays only the open row's case.
    for done in state["probes"]:
        steps = load(Path(done["dir"]) / "ab.json")["steps"]
        assert all(len(load(Path(s["run_dir"]) / "results.json")["rows"]) == 1 for s in steps)
    group = load(d / "bisect_report.json")["groups"]
    assert [(g["status"], g["last_good"]["index"], g["first_bad"]["index"]) for g in group] == [("found", 1, 2)]


@pytest.mark.e2e
def test_a_git_range_is_bisected_to_the_commit_that_moved_the_rows(tmp_path):
    # The "compiler" of each commit: a .pth its build installs, which turns the operator's knobs on at
    # start-up where the commit says so (a .pth line that begins with `import` is run).
    repo = tmp_path / "compiler"
    repo.mkdir()
    _git(repo, "init", "-q")
    for i, slow in enumerate(["0", "0", "1", "1"]):
        knobs = "'1'" if slow == "1" else "'0'"
        (repo / "zl_knob.pth").write_text(f"# change {i}\nimport os; os.environ['ZL_TEST_SLOW_SMALL'] = {knobs}; "
                                          f"os.environ['ZL_TEST_SLOW_LARGE'] = {knobs}\n")
        _git(repo, "add", "zl_knob.pth")
        _git(repo, "commit", "-q", "-m", f"change {i}")
    install = "python -c \"import shutil, site; shutil.copy('zl_knob.pth', site.getsitepackages()[0])\""
    proc = measuring_harness("bisect", "--git-range", "HEAD~3..HEAD", "--checkout", repo, "--build-cmd", install,
                             "--build-cache", tmp_path / "cache", "--ops", "knobbed", "--ops-path", KNOBBED,
                             "--backend", "interpreter", "--repeats", "2", "--out", tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = load(bisect_dir_of(proc.stdout) / "bisect_report.json")
    [group] = report["groups"]
    assert group["status"] == "found" and sorted(group["rows"]) == sorted([SMALL, LARGE])
    assert group["first_bad"]["commit"]["sha"] == _git(repo, "rev-parse", "HEAD~1")
    assert group["first_bad"]["commit"]["subject"] == "change 2" and group["last_good"]["commit"]["subject"] == (
        "change 1")
    assert len(list((tmp_path / "cache").glob("*/.complete"))) == len([b for b in report["builds"]
                                                                       if b["status"] == "ok"])


@pytest.mark.e2e
def test_ctrl_c_stops_the_bisect_and_reports_what_was_found_so_far(tmp_path):
    listed = builds_file(tmp_path, small_at=3, large_at=3, n=6)
    proc = measuring_harness("bisect", "--builds", listed, "--ops", "knobbed", "--ops-path", KNOBBED, "--backend",
                             "interpreter", "--repeats", "2", "--run-dir", tmp_path / "bisect", start_new_session=True)
    state_file = tmp_path / "bisect" / "bisect.json"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if state_file.is_file() and load(state_file)["probes"]:
                break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches the foreground group
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode in exits_of(signal.SIGINT), out
    assert "interrupted (SIGINT)" in out and f"--resume {tmp_path / 'bisect'}" in out
    report = load(tmp_path / "bisect" / "bisect_report.json")
    assert report["complete"] is False and len(report["probes"]) == len(load(state_file)["probes"]) >= 1
    assert "INCOMPLETE" in (tmp_path / "bisect" / "bisect.md").read_text()


def test_the_report_names_each_group_by_how_far_its_search_got(tmp_path):
    from reports import bisect_report

    n, rows = 6, rows_of("op a 1", "op a 2", "op a 3", "op a 4")
    answer = moves_at({"op a 1": 2, "op a 2": 4, "op a 3": n, "op a 4": 5})

    def said(probe):
        verdicts = answer(probe)
        if probe.kind == search.CONFIRM and "op a 2" in probe.rows:
            verdicts["op a 2"] = {"verdict": search.SAME, "ratio": 1.0}  # its boundary does not hold up
        return verdicts

    state = search.new(n, rows, 2, 8)
    probes = run_search(state, said, skipped={1, 4})
    spec = {"builds": [{"label": f"b{k}", "commit": None} for k in range(n)], "ops": ["op"], "from_ab": None,
            "repeats": 2, "max_repeats": 8}
    bisect_state = {"spec": spec, "builds": {str(k): {"ok": k not in (1, 4), "reason": "no import" if k in (1, 4)
                                                      else None} for k in range(n)},
                    "probes": [{"probe": p.to_dict(), "dir": str(tmp_path), "verdicts": said(p)} for p in probes],
                    "records": {}, "complete": True}
    data = bisect_report.build(bisect_state, [
        {**vars(r), "between": search.between(r, state.skipped), "open": bool(r.candidates(state.skipped, n))}
        for r in state.rows.values()], state.skipped)
    statuses = {g["rows"][0]: (g["status"], g["last_good"]["index"], g["first_bad"]["index"] if g["first_bad"]
                               else None) for g in data["groups"]}
    # Builds 1 and 4 skipped: rows 1 and 4 found with one untested build before their first bad; row 2's
    # confirm said SAME; row 3 SAME at the last build.
    assert statuses == {"op a 1": ("found among", 0, 2), "op a 2": ("unconfirmed", 3, 5),
                        "op a 3": ("did not move", 5, None), "op a 4": ("found among", 3, 5)}
    text = bisect_report.render_text(data)
    assert "UNCONFIRMED: 1 row(s) moved SLOWER" in text and "untested between" in text
