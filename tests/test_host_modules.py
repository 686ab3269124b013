"""Triton's host modules (its driver's utilities, each signature's launcher) kept from one A/B to the next
per side compiler (harness.core.host_modules): linked into each A/B's side caches, what the steps built
kept as the A/B ends; kernels never kept, and one side's modules never reaching the other's cache."""

import os
from pathlib import Path

from test_ab_steps import Steps, _ab

from harness.core import host_modules, launch
from harness.sessions import ab

SO = "__triton_launcher.cpython-312-x86_64-linux-gnu.so"


def _module(cache: Path, digest: str, name: str = SO) -> Path:
    (cache / digest).mkdir(parents=True)
    (cache / digest / name).write_bytes(digest.encode())
    return cache / digest


def _kernel(cache: Path, digest: str) -> Path:
    (cache / digest).mkdir(parents=True)
    for name in ("add_kernel.json", "add_kernel.cubin", "__grp__add_kernel.json"):
        (cache / digest / name).write_text("{}")
    return cache / digest


def test_only_host_modules_are_kept_each_once_under_its_sides_key(tmp_path):
    cache, root = tmp_path / "A-da", tmp_path / "store"
    _module(cache, "utils", "cuda_utils.cpython-312-x86_64-linux-gnu.so")
    _module(cache, "launcher")
    _kernel(cache, "kernel")
    (cache / "kernel_so").mkdir()  # a kernel's dir whose binary ends in .so too (hsaco aside), beside its metadata
    (cache / "kernel_so" / "k.so").write_bytes(b"")
    (cache / "kernel_so" / "k.json").write_text("{}")
    (cache / "half").mkdir()  # one file, not a module (a kernel's dir as Triton began it)
    (cache / "half" / "add_kernel.json").write_text("{}")
    (cache / "stray.lock").write_text("")  # a file beside the dirs
    assert host_modules.keep(cache, "da", root) == 2
    assert sorted(p.name for p in (root / "da").iterdir()) == ["launcher", "utils"]
    assert (root / "da" / "launcher" / SO).read_bytes() == b"launcher"
    assert host_modules.keep(cache, "da", root) == 0  # kept already
    assert not (root / "db").exists()


def test_a_new_side_cache_links_its_own_sides_kept_modules_only(tmp_path):
    root = tmp_path / "store"
    _module(root / "da", "utils")
    _module(root / "da", "launcher")
    _module(root / "db", "other")
    (root / "da" / ".half.123").mkdir()  # what an A/B killed while keeping left: never linked
    (root / "da" / ".half.123" / SO).write_bytes(b"")
    (root / "da" / "stray").write_text("")  # a file, not a module's dir
    cache = tmp_path / "cache" / "A-da"
    assert host_modules.link(cache, "da", root) == 2
    assert sorted(p.name for p in cache.iterdir()) == ["launcher", "utils"]
    assert (cache / "utils").is_symlink() and (cache / "utils" / SO).read_bytes() == b"utils"
    # A module linked is not kept again, and one already in the cache is not replaced.
    assert host_modules.keep(cache, "da", root) == 0
    assert host_modules.link(cache, "da", root) == 0
    assert host_modules.link(tmp_path / "cache" / "A-dc", "dc", root) == 0  # nothing kept for that compiler


def test_keeping_from_a_cache_never_made_keeps_nothing_and_a_dead_keepers_copy_is_replaced(tmp_path):
    root = tmp_path / "store"
    assert host_modules.keep(tmp_path / "never-made", "da", root) == 0
    cache = tmp_path / "A-da"
    _module(cache, "launcher")
    (root / "da" / f".launcher.{os.getpid()}").mkdir(parents=True)  # a copy begun by a dead A/B of our pid
    assert host_modules.keep(cache, "da", root) == 1
    assert sorted(os.listdir(root / "da")) == ["launcher"]


def test_a_module_kept_meanwhile_by_another_ab_leaves_no_partial_copy(tmp_path, monkeypatch):
    cache, root = tmp_path / "A-da", tmp_path / "store"
    _module(cache, "launcher")
    renamed = Path.rename

    def raced(self, target):  # the other A/B's copy lands first
        _module(root / "da", "launcher")
        return renamed(self, target)

    monkeypatch.setattr(Path, "rename", raced)
    assert host_modules.keep(cache, "da", root) == 0
    assert sorted(os.listdir(root / "da")) == ["launcher"]


def test_an_ab_links_each_sides_kept_modules_and_keeps_what_its_steps_built(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = host_modules.store()
    assert root == tmp_path / "xdg" / "zl_bench" / "triton_host_modules"
    _module(root / "da", "utils")  # built by an earlier A/B of side A's compiler
    steps = Steps(monkeypatch)
    seen = {}

    def run(argv, **how):  # each step finds the cache as Triton would, and builds a module and a kernel in it
        cache = Path(argv[argv.index("--triton-cache") + 1])
        step = Path(argv[argv.index("--run-dir") + 1]).parent.name
        seen[step] = sorted(p.name for p in cache.iterdir())
        if step.endswith(("record", "passes")):
            if not (cache / f"launcher-{step}").exists():  # Triton builds what it does not find
                _module(cache, f"launcher-{step}")
            _kernel(cache, f"kernel-{step}")
        return Steps.run(steps, argv, **how)

    monkeypatch.setattr(launch, "run", run)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\n")) == 0
    assert seen["A-record"] == ["utils"] and seen["B-passes"] == []
    assert seen["A-1"] == ["kernel-A-record", "launcher-A-record", "utils"]
    assert sorted(p.name for p in (root / "da").iterdir()) == ["launcher-A-record", "utils"]
    assert sorted(p.name for p in (root / "db").iterdir()) == ["launcher-B-passes"]
    # The next A/B of these compilers starts with them.
    steps.told.clear()
    seen.clear()
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\n")) == 0
    assert seen["A-record"] == ["launcher-A-record", "utils"]
    assert seen["B-passes"] == ["launcher-B-passes"]


def test_an_ab_whose_store_cannot_be_written_runs_on_and_says_so(tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    steps = Steps(monkeypatch)

    def run(argv, **how):
        cache = Path(argv[argv.index("--triton-cache") + 1])
        step = Path(argv[argv.index("--run-dir") + 1]).parent.name
        if step == "A-record":
            _module(cache, "launcher")
        return Steps.run(steps, argv, **how)

    monkeypatch.setattr(launch, "run", run)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\n")) == 0
    log = next((tmp_path / "runs").glob("ab_*/ab.log")).read_text()
    assert "side A: 0 of its Triton host modules linked" in log
    assert "side A: its Triton host modules not kept ([Errno 20] Not a directory" in log


def test_an_ab_whose_kept_modules_cannot_be_linked_builds_them_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    steps = Steps(monkeypatch)

    def unlinkable(cache, key, root=None):
        raise PermissionError(13, "Permission denied", str(cache))

    monkeypatch.setattr(host_modules, "link", unlinkable)
    assert ab.run_from_args(_ab(tmp_path, "ops: [add]\nrepeats: 2\n")) == 0
    assert len(steps.told) == 6
    log = next((tmp_path / "runs").glob("ab_*/ab.log")).read_text()
    for side in ("A", "B"):
        assert f"side {side}: its kept Triton host modules not linked ([Errno 13] Permission denied: " in log
        assert f"-d{side.lower()}'): its steps build them\n" in log
