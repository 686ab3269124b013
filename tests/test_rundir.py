import datetime as dt
import errno
import json
import os
import re
import threading
from pathlib import Path

import pytest
import yaml

from harness.core import bounded, rundir
from harness.core.errors import UsageError


def test_same_second_claims_get_suffixes(tmp_path):
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    dirs = [rundir.claim_run_dir(tmp_path, "mm", now) for _ in range(3)]
    assert [d.name for d in dirs] == ["mm_20261129-100000", "mm_20261129-100000-1", "mm_20261129-100000-2"]


# --- races forced: two claimants held at a barrier where a claim that is not atomic would let both through ---
RACE_BOUND_S = 10  # a barrier the claim no longer reaches fails the test instead of hanging it


def together(*calls) -> list:
    """Each call in a thread of its own, all at once: what each returned, or the exception it raised."""
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RACE_BOUND_S)
    assert not any(t.is_alive() for t in threads), "a claimant is still running"
    return results


def test_two_claims_of_one_name_at_the_same_moment_get_distinct_dirs(tmp_path, monkeypatch):
    """Both claimants try the same first name together (held at a barrier just before making it):
    the one mkdir refuses takes the next name."""
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    first_name = tmp_path / "op_20261129-100000"
    both_at_it = threading.Barrier(2, timeout=RACE_BOUND_S)
    make = Path.mkdir

    def held_then_made(self, *args, **kwargs):
        if self == first_name:
            both_at_it.wait()
        return make(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", held_then_made)
    got = together(*[lambda: rundir.claim_run_dir(tmp_path, "op", now)] * 2)
    assert sorted(got, key=str) == [first_name, tmp_path / "op_20261129-100000-1"], got


def test_merge_is_deep_and_keeps_other_keys(tmp_path):
    p = tmp_path / "run.json"
    rundir.merge_json(p, {"spec": {"op": "mm"}, "observed": {"device": {"name": "x"}}})
    rundir.merge_json(p, {"observed": {"device": {"arch": "sm_90"}, "rows": 3}})
    assert json.loads(p.read_text()) == {"spec": {"op": "mm"},
                                         "observed": {"device": {"name": "x", "arch": "sm_90"}, "rows": 3}}


def test_atomic_write_leaves_no_temp_files(tmp_path):
    rundir.atomic_write_json(tmp_path / "a.json", {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_claim_without_a_clock_uses_now_and_makes_op_names_path_safe(tmp_path):
    d = rundir.claim_run_dir(tmp_path / "new" / "root", "flaggems:FLA/kda")
    assert d.is_dir() and d.parent == tmp_path / "new" / "root"
    assert re.fullmatch(r"flaggems_FLA_kda_\d{8}-\d{6}", d.name), d.name


def test_claim_gives_up_after_ten_thousand_taken_names(tmp_path, monkeypatch):
    tried = []
    real_mkdir = Path.mkdir

    def taken(self, *args, **kwargs):
        if self.parent != tmp_path:
            return real_mkdir(self, *args, **kwargs)
        tried.append(self.name)
        raise FileExistsError(self)

    monkeypatch.setattr(Path, "mkdir", taken)
    with pytest.raises(RuntimeError, match=f"could not claim a run directory under {re.escape(str(tmp_path))}$"):
        rundir.claim_run_dir(tmp_path, "op", dt.datetime(2026, 1, 2, 3, 4, 5))
    assert len(tried) == 10_000
    assert tried[0] == "op_20260102-030405" and tried[1] == "op_20260102-030405-1"
    assert tried[-1] == "op_20260102-030405-9999"


def test_disk_full_is_one_line_naming_the_file(tmp_path):
    exc = rundir.DiskFull(tmp_path / "results.json")
    assert str(exc) == f"no space left on device writing {tmp_path / 'results.json'}"
    assert exc.errno == errno.ENOSPC and exc.path == tmp_path / "results.json"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_disk_full_found_behind_raw_os_errors(code):
    named = OSError(code, "full", "/data/run.log")
    assert rundir.disk_full(named, "/other").path == Path("/data/run.log")
    assert rundir.disk_full(OSError(code, "full"), "/other").path == Path("/other")
    assert rundir.disk_full(OSError(code, "full")).path == Path("?")


def test_disk_full_found_through_cause_and_context_chains():
    full = rundir.DiskFull(Path("/x"))
    try:
        try:
            raise full
        except OSError:
            raise ValueError("wrapped") from None  # context kept, cause suppressed
    except ValueError as exc:
        wrapped = exc
    assert rundir.disk_full(wrapped) is full
    caused = RuntimeError("caused")
    caused.__cause__ = OSError(errno.ENOSPC, "full", "/y")
    assert rundir.disk_full(caused).path == Path("/y")


def test_other_errors_are_not_disk_full_even_in_a_cycle():
    assert rundir.disk_full(OSError(errno.EACCES, "denied", "/z")) is None
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert rundir.disk_full(a) is None


@pytest.mark.parametrize("code,raised", [(errno.ENOSPC, rundir.DiskFull), (errno.EDQUOT, rundir.DiskFull),
                                         (errno.EIO, OSError)])
def test_failed_write_keeps_the_previous_file_and_no_temp(tmp_path, monkeypatch, code, raised):
    path = tmp_path / "results.json"
    rundir.atomic_write_json(path, {"rows": 1})

    def fail(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(raised) as info:
        rundir.atomic_write_json(path, {"rows": 2})
    assert isinstance(info.value, rundir.DiskFull) == (raised is rundir.DiskFull)
    if raised is rundir.DiskFull:
        assert info.value.path == path and info.value.__cause__.errno == code
    assert json.loads(path.read_text()) == {"rows": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_disk_full_before_the_temp_file_exists(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "open_write", full)  # the one way rundir opens a file to write
    with pytest.raises(rundir.DiskFull, match="writing .*results.json$"):
        rundir.atomic_write_text(tmp_path / "results.json", "x")
    assert list(tmp_path.iterdir()) == []


def test_json_is_indented_in_insertion_order_with_paths_as_text(tmp_path):
    path = tmp_path / "run.json"
    rundir.atomic_write_json(path, {"z": 1, "a": {"p": Path("/tmp/x")}})
    assert path.read_text(encoding="utf-8") == '{\n  "z": 1,\n  "a": {\n    "p": "/tmp/x"\n  }\n}\n'
    assert rundir.read_json(path) == {"z": 1, "a": {"p": "/tmp/x"}}


def test_text_is_written_as_utf8(tmp_path):
    path = tmp_path / "run.log"
    rundir.atomic_write_text(path, "µs ✓\n")
    assert path.read_bytes() == "µs ✓\n".encode()


def test_merge_replaces_what_is_not_a_mapping_on_either_side(tmp_path):
    p = tmp_path / "run.json"
    rundir.merge_json(p, {"observed": {"timers": "graph", "device": {"name": "x"}}})
    merged = rundir.merge_json(p, {"observed": {"timers": {"graph": 2}, "device": "cpu"}})
    assert merged == {"observed": {"timers": {"graph": 2}, "device": "cpu"}}
    assert json.loads(p.read_text()) == merged


def test_a_merge_arriving_between_anothers_read_and_write_loses_nothing(tmp_path, monkeypatch):
    """The merge that read the file first goes on to write only once the other has arrived: at the
    lock, which then holds it until the first has written; or, were there no lock, past its own read
    of the same old file, so that both would write their merge into that old file."""
    path = tmp_path / "run.json"
    rundir.merge_json(path, {"observed": {}})
    arrived, readers, changed = set(), [], threading.Condition()

    def arrive():
        with changed:
            arrived.add(threading.get_ident())
            changed.notify_all()

    lock, read = rundir.fcntl.flock, Path.read_text

    def at_the_lock(f, operation):
        if operation == rundir.fcntl.LOCK_EX:
            arrive()
        return lock(f, operation)

    def read_then_held(self, *args, **kwargs):
        text = read(self, *args, **kwargs)
        if self == path:
            arrive()
            readers.append(threading.get_ident())
            if readers[0] == threading.get_ident():
                with changed:
                    if not changed.wait_for(lambda: len(arrived) == 2, RACE_BOUND_S):
                        raise AssertionError("the other merge never arrived")
        return text

    monkeypatch.setattr(rundir.fcntl, "flock", at_the_lock)
    monkeypatch.setattr(Path, "read_text", read_then_held)
    got = together(lambda: rundir.merge_json(path, {"observed": {"a": 1}}),
                   lambda: rundir.merge_json(path, {"observed": {"b": 2}}))
    assert not any(isinstance(r, Exception) for r in got), got
    assert json.loads(read(path)) == {"observed": {"a": 1, "b": 2}}


class Bad(ValueError):
    pass


def read_back(tmp_path, content: bytes):
    p = tmp_path / "plan.yaml"
    p.write_bytes(content)
    with pytest.raises(Bad) as info:
        rundir.read_yaml_mapping(p, Bad, "plan", "a mapping of sides")
    return p, str(info.value)


def test_yaml_errors_name_file_line_and_what_is_wrong(tmp_path):
    p, msg = read_back(tmp_path, b"a: [1, 2\nb: 3\n")
    assert msg == f"plan {p}:2:2: not valid yaml: expected ',' or ']', but got ':' " \
                  "(while parsing a flow sequence at line 1)"
    p, msg = read_back(tmp_path, b"a: b: c\n")
    assert msg == f"plan {p}:1:5: not valid yaml: mapping values are not allowed here"


def test_yaml_errors_without_a_line_are_one_line(tmp_path):
    p, msg = read_back(tmp_path, b"x: \x07\n")
    assert msg.startswith(f"plan {p}: not valid yaml: unacceptable character #x0007") and "\n" not in msg


def test_yaml_error_marked_only_by_its_context(tmp_path, monkeypatch):
    mark = yaml.Mark("<unicode string>", 0, 4, 2, None, None)

    def fail(text):
        raise yaml.MarkedYAMLError(context="while scanning", context_mark=mark)

    monkeypatch.setattr(bounded, "load_yaml", fail)
    p, msg = read_back(tmp_path, b"a: 1\n")
    assert msg == f"plan {p}:5:3: not valid yaml: MarkedYAMLError"


def test_yaml_error_without_any_mark_names_the_file(tmp_path, monkeypatch):
    def fail(text):
        raise yaml.MarkedYAMLError(problem="boom")

    monkeypatch.setattr(bounded, "load_yaml", fail)
    p, msg = read_back(tmp_path, b"a: 1\n")
    assert msg == f"plan {p}: not valid yaml: boom"


def test_yaml_file_that_is_not_text_or_not_a_mapping(tmp_path):
    p, msg = read_back(tmp_path, b"a: \xff\xfe\n")
    assert msg == f"plan {p}: not valid yaml: not UTF-8 text (byte 3)"
    p, msg = read_back(tmp_path, b"- 1\n")
    assert msg == f"plan {p}: top level must be a mapping of sides"
    p, msg = read_back(tmp_path, b"")
    assert msg == f"plan {p}: top level must be a mapping of sides"
    with pytest.raises(Bad) as info:
        rundir.read_yaml_mapping(p, Bad, "plan")
    assert str(info.value) == f"plan {p}: top level must be a mapping"


def test_yaml_file_missing_or_unreadable(tmp_path, monkeypatch):
    with pytest.raises(Bad) as info:
        rundir.read_yaml_mapping(tmp_path / "none.yaml", Bad, "plan")
    assert str(info.value) == f"plan {tmp_path / 'none.yaml'} does not exist"

    def unreadable(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(bounded, "read_bounded", unreadable)
    p, msg = read_back(tmp_path, b"a: 1\n")
    assert msg == f"plan {p}: cannot be read: Input/output error"


def test_yaml_mapping_is_returned(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("mm: {shapes: [[1]]}\n", encoding="utf-8")
    assert rundir.read_yaml_mapping(p, Bad, "shape file") == {"mm": {"shapes": [[1]]}}


def test_a_named_run_dir_is_created_with_its_parents_or_taken_empty(tmp_path):
    named = rundir.claim_named_dir(tmp_path / "a" / "b" / "run", rundir.RUN_LOG)
    assert named == (tmp_path / "a" / "b" / "run").resolve() and [p.name for p in named.iterdir()] == [rundir.RUN_LOG]
    (tmp_path / "empty").mkdir()
    assert rundir.claim_named_dir(tmp_path / "empty", rundir.RUN_LOG) == (tmp_path / "empty").resolve()


@pytest.mark.parametrize("make", [lambda p: p.mkdir() or (p / "x").write_text(""), lambda p: p.write_text("")],
                         ids=["non-empty dir", "file"])
def test_a_named_run_dir_that_holds_anything_is_one_error_line(tmp_path, make):
    make(tmp_path / "taken")
    with pytest.raises(UsageError) as info:
        rundir.claim_named_dir(tmp_path / "taken", rundir.RUN_LOG)
    assert str(info.value) == f"--run-dir {tmp_path / 'taken'} exists and is not an empty dir: name a new or empty one"


@pytest.mark.parametrize("exists", [False, True], ids=["new", "empty"])
def test_two_claimants_past_the_emptiness_check_together_never_share_a_named_dir(tmp_path, monkeypatch, exists):
    """Both claimants find the dir empty before either claims it (held at a barrier right after the
    check): only the claim itself keeps them apart. Exactly one gets it, the other is refused."""
    path = tmp_path / "run"
    if exists:
        path.mkdir()
    checked = path.resolve()
    both_found_it_empty = threading.Barrier(2, timeout=RACE_BOUND_S)
    listed = Path.iterdir

    def listed_then_held(self):
        entries = list(listed(self))
        if self == checked:
            both_found_it_empty.wait()
        return iter(entries)

    monkeypatch.setattr(Path, "iterdir", listed_then_held)
    got = together(*[lambda: rundir.claim_named_dir(path, rundir.RUN_LOG)] * 2)
    assert [r for r in got if isinstance(r, Path)] == [checked], got
    assert sum(isinstance(r, UsageError) for r in got) == 1, got
    assert [p.name for p in listed(checked)] == [rundir.RUN_LOG]


def test_a_named_dirs_first_file_holds_its_whole_text_from_the_moment_it_has_its_name(tmp_path, monkeypatch):
    """A reader polling the dir (a corpus A/B reading an op's ab.json, a test a bisect.json), or a crash
    right after the claim, never finds the first file empty or part-written."""
    path, text = tmp_path / "bisect", '{"probes": []}\n'
    seen_while_written = []
    opened = rundir.open_write

    def watched(target, how="a", binary=False):
        f = opened(target, how, binary)
        write = f.write

        def write_and_look(data):
            seen_while_written.append((path / "bisect.json").exists())
            return write(data)

        f.write = write_and_look
        return f

    monkeypatch.setattr(rundir, "open_write", watched)
    claimed = rundir.claim_named_dir(path, "bisect.json", text)
    assert seen_while_written == [False]  # written aside, named once whole
    assert [p.name for p in claimed.iterdir()] == ["bisect.json"] and (claimed / "bisect.json").read_text() == text
    assert os.stat(claimed / "bisect.json").st_nlink == 1  # the aside name is gone: open_write takes it later


def test_a_claim_whose_first_file_cannot_be_written_leaves_no_dir(tmp_path, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "link", full)
    with pytest.raises(OSError):
        rundir.claim_named_dir(tmp_path / "run", "ab.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_an_unclaimed_name_is_the_one_a_claim_would_take_now(tmp_path):
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    assert rundir.unclaimed_run_dir(tmp_path, "flaggems:mm", now) == tmp_path / "flaggems_mm_20261129-100000"
    assert not (tmp_path / "flaggems_mm_20261129-100000").exists()  # named, not created
    rundir.claim_run_dir(tmp_path, "flaggems:mm", now)
    assert rundir.unclaimed_run_dir(tmp_path, "flaggems:mm", now).name == "flaggems_mm_20261129-100000-1"
