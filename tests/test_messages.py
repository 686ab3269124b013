"""A path that is not what a command expects is reported as what it is (a directory, a regular file,
a device, a FIFO, a program without its x bit, a broken link) and what was expected, never as
"does not exist"; a stored file with a field missing is named with the field, not reported as
whatever the missing field's absence led to later (harness.core.bounded.path_problem)."""

import json
import os

import pytest
from conftest import run_harness

from harness import cli
from harness.core import bounded
from harness.providers import catalog, shapes
from harness.sessions import ab


def one_error_line(proc, code=2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    return lines[0]


def test_a_file_given_for_a_run_dir_is_named_a_regular_file(tmp_path):
    given = tmp_path / "results.json"
    given.write_text("{}")
    assert one_error_line(run_harness("replay", given)) == (
        f"error: cannot replay {given}: run dir {given} is a regular file, not a directory")


def test_a_device_given_for_a_shape_file_is_named_a_character_device():
    # Refused by the option's declared kind, under the command's usage (options.path_of).
    proc = run_harness("record", "softmax", "--backend", "interpreter", "--shapes", "/dev/null")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(
        "error: argument --shapes: /dev/null is a character device, not a regular file")


def test_a_directory_given_for_a_shape_file_is_named_a_directory(tmp_path):
    with pytest.raises(shapes.ShapeFileError) as info:
        shapes.load(tmp_path)
    assert str(info.value) == f"shape file {tmp_path} is a directory, not a regular file"


def test_a_fifo_given_for_an_ops_file_is_named_a_fifo(tmp_path):
    fifo = tmp_path / "ops.txt"
    os.mkfifo(fifo)
    with pytest.raises(catalog.SelectionError) as info:
        catalog.read_ops_file(fifo)  # opened, a FIFO with no writer would hang this test
    assert str(info.value) == f"--ops-file {fifo} is a FIFO, not a regular file"


def test_a_link_to_nowhere_is_named_a_broken_link(tmp_path):
    link = tmp_path / "plan.yaml"
    link.symlink_to(tmp_path / "moved.yaml")
    with pytest.raises(ab.PlanError) as info:
        ab.load_plan(link)
    assert str(info.value) == f"plan {link} is a broken symlink to {tmp_path / 'moved.yaml'}"


def test_a_plan_sides_python_that_is_no_program_says_what_it_is(tmp_path):
    plan = tmp_path / "plan.yaml"
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n")  # no x bit
    (tmp_path / "venv").mkdir()
    for python, problem in (("python", "is a regular file that is not executable (no x permission)"),
                            ("venv", "is a directory, not an executable file")):
        plan.write_text(f"ops: [softmax]\na: {{python: {python}}}\n")
        with pytest.raises(ab.PlanError) as info:
            ab.load_plan(plan)
        assert str(info.value) == f"{plan}: side 'A': python {tmp_path / python} {problem}"


def test_an_a_python_given_as_a_directory_is_refused_before_anything_runs(tmp_path):
    assert one_error_line(run_harness("ab", "--ops", "softmax", "--backend", "interpreter", "--a-python", tmp_path,
                                      "--out", tmp_path)) == (
        f"error: --a-python {tmp_path} is a directory, not an executable file")


def test_a_requirements_file_that_is_a_fifo_is_named_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "reqs.txt")
    plan = tmp_path / "plan.yaml"
    plan.write_text("ops: [softmax]\nb: {requirements: reqs.txt}\n")
    with pytest.raises(ab.PlanError) as info:
        ab.load_plan(plan)
    assert str(info.value) == (f"{plan}: side 'B': requirements file {tmp_path / 'reqs.txt'} is a FIFO, not a "
                               "regular file")


def test_a_batch_json_without_its_request_names_the_file_and_the_field(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    (d / "batch.json").write_text(json.dumps({"backend": "interpreter", "devices": [0], "selected": []}))
    assert one_error_line(run_harness("batch", "--resume", "--batch-dir", d)) == (
        f"error: --resume: {d / 'batch.json'} is corrupt: it has no 'request' (the options and selection the batch "
        "ran with); the op dirs are intact: start a new --batch-dir with the same selection and options")


def test_a_batch_json_that_is_a_fifo_is_read_as_one_not_as_no_batch_dir(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    os.mkfifo(d / "batch.json")
    assert one_error_line(run_harness("batch", "--resume", "--batch-dir", d, timeout=120)) == (
        f"error: --resume: {d / 'batch.json'} is a FIFO, not a regular file: a batch.json is read only from a "
        "regular file of at most 64 MiB")


@pytest.mark.parametrize("expect, made, problem", [
    ("file", "dir", "is a directory, not a regular file"),
    ("dir", "file", "is a regular file, not a directory"),
    ("file", "nothing", "does not exist"),
    ("executable", "file", "is a regular file that is not executable (no x permission)"),
    ("file", "fifo", "is a FIFO, not a regular file"),
    ("file", "link to dev", "is a symlink to /dev/zero (a character device), not a regular file"),
])
def test_path_problem_says_what_a_path_is_and_what_was_expected(tmp_path, expect, made, problem):
    path = tmp_path / "x"
    {"dir": path.mkdir, "file": path.touch, "nothing": lambda: None, "fifo": lambda: os.mkfifo(path),
     "link to dev": lambda: path.symlink_to("/dev/zero")}[made]()
    assert bounded.path_problem(path, expect) == problem


def test_a_corrupt_ir_index_is_named_with_its_line_not_a_traceback(tmp_path):
    for run, body in (("a", ""), ("b", "shape\tkernel\tfile\n2x8\tk\n")):
        (tmp_path / run / "ttgir").mkdir(parents=True)
        (tmp_path / run / "ttgir" / "index.tsv").write_text(body)
    a, b = tmp_path / "a", tmp_path / "b"
    assert one_error_line(run_harness("compare-ir", a, b)) == (
        f"error: {a / 'ttgir' / 'index.tsv'} is empty: an IR index starts with its header line")
    assert one_error_line(run_harness("compare-ir", b, b)) == (
        f"error: {b / 'ttgir' / 'index.tsv'}:2 has 2 fields, its header 3: a corrupt IR index")


@pytest.mark.parametrize(("argv", "flag", "expect"), [
    (["record", "softmax", "--out"], "--out", "dir"), (["bisect", "--out"], "--out", "dir"),
    (["record", "softmax", "--triton-cache"], "--triton-cache", "dir"),
    (["batch", "--batch-dir"], "--batch-dir", "dir"), (["batch", "--summarize"], "--summarize", "dir"),
    (["batch", "--replay-root"], "--replay-root", "dir"), (["ab", "--continue"], "--continue", "dir"),
    (["bisect", "--from-ab"], "--from-ab", "dir"), (["bisect", "--resume"], "--resume", "dir"),
    (["bisect", "--checkout"], "--checkout", "dir"), (["bisect", "--build-cache"], "--build-cache", "dir"),
    (["record", "softmax", "--shapes"], "--shapes", "file"), (["batch", "--ops-file"], "--ops-file", "file"),
    (["bisect", "--builds"], "--builds", "file"),
])
@pytest.mark.parametrize("kind", ["file", "dir", "fifo", "broken link"])
def test_a_path_option_given_the_wrong_kind_of_thing_says_what_it_is_at_the_door(tmp_path, capsys, argv, flag, expect,
                                                                                   kind):
    # --out naming a file said `File exists` (exit 1), a broken link made a dir at its target, --resume
    # --batch-dir of a FIFO said "not a batch dir", --replay-root of a file failed each op (exit 1).
    path = tmp_path / kind.replace(" ", "_")
    {"file": lambda: path.write_text("x\n"), "dir": path.mkdir, "fifo": lambda: os.mkfifo(path),
     "broken link": lambda: path.symlink_to(tmp_path / "gone")}[kind]()
    said = {"file": "is a regular file, not a directory", "dir": "is a directory, not a regular file",
            "fifo": f"is a FIFO, not {bounded.EXPECTED[expect]}",
            "broken link": f"is a broken symlink to {tmp_path}/gone"}
    if (kind, expect) in (("file", "file"), ("dir", "dir")):  # the right kind: parsed as given
        assert cli.build_parser().parse_args([*argv, str(path)]) is not None
        return
    with pytest.raises(SystemExit) as refused:
        cli.build_parser().parse_args([*argv, str(path)])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {flag}: {path} {said[kind]}")
    assert not (tmp_path / "gone").exists()


def test_compare_of_a_file_says_it_is_one(tmp_path, capsys):
    f = tmp_path / "a.txt"
    f.write_text("x\n")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["ab", "--compare", str(f), str(tmp_path)])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: argument --compare: {f} is a regular file, not a directory")


def test_record_out_at_a_broken_link_makes_no_dir_at_its_target(tmp_path):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "elsewhere")
    proc = run_harness("record", "softmax", "--backend", "interpreter", "--out", link, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(f"error: argument --out: {link} is a broken symlink to "
                                                 f"{tmp_path / 'elsewhere'}")
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("argv", [
    ["record", "X", "--backend", "interpreter"], ["record", "softmax", "--backend", "X"],
    ["ab", "--ops", "softmax", "--b-env", "X", "--backend", "interpreter"], ["replay", "X"],
    ["record", "softmax", "--ops-path", "X", "--backend", "interpreter"],
])
def test_a_100k_character_argument_is_echoed_cut_in_a_short_error(tmp_path, argv):
    # Each echoed the value whole (100 KB and more, twice for replay); --ops-path raised a traceback.
    value = "x" * 100_000
    proc = run_harness(*[value if a == "X" else a for a in argv], "--out" if argv[0] != "replay" else "--color",
                       tmp_path / "runs" if argv[0] != "replay" else "never", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[:2000]
    assert len(proc.stdout + proc.stderr) < 4000 and "more chars)" in proc.stderr, proc.stderr[:2000]
    assert not (tmp_path / "runs").exists()



@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_an_ops_path_that_is_neither_a_dir_nor_a_py_file_says_what_it_is(tmp_path, capsys, kind):
    # The probe imported it and said only that it "ended its process while importing (exited 1)".
    path = tmp_path / "ops.txt"
    path.write_text("x\n") if kind == "file" else os.mkfifo(path)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["record", "softmax", "--ops-path", str(path)])
    said = "a regular file" if kind == "file" else "a FIFO"
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: argument --ops-path: {path} is {said}, not a directory or a .py file")
