"""Nothing the harness writes in a run or batch dir goes through a link (issue 47, item 5): each file it
writes or appends is opened without following a final symlink (rundir.open_write), each dir it makes
is created or found as a real dir, never adopted through a link (rundir.make_dir), and a refusal is
one line naming the path. Real symlinks, FIFOs and hard links, planted where the harness writes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, harness_env

from harness.core import batchdir, rundir

OPS = REPO / "tests" / "resources" / "batch_ops"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file outside the run dir that a planted link points at: it must never change."""
    target = tmp_path / "outside.txt"
    target.write_text("precious\n")
    return target


@pytest.mark.parametrize("how", ["a", "w", "x", "a+"])
def test_a_symlink_at_a_file_written_is_refused_and_its_target_untouched(tmp_path, outside, how):
    link = tmp_path / "run" / "batch.log"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(OSError) as raised:
        rundir.open_write(link, how)
    assert str(raised.value) in (f"refusing to write through a symlink: {link}", f"[Errno 17] File exists: '{link}'")
    assert outside.read_text() == "precious\n" and link.is_symlink()


def test_a_dangling_symlink_is_not_followed_to_create_its_target(tmp_path):
    target = tmp_path / "elsewhere" / "made.txt"
    target.parent.mkdir()
    link = tmp_path / "run.log"
    link.symlink_to(target)
    with pytest.raises(rundir.LinkRefused, match=f"symlink: {link}$"):
        rundir.open_write(link)
    assert not target.exists()


def test_a_fifo_at_a_file_written_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "batch.log"
    os.mkfifo(fifo)
    with pytest.raises(rundir.LinkRefused, match=f"a FIFO: {fifo}$"):
        rundir.open_write(fifo)  # a blocking open would wait here for a reader that never comes


def test_a_hard_link_to_another_file_is_refused(tmp_path, outside):
    planted = tmp_path / "batch.log"
    os.link(outside, planted)
    with pytest.raises(rundir.LinkRefused, match=f"a hard link: {planted}$"):
        rundir.open_write(planted)
    assert outside.read_text() == "precious\n"


def test_an_atomic_write_replaces_a_link_at_its_path_and_never_writes_through_it(tmp_path, outside):
    path = tmp_path / "run.json"
    path.symlink_to(outside)
    rundir.atomic_write_json(path, {"spec": 1})
    assert not path.is_symlink() and json.loads(path.read_text()) == {"spec": 1}
    assert outside.read_text() == "precious\n"


def test_an_atomic_write_never_writes_through_a_link_at_its_temporary_name(tmp_path, outside):
    path = tmp_path / "results.json"
    (tmp_path / f".results.json.{os.getpid()}.tmp").symlink_to(outside)
    rundir.atomic_write_text(path, "rows\n")
    assert path.read_text() == "rows\n" and outside.read_text() == "precious\n"


def test_an_atomic_write_into_a_dir_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    linked = tmp_path / "autotune_records"
    linked.symlink_to(real, target_is_directory=True)
    with pytest.raises(rundir.LinkRefused, match=f"symlink as a dir: {linked}$"):
        rundir.atomic_write_json(linked / "meta.json", {})
    assert list(real.iterdir()) == []


def test_a_merge_refuses_a_link_planted_at_its_lock(tmp_path, outside):
    (tmp_path / ".run.json.lock").symlink_to(outside)
    with pytest.raises(rundir.LinkRefused, match=r"\.run\.json\.lock$"):
        rundir.merge_json(tmp_path / "run.json", {"observed": {}})
    assert outside.read_text() == "precious\n" and not (tmp_path / "run.json").exists()


def test_a_dir_planted_as_a_link_is_refused_not_adopted(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    batch_dir = tmp_path / "batch"
    (batch_dir / "ops").mkdir(parents=True)
    planted = batchdir.op_dir(batch_dir, "builtin:add@add")
    planted.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(rundir.LinkRefused, match=f"symlink as a dir: {planted}$"):
        rundir.make_dir(planted / "attempt1", under=batch_dir)
    assert list(elsewhere.iterdir()) == []
    made = rundir.make_dir(batchdir.op_dir(batch_dir, "builtin:mul@mul") / "attempt1", under=batch_dir)
    assert made.is_dir() and not made.is_symlink()


def test_a_named_run_dir_that_is_a_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    named = tmp_path / "attempt1" / "add_20260101-000000"
    named.parent.mkdir()
    named.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(rundir.LinkRefused, match=f"symlink as a dir: {named}$"):
        rundir.claim_named_dir(named, rundir.RUN_LOG)
    assert list(elsewhere.iterdir()) == []


def test_the_batch_owner_lock_refuses_a_link(tmp_path, outside):
    (tmp_path / batchdir.OWNER_LOCK).symlink_to(outside)
    with pytest.raises(rundir.LinkRefused, match=f"symlink: {tmp_path / batchdir.OWNER_LOCK}$"):
        batchdir.own(tmp_path)
    assert outside.read_text() == "precious\n"


def _batch(*args) -> subprocess.CompletedProcess:
    env = harness_env()
    return subprocess.run([sys.executable, "-m", "harness", "batch", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
@pytest.mark.parametrize("planted", ["batch.log", "attempt1"])
def test_a_resume_refuses_a_link_planted_in_an_op_dir(tmp_path, outside, planted):
    """The issue's case: a symlink at an op's batch.log made `--resume` append the op's output to the
    file it points at; and the same for an attempt dir planted as a link to a dir elsewhere."""
    d = tmp_path / "batch"
    first = _batch("--backend", "interpreter", "--ops-path", OPS, "--ops", "crash_op", "--batch-dir", d,
                   "--devices", "0")
    assert first.returncode == 1, first.stdout + first.stderr  # FAIL: not settled, so a resume reruns it
    [op] = (d / "ops").iterdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for attempt in op.glob("attempt*"):
        shutil.rmtree(attempt)
    if planted == "batch.log":
        (op / "batch.log").unlink()
        (op / "batch.log").symlink_to(outside)
    else:
        (op / "attempt1").symlink_to(elsewhere, target_is_directory=True)
    resumed = _batch("--resume", "--batch-dir", d)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert resumed.stderr.strip().splitlines() == [
        f"error: refusing to write through a symlink{' as a dir' * (planted != 'batch.log')}: {op / planted}"]
    assert outside.read_text() == "precious\n" and list(elsewhere.iterdir()) == []
