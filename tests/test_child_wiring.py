"""The child's plugins are wired in one place (harness.child.runner.build_plugins) and talk through
declared hooks (harness.child.hookspec), so the order they are listed in cannot break a run."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, load, run_dir_of

import backends
from harness.child import context, runner
from harness.child.plugins import ir
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.providers import shapes

CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"
MM_KERNEL = "flag_gems.ops.mm_kernel"
# The child, with build_plugins' list put in another order; everything else as `python -m harness.child`.
CHILD = """
import sys
from harness.child import runner
listed = runner.build_plugins
runner.build_plugins = lambda ctx, guard: listed(ctx, guard)[::{step}]
sys.exit(runner.main(sys.argv[1:]))
"""
ORDERS = {"listed": 1, "reversed": -1}


def ordered(plugins: list, order: str) -> list:
    return plugins[::ORDERS[order]]


def flaggems_run_dir(tmp_path):
    """A FlagGems record's run dir as the session leaves it for the child: mm over two tiny shapes."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rundir.SHAPES_YAML).write_text("BlasBenchmark:\n  shapes: [[1, 4, 8, 4], [1, 16, 16, 8]]\n")
    options = spec_mod.FlagGemsOptions("flaggems", str(CHECKOUT), "benchmark/test_mm.py", "test_mm",
                                       shapes_file=str(run_dir / rundir.SHAPES_YAML))
    spec_mod.write(run_dir, spec_mod.RunSpec(
        op="mm", backend="interpreter", mode="record", device=0, dtypes=[], shapes_source=options.shapes_file,
        timer="host", warmup_ms=0.0, rep_ms=0.0, provider="flaggems:flaggems", flaggems=options))
    return run_dir


@pytest.mark.e2e
@pytest.mark.parametrize("order", ORDERS)
def test_a_flaggems_child_runs_whatever_the_order_of_its_plugins(tmp_path, order):
    # The FlagGems plugin drives three others: the timer (upstream's get_latency), the autotune
    # patch (LibTuner, hooked once flag_gems is imported) and the results; each case start
    # reaches them all.
    run_dir = flaggems_run_dir(tmp_path)
    env = backends.get("interpreter").visibility_env(0, os.environ)
    # The checkout first, then what this process was given (the session's .nox/deps).
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
               TRITON_CACHE_DIR=str(tmp_path / "triton_cache"))
    proc = subprocess.run([sys.executable, "-c", CHILD.format(step=ORDERS[order]), str(run_dir)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = load(run_dir / rundir.RESULTS_JSON)["rows"]
    assert [r["case"] for r in rows] == ["fp32-4x4,4x8", "fp32-16x8,8x16"]
    assert all(r["status"] == "SUCCESS" and r["timer"] == "host" and r["candidate_ms"] > 0 for r in rows)
    assert all(r["configs"][MM_KERNEL].startswith("BM=") for r in rows)
    observed = load(run_dir / rundir.RUN_JSON)["observed"]
    assert observed["flaggems"]["libtuner_hooked"] and observed["autotune"]["recorded"] == 2
    assert observed["outcome"]["status"] == "COMPLETE" and observed["running_case"] is None


class ShapeLog:
    """Stands in for the IR collector (the interpreter compiles nothing, so the IR plugin switches
    itself off): keeps every shape label it is told."""

    def __init__(self):
        self.told = []

    @property
    def shape(self):
        return self.told[-1] if self.told else None

    @shape.setter
    def shape(self, label):
        self.told.append(label)


@pytest.mark.parametrize("order", ORDERS)
def test_a_case_start_reaches_the_ir_collector_whatever_the_order(tmp_path, order):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec_mod.write(run_dir, spec_mod.RunSpec(op="softmax", backend="interpreter", mode="record", device=0,
                                             dtypes=["fp32"], shapes_source="x"))
    shapes.write_used(run_dir / rundir.SHAPES_YAML, "softmax", [[2, 8]], ["fp32"], "x")
    ctx = context.RunContext.load(run_dir, say=lambda *lines: None)
    plugins = runner.build_plugins(ctx, runner.StopGuard(None, run_dir))
    (ir_plugin,) = [p for p in plugins if isinstance(p, ir.IRPlugin)]
    ir_plugin.collector = ShapeLog()
    # As pytest registers the plugins it is given: the declared hooks arrive through pytest_addhooks.
    manager = pytest.PytestPluginManager()
    manager.hook.pytest_addhooks.call_historic(kwargs={"pluginmanager": manager})
    for plugin in ordered(plugins, order):
        manager.register(plugin)
    ctx.begin_case(manager.hook, "fp32-2x8", "2x8")
    ctx.begin_case(manager.hook, "test_mm")  # a test that is not one of our cases: no shape to file IR under
    assert ir_plugin.collector.told == ["2x8"]
    assert load(run_dir / rundir.RUN_JSON)["observed"]["running_case"] == "test_mm"


CHECKOUT = Path(__file__).parent / "resources" / "flaggems_checkout"


@pytest.mark.e2e
@pytest.mark.parametrize("op", ["softmax", "flaggems:mm"])  # our cases, and a checkout's benchmark with its conftest
def test_a_plugin_the_users_env_autoloads_stays_out_of_the_child(harness, tmp_path, monkeypatch, op):
    # An installed pytest11 plugin (pytest-randomly reorders and reseeds; hypothesis imports itself
    # into every step) is loaded by every pytest that autoloads; ours must not.
    site = tmp_path / "site"
    dist = site / "zl_fake_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zl-fake-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nzl_fake = zl_fake_plugin\n")
    loaded = tmp_path / "loaded"
    (site / "zl_fake_plugin.py").write_text(f"open({str(loaded)!r}, 'w').close()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    probe = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(tmp_path / "test_nothing.py")], capture_output=True, text=True, cwd=tmp_path)
    assert probe.returncode == 0 and loaded.exists(), f"the fake plugin is not where pytest looks: {probe.stdout}"
    loaded.unlink()
    shapes_file = tmp_path / "shapes.yaml"
    shapes_file.write_text("softmax:\n  shapes: [[4, 32]]\n  dtypes: [fp32]\n"
                           "BlasBenchmark:\n  shapes: [[1, 4, 8, 4]]\n")
    proc = harness("record", op, "--backend", "interpreter", "--shapes", shapes_file, "--flaggems-dir", CHECKOUT,
                   "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "record ok: 1/" in proc.stdout
    assert not loaded.exists()


def _context(backend) -> context.RunContext:
    said = []
    ctx = context.RunContext(Path("/nonexistent"), None, backend, None, [], say=said.append)
    return ctx, said


def test_a_dtype_the_backend_miscomputes_is_probed_once_and_said_once():
    probed = []

    def problem(dtype):
        probed.append(dtype)
        return "its runtime has no bf16" if dtype == "bf16" else None

    ctx, said = _context(dataclasses.replace(backends.get("interpreter"), dtype_problem=problem))
    assert [ctx.dtype_problem(d) for d in ("bf16", "fp32", "bf16", "fp32")] == [
        "its runtime has no bf16", None, "its runtime has no bf16", None]
    assert probed == ["bf16", "fp32"]
    assert said == ["known limitation of backend 'interpreter': its runtime has no bf16; its bf16 rows are SKIPPED "
                    f"(marker {context.DTYPE_MISCOMPUTED}), not failed"]


@pytest.mark.parametrize("name", [n for n in backends.NAMES if n != "interpreter"])
def test_no_device_backend_excuses_a_dtype(name):
    # A wrong result on a device is the kernel's: never skipped as the backend's limitation.
    ctx, _ = _context(backends.get(name))
    assert ctx.dtype_problem("bf16") is None


@pytest.mark.e2e
def test_interpreter_bf16_rows_are_skipped_as_its_known_limitation_not_failed(harness, tmp_path):
    proc = harness("record", "softmax", "--backend", "interpreter", "--dtypes", "bf16,fp32", "--out", tmp_path)
    if backends.get("interpreter").dtype_problem("bf16") is None:
        pytest.skip("this Triton's interpreter computes bf16 right")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("known limitation of backend 'interpreter': Triton ") == 1
    rows = load(run_dir_of(proc) / rundir.RESULTS_JSON)["rows"]
    assert {(r["dtype"], r["status"]) for r in rows} == {("bf16", "SKIPPED"), ("fp32", "SUCCESS")}
    assert all(r["markers"] == [f"{context.DTYPE_MISCOMPUTED} dtype=bf16"] for r in rows if r["dtype"] == "bf16")
