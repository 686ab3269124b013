"""A/B kernel reuse: one Triton cache per side, keyed by that side's compiler identity and
environment, given to every step of that side (A's record and replays, B's replays) and to no
step of the other side; removed when the A/B ends."""

from pathlib import Path

import pytest
from conftest import load, run_harness

from harness.core import forkserver, identity, launch
from harness.core.options import RunOptions
from harness.sessions import ab


def argv_cache(argv):
    return argv[argv.index("--triton-cache") + 1] if "--triton-cache" in argv else None


@pytest.mark.parametrize("step_start", ["fork", "prewarmed", "fresh"])
def test_each_side_reuses_its_own_cache_across_its_steps_and_never_the_others(tmp_path, monkeypatch, step_start):
    steps = []

    def run(argv, **kwargs):
        named = Path(argv[argv.index("--run-dir") + 1])
        named.mkdir(parents=True)
        (named / "run.json").write_text("{}")
        # fork, prewarmed: the side's environment is its warm worker's, which forks the step.
        env = kwargs["env"] if step_start == "fresh" else kwargs["starter"].__self__.env
        steps.append((env, argv))
        return 0, None

    monkeypatch.setattr(launch, "run", run)
    begun = []  # launch.run is faked: no worker need run (the A/B begins both as it starts)
    monkeypatch.setattr(forkserver.Worker, "begin", lambda worker: begun.append(worker.env))
    plan = ab.Plan(name="t", ops=["softmax"], a=ab.Side("A", "a"), b=ab.Side("B", "b", env={"SWITCH": "1"}),
                   repeats=2, options=RunOptions(backend="interpreter"), step_start=step_start)
    runner = ab.Runner(plan, tmp_path)
    runner.run()
    by_side = {}
    for env, argv in steps:
        by_side.setdefault("B" if env.get("SWITCH") else "A", set()).add(argv_cache(argv))
    assert len(steps) == 6  # A records (with A's passes), B's passes, then A B A B
    # fork: both sides' workers, as the A/B starts; prewarmed: one a step, all before the first
    assert len(begun) == {"fork": 2, "prewarmed": 6, "fresh": 0}[step_start]
    (cache_a,), (cache_b,) = by_side["A"], by_side["B"]
    assert cache_a != cache_b and None not in (cache_a, cache_b)
    keys = runner.state["triton_caches"]
    assert Path(cache_a).name == f"A-{keys['A']['digest']}" and Path(cache_b).name == f"B-{keys['B']['digest']}"
    assert keys["A"]["triton"]["files_digest"] and keys["B"]["env"] == {"SWITCH": "1"}
    root = Path(cache_a).parent
    runner.close()
    runner.log.close()
    assert not root.exists()


def test_the_cache_key_follows_the_compiler_build_and_the_switches(monkeypatch):
    plain = ab.side_compiler_key(ab.Side("A", ""))
    assert plain == ab.side_compiler_key(ab.Side("B", "other label"))
    assert plain["digest"] != ab.side_compiler_key(ab.Side("A", "", env={"TRITON_X": "1"}))["digest"]
    monkeypatch.setattr(identity, "files_digest", lambda root: "rebuilt")
    assert plain["digest"] != ab.side_compiler_key(ab.Side("A", ""))["digest"]


def test_the_key_names_the_triton_the_sides_environment_imports(tmp_path):
    # A side whose env puts another Triton build first on the path: its key must name that build.
    other = tmp_path / "other_build" / "triton"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    key = ab.side_compiler_key(ab.Side("B", "", env={"PYTHONPATH": str(other.parent)}))
    assert key["triton"]["path"] == str(other)


def test_a_side_whose_python_cannot_say_its_triton_gets_no_shared_cache_and_the_log_says_why(tmp_path):
    plan = ab.Plan(name="t", ops=["add"], a=ab.Side("A", "a"), b=ab.Side("B", "b", python="/bin/false"),
                   repeats=2, options=RunOptions(backend="interpreter"))
    runner = ab.Runner(plan, tmp_path)
    runner._open_caches()
    runner.log.close()
    assert set(runner.caches) == {"A"} and set(runner.state["triton_caches"]) == {"A"}
    assert "side B: no kernel reuse across its steps: its Triton could not be identified (/bin/false exited 1)" \
        in (tmp_path / "ab.log").read_text()
    runner.close()


# Stands in for a kernel compiled into the run's Triton cache: a new entry the first time, found there after.
COMPILES_ONCE = '''
import os
import torch
from ops import Operator

def _compiled(x):
    os.makedirs(os.path.join(os.environ["TRITON_CACHE_DIR"], "standin_kernel_key"), exist_ok=True)
    return x * 3

compiles_once = Operator(name="compiles_once", inputs=lambda shape, dtype, device: (torch.ones(*shape, dtype=dtype),),
                         baseline=lambda x: x * 3, candidate=_compiled, dtypes=("fp32",), shape_keys=("pointwise",))
'''


def test_a_run_says_how_many_entries_it_wrote_into_its_triton_cache(tmp_path):
    # A replay that compiled (a kernel its record should have left in the side's cache) is seen in its run.json.
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "compiles_once.py").write_text(COMPILES_ONCE)
    (tmp_path / "shapes.yaml").write_text("compiles_once:\n  shapes: [[8], [16]]\n")
    cache = tmp_path / "cache"
    record = run_harness("record", "compiles_once", "--backend", "interpreter", "--ops-path", tmp_path / "ops",
                         "--shapes", tmp_path / "shapes.yaml", "--triton-cache", cache, "--run-dir", tmp_path / "r")
    assert record.returncode == 0, record.stdout + record.stderr
    (cache / "found_before").mkdir()  # an entry another run wrote
    replay = run_harness("replay", tmp_path / "r", "--timing-only", "--triton-cache", cache, "--run-dir",
                         tmp_path / "r2")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    private = run_harness("replay", tmp_path / "r", "--timing-only", "--run-dir", tmp_path / "r3")
    assert private.returncode == 0, private.stdout + private.stderr
    written = [load(tmp_path / name / "run.json")["observed"]["triton_cache_written"] for name in ("r", "r2", "r3")]
    assert written == [1, 0, 1]
