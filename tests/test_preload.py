"""A FlagGems checkout's package imported once by each warm worker, for every step it forks (issue 45):
counted by the stand-in checkout (it writes its importer's pid where ZL_TEST_FLAGGEMS_IMPORTS says), each
step's LibTuner cache its own run's, a run the preload does not fit started fresh and said, an import
that fails or asks the device for more than its facts leaving nothing behind, and CUDA's facts stood in
without initializing CUDA (a CPU torch: any initialization raises)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, load

import backends
import backends.cuda
import harness.child.runner  # noqa: F401  (a warm step's process has it: its child is forked)
from harness import worker
from harness.core import forkserver
from harness.core.spec import FlagGemsOptions
from harness.providers import flaggems
from harness.sessions import run

CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"
SHAPES = ("BlasBenchmark:\n  shapes: [[1, 4, 8, 4]]\nsoftmax:\n  shapes: [[4, 32]]\n  dtypes: [fp32]\n"
          "pointwise:\n  shapes: [[64]]\n  dtypes: [fp32]\n")


def _harness(tmp_path: Path, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "USE_FLAGTUNE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["ZL_TEST_FLAGGEMS_IMPORTS"] = str(tmp_path / "imports")
    (tmp_path / "shapes.yaml").write_text(SHAPES)
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args), "--backend", "interpreter",
                           "--flaggems-dir", CHECKOUT, "--shapes", tmp_path / "shapes.yaml", "--out", tmp_path / "out"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _importers(tmp_path: Path) -> list[int]:
    path = tmp_path / "imports"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _preloading_workers(log: str) -> set[int]:
    return {int(line.split()[1].rstrip(":")) for line in log.splitlines()
            if line.startswith("worker ") and " flag_gems preloaded from " in line}


@pytest.mark.e2e
def test_an_ab_imports_the_package_once_per_side_and_each_step_keeps_its_own_libtuner_cache(tmp_path):
    proc = _harness(tmp_path, "ab", "--ops", "flaggems:mm", "builtin:add", "--repeats", "2", "--step-start", "fork")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ab_dir = next((tmp_path / "out").glob("ab_*"))
    workers = _preloading_workers((ab_dir / "ab.log").read_text())
    assert len(workers) == 2  # one worker a side, each importing it once
    assert sorted(_importers(tmp_path)) == sorted(workers)  # and no step's child imported it again
    steps = sorted((ab_dir / "flaggems-mm").glob("*/*/run.json"))
    assert len(steps) == 6  # A's record (with A's passes), B's passes, 2 repeats a side
    for run_json in steps:
        facts = load(run_json)["observed"]["flaggems"]
        assert facts["preloaded"] is True
        # The worker's import opened a cache of its own: each run's LibTuner reads its run's private one.
        assert facts["libtuner_cache"]["url"] == f"sqlite:///{run_json.parent / 'libtuner_cache.db'}"
    builtin = sorted((ab_dir / "builtin-add").glob("*/*/run.json"))
    assert len(builtin) == 6 and all("flaggems" not in load(p).get("observed", {}) for p in builtin)


@pytest.mark.e2e
@pytest.mark.parametrize("op_start", ["fork", "fresh"])
def test_a_batchs_device_worker_imports_the_package_for_all_its_ops(tmp_path, op_start):
    proc = _harness(tmp_path, "batch", "--ops", "flaggems:mm", "flaggems:softmax", "--devices", "0",
                    "--op-start", op_start)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    batch_dir = next((tmp_path / "out").glob("batch_*"))
    records = sorted(batch_dir.glob("ops/*/attempt1/*/run.json"))
    assert len(records) == 2
    preloaded = [load(p)["observed"]["flaggems"]["preloaded"] for p in records]
    if op_start == "fork":
        workers = _preloading_workers((batch_dir / "workers.log").read_text())
        assert len(workers) == 1 and _importers(tmp_path) == sorted(workers)
        assert preloaded == [True, True]
    else:  # each op's own process imports it, as upstream's pytest does
        assert len(_importers(tmp_path)) == 2 and preloaded == [False, False]


def _checkout(tmp_path: Path, init: str) -> Path:
    package = tmp_path / "checkout" / "src" / "flag_gems"
    (package / "sub").mkdir(parents=True)
    (tmp_path / "checkout" / "benchmark").mkdir()
    (package / "sub" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from flag_gems import sub  # noqa\n" + init)
    return tmp_path / "checkout"


@pytest.fixture
def clean_preload(monkeypatch):
    monkeypatch.setattr(flaggems, "PRELOADED", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    for key in ("GEMS_VENDOR", "USE_FLAGTUNE", "FLAGGEMS_DB_URL"):
        monkeypatch.delenv(key, raising=False)
    yield
    for name in [m for m in sys.modules if m == "flag_gems" or m.startswith("flag_gems.")]:
        del sys.modules[name]


def test_a_preload_imports_under_the_runs_switches_and_puts_the_environment_back(tmp_path, clean_preload):
    seen = tmp_path / "seen.json"
    root = _checkout(tmp_path, "import json, os, pathlib\npathlib.Path(" + repr(str(seen)) + ").write_text(json.dumps("
                               "{k: os.environ.get(k) for k in ('GEMS_VENDOR', 'USE_FLAGTUNE', 'FLAGGEMS_DB_URL')}))\n")
    done = flaggems.preload(root, "1", "nvidia", backends.get("interpreter").facts_standing_in({}), tmp_path)
    assert done == flaggems.Preloaded("flag_gems", str(root / "src"), "1")
    assert json.loads(seen.read_text()) == {"GEMS_VENDOR": "nvidia", "USE_FLAGTUNE": "1",
                                            "FLAGGEMS_DB_URL": f"sqlite:///{tmp_path / flaggems.IMPORT_DB}"}
    assert not any(k in os.environ for k in ("GEMS_VENDOR", "USE_FLAGTUNE", "FLAGGEMS_DB_URL"))
    assert flaggems.PRELOADED == {"flag_gems": done} and "flag_gems.sub" in sys.modules


def test_a_preload_that_fails_leaves_no_module_path_or_environment_behind(tmp_path, clean_preload):
    root = _checkout(tmp_path, "raise RuntimeError('broken at import')\n")
    before = list(sys.path)
    with pytest.raises(RuntimeError, match="broken at import"):
        flaggems.preload(root, "0", "nvidia", backends.get("interpreter").facts_standing_in({}), tmp_path)
    assert not [m for m in sys.modules if m.startswith("flag_gems")]  # its submodule too: a step imports it whole
    assert sys.path == before and flaggems.PRELOADED == {}
    assert not any(k in os.environ for k in ("GEMS_VENDOR", "USE_FLAGTUNE", "FLAGGEMS_DB_URL"))


def _options(root: Path, flagtune: str = "0") -> FlagGemsOptions:
    return FlagGemsOptions(repo="flaggems", root=str(root), test_file="benchmark/test_mm.py", function="test_mm",
                           flagtune=flagtune)


def test_a_run_fits_what_was_preloaded_only_from_the_same_sources_and_switch(tmp_path, monkeypatch):
    monkeypatch.setattr(flaggems, "PRELOADED", {})
    assert flaggems.preload_misfit(_options(CHECKOUT)) is None  # nothing preloaded: the child imports it
    flaggems.PRELOADED["flag_gems"] = flaggems.Preloaded("flag_gems", str(CHECKOUT / "src"), "0")
    assert flaggems.preload_misfit(None) is None  # a built-in op
    assert flaggems.preload_misfit(_options(CHECKOUT)) is None
    assert flaggems.preload_misfit(_options(CHECKOUT, "1")) == (
        "flag_gems was preloaded with USE_FLAGTUNE=0, this run has 1")
    other = _checkout(tmp_path, "")
    assert flaggems.preload_misfit(_options(other)) == (
        f"flag_gems was preloaded from {CHECKOUT / 'src'}, this run's checkout is {other}")


def test_a_step_whose_run_does_not_fit_the_preload_execs_its_child_and_says_why(monkeypatch):
    loaded = flaggems.Preloaded("flag_gems", str(CHECKOUT / "src"), "0")
    monkeypatch.setattr(flaggems, "PRELOADED", {"flag_gems": loaded})
    said = []
    tee = type("Tee", (), {"write": lambda self, text: said.append(text)})()
    spec = type("Spec", (), {"flaggems": _options(CHECKOUT, "1")})()
    assert run._forked_child(Path("/nonexistent"), spec, tee) is None
    assert said == ["the child starts fresh: flag_gems was preloaded with USE_FLAGTUNE=0, this run has 1\n"]
    spec.flaggems = _options(CHECKOUT)
    assert run._forked_child(Path("/nonexistent"), spec, tee) is not None and len(said) == 1


def test_a_step_rebinds_the_preloaded_libtuner_cache_in_place(tmp_path, monkeypatch):
    class LibCache:
        def __init__(self, url=None):
            self.db_url = url or "sqlite:///home/.flaggems/cache.db"

    cache = LibCache("sqlite:///worker/import.db")
    libentry = type(sys)("flag_gems.utils.libentry")
    libentry.libcache = cache
    monkeypatch.setitem(sys.modules, "flag_gems.utils.libentry", libentry)
    monkeypatch.setattr(flaggems, "PRELOADED", {})
    assert flaggems.rebind_libtuner_cache("sqlite:///run/a.db") is False  # nothing preloaded: nothing to rebind
    flaggems.PRELOADED["flag_gems"] = flaggems.Preloaded("flag_gems", "src", "0")
    assert flaggems.rebind_libtuner_cache("sqlite:///run/a.db") is True
    assert libentry.libcache is cache and cache.db_url == "sqlite:///run/a.db"  # LibTuner's reference holds
    flaggems.rebind_libtuner_cache(None)  # --libtuner-cache user: FlagGems' own, as its import would open it
    assert cache.db_url == "sqlite:///home/.flaggems/cache.db"


def test_a_worker_preloads_the_checkouts_its_steps_come_from(monkeypatch):
    monkeypatch.delenv("USE_FLAGTUNE", raising=False)
    dirs = (f"flaggems={CHECKOUT}", f"vllm={CHECKOUT}")
    assert flaggems.preload_for(["builtin:add", "softmax"], dirs, None, None) is None
    assert flaggems.preload_for(["builtin:add", "vllm:mm"], dirs, "1", 2) == forkserver.Preload(
        (str(CHECKOUT),), "1", 2)
    monkeypatch.setenv("USE_FLAGTUNE", "1")  # as a step resolves an unset --flagtune
    assert flaggems.preload_for(["benchmark/test_mm.py::test_mm"], dirs, None, None) == forkserver.Preload(
        (str(CHECKOUT),), "1", None)  # a node may be of any checkout: each once
    assert forkserver.Preload((str(CHECKOUT),), "1", 2).to_argv() == [
        "--device", "2", "--flagtune", "1", "--preload", str(CHECKOUT)]


def test_cudas_facts_stand_in_for_the_device_and_anything_else_raises():
    torch = pytest.importorskip("torch")
    facts = {"count": 1, "current_device": 0, "name": "NVIDIA H200", "capability": [9, 0],
             "properties": {"name": "NVIDIA H200", "major": 9, "minor": 0, "multi_processor_count": 132,
                            "shared_memory_per_block_optin": 232448}}
    originals = {name: getattr(torch.cuda, name) for name in backends.cuda._STOOD_IN}
    with backends.get("cuda").facts_standing_in(facts):
        assert torch.cuda.get_device_capability() == (9, 0) and torch.cuda.get_device_name(0) == "NVIDIA H200"
        assert torch.cuda.current_device() == 0 and torch.cuda.device_count() == 1
        assert torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin == 232448
        with pytest.raises(backends.DeviceTouched):
            torch.cuda.synchronize()  # any device work initializes CUDA first
    assert {name: getattr(torch.cuda, name) for name in originals} == originals
    assert not torch.cuda.is_initialized()


def test_a_worker_whose_facts_cannot_be_read_or_whose_import_asks_too_much_preloads_nothing(
        tmp_path, clean_preload, capsys, monkeypatch):
    args = worker._parse(["3", "interpreter", "--preload", str(_checkout(tmp_path, ""))])

    def facts(code: int, out: str = "", err: str = ""):
        return type("Facts", (), {"returncode": code, "communicate": lambda self: (out, err)})()

    assert worker._read_facts(args.facts_file, facts(1, err="RuntimeError: no CUDA GPUs are available\n")) is None
    assert "nothing preloaded: the device facts could not be read (exit 1)" in capsys.readouterr().err
    assert flaggems.PRELOADED == {}

    def touched():
        raise backends.DeviceTouched("asked for more")

    interpreter = backends.get("interpreter")
    monkeypatch.setattr(backends, "get", lambda name: type(interpreter)(**{
        **{f: getattr(interpreter, f) for f in interpreter.__dataclass_fields__},
        "facts_standing_in": lambda facts: _raising(touched)}))
    read = worker._read_facts(args.facts_file, facts(0, out=json.dumps({}) + "\n"))
    worker._preload(args.backend, args.preload, args.flagtune, read, tmp_path)
    assert "not preloaded (DeviceTouched: asked for more); its steps import it themselves" in capsys.readouterr().err
    assert flaggems.PRELOADED == {} and "flag_gems" not in sys.modules


class _raising:
    def __init__(self, call):
        self.call = call

    def __enter__(self):
        self.call()

    def __exit__(self, *exc):
        return False


def test_the_worker_says_its_facts_as_json_from_a_process_of_its_own():
    done = subprocess.run([sys.executable, "-m", "harness.worker", "facts", "interpreter"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) == {}


def test_the_facts_are_read_with_only_the_steps_device_visible(monkeypatch):
    started = []
    monkeypatch.setattr(worker.subprocess, "Popen", lambda argv, env, **kw: started.append((argv, env)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")  # another vendor's key: dropped, as for a step's child
    worker._start_facts("cuda", 3)
    worker._start_facts("cuda", None)  # no --device: the first visible one, as a step resolves it
    assert [argv[1:] for argv, _ in started] == [["-m", "harness.worker", "facts", "cuda"]] * 2
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in started] == ["3", "2"]
    assert not any("HIP_VISIBLE_DEVICES" in env for _, env in started)
    assert all(env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO) for _, env in started)


def test_a_sides_first_worker_keeps_the_facts_it_read_and_the_next_reads_them_instead(tmp_path, capsys):
    kept = tmp_path / "A-device-facts.json"
    args = worker._parse(["3", "cuda", "--facts-file", str(kept), "--preload", str(CHECKOUT)])
    assert worker._kept_facts(args.facts_file) is None  # the first: none kept yet
    reader = type("Facts", (), {"returncode": 0, "communicate": lambda self: ('{"count": 1}\n', "")})()
    assert worker._read_facts(args.facts_file, reader) == {"count": 1}
    assert worker._kept_facts(args.facts_file) == {"count": 1}  # the next worker's, with no reader of its own
    failed = type("Facts", (), {"returncode": 1, "communicate": lambda self: ("", "no device\n")})()
    kept.unlink()
    assert worker._read_facts(args.facts_file, failed) is None and not kept.exists()
    assert "nothing preloaded: the device facts could not be read (exit 1)" in capsys.readouterr().err
    assert worker._kept_facts(worker._parse(["3", "cuda"]).facts_file) is None  # no file named: each reads its own


def test_a_second_checkout_of_the_same_package_is_left_to_its_steps(tmp_path, clean_preload):
    first = _checkout(tmp_path / "one", "")
    second = _checkout(tmp_path / "two", "")
    standing_in = backends.get("interpreter").facts_standing_in
    done = flaggems.preload(first, "0", None, standing_in({}), tmp_path)
    assert flaggems.preload(first, "0", None, standing_in({}), tmp_path) is done  # named twice: imported once
    with pytest.raises(flaggems.FlagGemsError, match="flag_gems is imported here already, from .*one"):
        flaggems.preload(second, "0", None, standing_in({}), tmp_path)
    assert flaggems.PRELOADED == {"flag_gems": done}
    # Its runs do not fit what was preloaded: their children start fresh and import their own.
    assert flaggems.preload_misfit(_options(second)) == (
        f"flag_gems was preloaded from {first / 'src'}, this run's checkout is {second}")


# FlagGems' own shape (flag_gems/utils/libentry.py): one LibCache read as a module global, and every LibTuner,
# made as its kernel module is imported, holding the config cache of its table taken from it then.
LIBENTRY = """
class Model:
    def __init__(self, url):
        self.url = url


class ConfigCache:
    def __init__(self, table, model):
        self.table, self.model = table, model


class LibCache:
    _instance = None

    def __new__(cls, *args, **kwargs):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __init__(self, db_url=None):
        self.db_url = db_url or "sqlite:///home/.flaggems/cache.db"
        self.model = Model(self.db_url)

    def __getitem__(self, table):
        return ConfigCache(table, self.model)


libcache = LibCache(__import__("os").environ.get("FLAGGEMS_DB_URL"))


class LibTuner:
    def __init__(self, name):
        self.config_table_name = f"{name}_table"
        self.cache = libcache[self.config_table_name]


mm_tuner = LibTuner("mm")
"""


def test_every_libtuner_made_at_the_preload_reads_and_writes_the_runs_own_cache(tmp_path, clean_preload):
    root = _checkout(tmp_path, "from flag_gems.utils import libentry  # noqa\n")
    (root / "src" / "flag_gems" / "utils").mkdir()
    (root / "src" / "flag_gems" / "utils" / "__init__.py").write_text("")
    (root / "src" / "flag_gems" / "utils" / "libentry.py").write_text(LIBENTRY)
    flaggems.preload(root, "0", None, backends.get("interpreter").facts_standing_in({}), tmp_path)
    libentry = sys.modules["flag_gems.utils.libentry"]
    assert libentry.mm_tuner.cache.model.url == f"sqlite:///{tmp_path / flaggems.IMPORT_DB}"  # the worker's scratch
    assert flaggems.rebind_libtuner_cache("sqlite:///run/libtuner_cache.db")
    assert libentry.libcache.db_url == "sqlite:///run/libtuner_cache.db"
    # The tuner's winners go to, and come from, the run's private cache: not the scratch file every step shares.
    assert libentry.mm_tuner.cache.model.url == "sqlite:///run/libtuner_cache.db"
    assert libentry.mm_tuner.cache.table == "mm_table"
