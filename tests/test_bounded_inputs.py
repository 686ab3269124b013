"""Every file the harness reads is read bounded (harness.core.bounded): a link to /dev/zero, a FIFO,
a directory or a file past its kind's cap is refused in one line naming it, what it is and the cap;
YAML aliases are refused; echoed values are cut; run.log and a child's output lines are capped.
The run-dir cases run `python -m harness` under a memory limit and a timeout: a reader that reads
whole fails them by running out of memory (a traceback) or by hanging, not by taking the machine."""

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, harness_env

from harness.core import bounded, launch, opguard, rundir
from harness.core import spec as spec_mod
from harness.core.results import ResultsError, read_results
from harness.providers import shapes
from harness.sessions import run as run_session

# What the `python -m harness` of these tests may map: far more than a replay's parent needs
# (it imports no torch), far less than reading /dev/zero whole takes.
MEMORY_LIMIT = 2 * 1024 ** 3
TIMEOUT_S = 120
BILLION_LAUGHS = b"""\
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
softmax: {shapes: [*g]}
"""


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def bounded_harness(*args) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` with MEMORY_LIMIT of address space and TIMEOUT_S to finish."""
    env = harness_env()
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory)


def one_error_line(proc, code=2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    return lines[0]


def record_dir(tmp_path) -> Path:
    """A record run dir, written by hand as the harness leaves it (its results.json left to the test)."""
    d = tmp_path / "rec"
    d.mkdir()
    spec_mod.write(d, spec_mod.RunSpec(op="softmax", backend="interpreter", mode="record", device=0, dtypes=["fp32"],
                                       shapes_source="tiny.yaml#norm", timer="host"))
    rundir.merge_json(d / rundir.RUN_JSON, {"observed": {"outcome": {
        "status": "COMPLETE", "rows_done": 1, "rows_planned": 1, "reason": None, "running_case": None}}})
    shapes.write_used(d / rundir.SHAPES_YAML, "softmax", [[2, 8]], ["fp32"], "tiny.yaml#norm")
    return d


# --- 1. reads: a regular file, at most its kind's cap --------------------------------------------
def test_a_replay_whose_results_json_links_to_dev_zero_is_refused_in_one_line_not_read_until_memory_runs_out(tmp_path):
    d = record_dir(tmp_path)
    (d / rundir.RESULTS_JSON).symlink_to("/dev/zero")
    line = one_error_line(bounded_harness("replay", d))
    assert line == (f"error: cannot replay {d}: {d / 'results.json'} is a symlink to /dev/zero (a character device), "
                    "not a regular file: a results.json is read only from a regular file of at most 256 MiB")


def test_a_replay_whose_results_json_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    d = record_dir(tmp_path)
    os.mkfifo(d / rundir.RESULTS_JSON)
    line = one_error_line(bounded_harness("replay", d))
    assert line == (f"error: cannot replay {d}: {d / 'results.json'} is a FIFO, not a regular file: a results.json "
                    "is read only from a regular file of at most 256 MiB")


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    # A writer blocks in open() until a reader opens the FIFO: while the refusal leaves it blocked, the
    # FIFO was never opened (a device's open can have effects of its own, and a FIFO's can hang).
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('x')", str(fifo)])
    try:
        while Path(f"/proc/{writer.pid}/wchan").read_text() != "wait_for_partner":
            assert writer.poll() is None
            time.sleep(0.01)
        with pytest.raises(bounded.InputRefused):
            bounded.read_bounded(fifo, "results.json")
        # Woken by an open of the FIFO, it would be runnable at once, and runnable has no wait channel.
        assert Path(f"/proc/{writer.pid}/wchan").read_text() == "wait_for_partner"
    finally:
        # The writer's partner at last: it writes to this reader and ends. Opened without blocking (a
        # writer gone already would leave a blocking open waiting for ever), then read blocking.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)
        with os.fdopen(fd) as f:
            written = f.read()
        code = writer.wait()
    assert (written, code) == ("x", 0)


def test_a_run_json_that_is_a_directory_or_a_broken_link_says_so(tmp_path):
    d = record_dir(tmp_path)
    (d / rundir.RUN_JSON).unlink()
    (d / rundir.RUN_JSON).mkdir()
    line = one_error_line(bounded_harness("replay", d))
    assert line == (f"error: cannot replay {d}: {d / 'run.json'} is a directory, not a regular file: a run.json is "
                    "read only from a regular file of at most 16 MiB")
    (d / rundir.RUN_JSON).rmdir()
    (d / rundir.RUN_JSON).symlink_to(tmp_path / "gone.json")
    with pytest.raises(spec_mod.SpecError) as info:
        spec_mod.read_run(d)
    assert str(info.value) == (f"{d / 'run.json'} is a broken symlink to {tmp_path / 'gone.json'}, not a regular "
                               "file: a run.json is read only from a regular file of at most 16 MiB")


def test_a_results_json_past_its_cap_is_refused_having_read_no_more_than_the_cap(tmp_path):
    d = record_dir(tmp_path)
    with open(d / rundir.RESULTS_JSON, "wb") as f:  # sparse: bigger than MEMORY_LIMIT, taking no disk
        f.truncate(2 * MEMORY_LIMIT)
    line = one_error_line(bounded_harness("replay", d))
    assert line == (f"error: cannot replay {d}: {d / 'results.json'} holds more than 256 MiB, the most a results.json "
                    "may hold: refused")


def test_a_file_whose_size_says_less_than_it_holds_is_refused_at_the_cap():
    # /proc files say they are empty and still hold text: the read itself stops one byte past the cap.
    maps = "/proc/self/maps"
    assert os.stat(maps).st_size == 0 and len(Path(maps).read_bytes()) > bounded.CAPS["completion marker"]
    with pytest.raises(bounded.InputRefused) as info:
        bounded.read_text(maps, "completion marker")
    assert str(info.value) == f"{maps} holds more than 4096 bytes, the most a completion marker may hold: refused"


def test_a_log_is_read_from_its_end_however_long(tmp_path):
    log = tmp_path / "batch.log"
    with open(log, "wb") as f:
        f.truncate(bounded.CAPS["log"] * 2)  # sparse zeros, then the line a reader looks for
        f.seek(0, os.SEEK_END)
        f.write(b"\nerror: the last line\n")
    tail = bounded.read_tail(log)
    assert len(tail) == bounded.CAPS["log"] and tail.endswith("\nerror: the last line\n")


@pytest.mark.parametrize("text", [
    '{"pid": 999999999, "pgid": 0, "batch_pid": 5, "command": []}',  # 0: the resuming batch's own group
    '[1, 2]', '{"pid": "x", "pgid": 7, "batch_pid": 5}', '{"pid": 9', 'garbage \udcff'])
def test_a_running_file_that_is_not_the_guards_is_refused_before_any_group_is_signalled(tmp_path, text):
    # A resume stops what a dead batch's .running names: one planted or torn there named the resuming
    # batch's own group (it SIGKILLed itself, no word said), init's, or raised a traceback.
    d = tmp_path / "batch"
    op = d / "ops" / "builtin__add"
    op.mkdir(parents=True)
    request = {"backend": "interpreter", "selection": ["builtin:add@add"], "op_timeout": 60}
    (d / "batch.json").write_text(json.dumps({"selected": ["builtin:add@add"], "request": request}))
    (op / opguard.RUNNING).write_bytes(text.encode("utf-8", "surrogateescape"))
    env = harness_env()
    proc = subprocess.run([sys.executable, "-m", "harness", "batch", "--resume", "--batch-dir", str(d)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          start_new_session=True)  # a group of its own: under the old code it killed it
    assert proc.returncode == 2, (proc.returncode, proc.stdout + proc.stderr)
    assert proc.stderr.splitlines() == [
        f"error: {op / opguard.RUNNING} is corrupt: not the guard's pid, process group and batch pid (positive "
        "integers, a group not this process's); it names the group of an op of a dead batch: remove it"]
    assert (op / opguard.RUNNING).is_file() and not (op / "attempt1").exists()  # left for the user; nothing ran


def test_a_running_file_naming_init_or_this_process_group_is_refused_unsignalled(tmp_path):
    # In process only: an old reader given pgid 1 SIGKILLs init's group (whatever shares it on a test host).
    running = tmp_path / opguard.RUNNING
    for pgid in (1, -1, os.getpgid(0), True):
        running.write_text(json.dumps({"pid": 999999999, "pgid": pgid, "batch_pid": 5, "command": []}))
        with pytest.raises(bounded.InputRefused, match="is corrupt"):
            opguard.stop_leftover(running, 0.1)


# --- 2. structures and messages: bounded whatever the input holds ----------------------------------
def test_a_shape_file_of_nested_aliases_is_refused_at_its_first_alias(tmp_path):
    laughs = tmp_path / "laughs.yaml"
    laughs.write_bytes(BILLION_LAUGHS)
    line = one_error_line(bounded_harness("record", "softmax", "--backend", "interpreter", "--shapes", laughs))
    assert line == (f"error: shape file {laughs}:2:8: not valid yaml: found alias *a: aliases and anchors are not "
                    "read (write the value out)")


@pytest.mark.parametrize("text", [b"[" * 100_000 + b"]" * 100_000, b"a: " + b"[" * 100_000])
def test_yaml_nested_deeper_than_python_recurses_is_one_line(tmp_path, text):
    deep = tmp_path / "deep.yaml"
    deep.write_bytes(text)
    with pytest.raises(shapes.ShapeFileError) as info:
        shapes.load(deep)
    assert str(info.value).startswith(f"shape file {deep}") and "\n" not in str(info.value)


def test_json_nested_deeper_than_python_recurses_is_refused_as_results(tmp_path):
    d = record_dir(tmp_path)
    (d / rundir.RESULTS_JSON).write_text("[" * 1_000_000 + "]" * 1_000_000)
    with pytest.raises(ResultsError) as info:
        read_results(d)
    assert str(info.value) == (f"{d / 'results.json'} nests arrays or objects deeper than can be read: not a "
                               "results.json")


def test_an_echoed_value_is_cut_with_a_note_of_what_was_left_out(tmp_path):
    path = tmp_path / "long.yaml"
    # 150 KB: far past what an error echoes (errors.ECHO_CHARS), and parsed in well under a second.
    path.write_text(f"softmax: {{shapes: [{'[' + '1, ' * 50_000 + '0]'}]}}\n")
    with pytest.raises(shapes.ShapeFileError) as info:
        shapes.resolve(path, "softmax", ())
    message = str(info.value)
    assert message.startswith(f"{path}: key 'softmax': shapes[0] = [1, 1, 1,")
    assert message.endswith("... (149803 more chars) is not a list of positive ints"), message[-200:]


def test_run_log_keeps_its_head_and_tail_and_says_how_much_it_cut(tmp_path, capsys):
    log = tmp_path / "run.log"
    tee = run_session._Tee(log, head=100, tail=50)
    tee.write("h" * 60)
    tee.log_only("m" * 1000 + "\n")
    tee.write("t" * 49 + "\n")
    tee.close()
    kept = log.read_text()
    assert kept == ("h" * 60 + "m" * 40 + "\n[run.log: 961 characters of output cut here; it keeps the first 100 and "
                    "the last 50 of a run's output]\n" + "t" * 49 + "\n")
    assert capsys.readouterr().out == "h" * 60 + "t" * 49 + "\n"  # the terminal is shown all it was shown


def test_a_childs_line_without_end_is_passed_on_in_bounded_pieces():
    pieces = []
    code, _ = launch.run([sys.executable, "-c", "import sys; sys.stdout.write('x' * 1_000_000)"], grace_s=5,
                         on_stdout=pieces.append)
    assert code == 0 and "".join(pieces) == "x" * 1_000_000
    assert max(map(len, pieces)) == launch.PIECE_CHARS


def test_a_requirements_file_holding_a_nul_is_refused_before_any_dir_is_claimed(tmp_path):
    # Its entries become pip's arguments: a NUL reached the exec as a traceback, after the A/B's dir was made.
    (tmp_path / "reqs.txt").write_bytes(b"numpy\0\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: x\nops: [softmax]\nb: {requirements: reqs.txt}\n")
    proc = bounded_harness("ab", plan, "--backend", "interpreter", "--out", tmp_path / "runs")
    assert one_error_line(proc) == (f"error: {plan}: side 'B': requirements file {tmp_path / 'reqs.txt'} holds a NUL "
                                    "byte (at 5): a requirements file is text, one entry a line")
    assert not (tmp_path / "runs").exists()
