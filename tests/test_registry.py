"""Operator lookup: a user module that does not import breaks only the runs that need it, and is
reported in one line at the user's own file and line."""

import sys

import pytest
from conftest import run_dir_of

from harness.providers import registry

GOOD = '''
from ops import Operator

{name} = Operator(name="{name}", inputs=lambda shape, dtype, device: (), baseline=abs, candidate=abs,
                  dtypes=("fp32",))
'''


def ops_dir(tmp_path, **modules):
    d = tmp_path / "ops_dir"
    d.mkdir()
    for stem, text in modules.items():
        (d / f"{stem}.py").write_text(text)
    return d


def collect():
    lines = []
    return lines, lines.append


def test_syntax_error_skips_only_that_module(tmp_path):
    d = ops_dir(tmp_path, reg_broken_syntax="x = 1\ndef oops(:\n", reg_good_a=GOOD.format(name="reg_good_a"))
    lines, warn = collect()
    op, provider = registry.load("reg_good_a", [str(d)], warn=warn)
    assert op.name == "reg_good_a" and provider == str(d / "reg_good_a.py")
    assert lines == [f"skipped operator module {d / 'reg_broken_syntax.py'}, which does not import: "
                     f"{d / 'reg_broken_syntax.py'}:2: SyntaxError: invalid syntax"]
    assert "zl_ops_path.reg_broken_syntax" not in sys.modules
    # Said once per process, however many operators are looked up.
    registry.load("reg_good_a", [str(d)], warn=warn)
    assert len(lines) == 1


def test_not_found_names_the_module_that_failed(tmp_path):
    d = ops_dir(tmp_path, reg_broken_dep="import json\nimport zl_no_such_dependency\n",
                reg_good_b=GOOD.format(name="reg_good_b"))
    with pytest.raises(registry.OperatorNotFound) as info:
        registry.load("reg_wanted", [str(d)], warn=lambda line: None)
    text = str(info.value)
    assert text.startswith(f"{d / 'reg_broken_dep.py'}:2: ModuleNotFoundError: No module named "
                           "'zl_no_such_dependency'")
    assert "'reg_wanted'" in text and "\n" not in text


def test_error_raised_in_a_library_is_located_at_the_user_line(tmp_path):
    d = ops_dir(tmp_path, reg_broken_lib="import json\n\nCONFIG = json.loads('{')\n")
    with pytest.raises(registry.OperatorNotFound) as info:
        registry.load("reg_other", [str(d)])
    assert str(info.value).startswith(f"{d / 'reg_broken_lib.py'}:3: JSONDecodeError: Expecting property name")


def test_module_name_entry_that_raises_is_broken_not_missing(tmp_path, monkeypatch):
    pkg = tmp_path / "reg_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "defs.py").write_text("\n\nraise RuntimeError('needs a GPU\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.OperatorNotFound) as info:
        registry.load("anything", ["reg_user_pkg.defs"])
    assert str(info.value).startswith(f"{pkg / 'defs.py'}:3: RuntimeError: needs a GPU (")
    with pytest.raises(registry.OperatorNotFound, match="not a directory, .py file or importable module"):
        registry.load("anything", ["reg_user_pkg.nope"])


def test_duplicate_still_refused_with_a_broken_neighbour(tmp_path):
    d = ops_dir(tmp_path, reg_dup_1=GOOD.format(name="reg_dup"), reg_dup_2=GOOD.format(name="reg_dup"),
                reg_dup_broken="(")
    with pytest.raises(registry.OperatorNotFound, match="defined more than once"):
        registry.load("reg_dup", [str(d)], warn=lambda line: None)


def test_an_operator_bound_to_two_names_or_reached_twice_is_one_operator(tmp_path):
    d = ops_dir(tmp_path, reg_alias=GOOD.format(name="reg_alias") + "also_reg_alias = reg_alias\n")
    for paths in ([str(d)], [str(d), str(d / "reg_alias.py")], [str(d / "reg_alias.py")] * 2):
        op, provider = registry.load("reg_alias", paths, warn=lambda line: None)
        assert op.name == "reg_alias" and provider == str(d / "reg_alias.py")


def test_an_operator_module_imports_a_helper_file_of_its_folder(tmp_path):
    d = ops_dir(tmp_path, _reg_helpers="FROM_HELPER = 'reg_helped'\n",
                reg_uses_helper="from _reg_helpers import FROM_HELPER\n" + GOOD.format(name="reg_helped"))
    op, _ = registry.load("reg_helped", [str(d)], warn=lambda line: None)
    assert op.name == "reg_helped" and sys.path[-1] == str(d)  # after everything installed


def test_files_of_one_name_in_two_ops_paths_are_both_loaded(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for d, name in ((first, "reg_stem_a"), (second, "reg_stem_b")):
        d.mkdir()
        (d / "reg_common.py").write_text(GOOD.format(name=name))
    paths = [str(first), str(second)]
    assert registry.load("reg_stem_b", paths, warn=lambda line: None)[1] == str(second / "reg_common.py")
    assert registry.load("reg_stem_a", paths, warn=lambda line: None)[1] == str(first / "reg_common.py")
    # Loaded again (a replay's child, in the same order), each file gets the module name it had.
    again = registry._import_file(second / "reg_common.py")
    assert again.__file__ == str(second / "reg_common.py") and again.__name__.startswith("zl_ops_path.reg_common_")


@pytest.mark.parametrize("name", ["a/b", "../escape", "", ".hidden", "with space", "x:y"])
def test_an_operator_name_that_cannot_name_a_file_is_refused_at_import(tmp_path, name):
    d = ops_dir(tmp_path, reg_bad_name=GOOD.format(name="op").replace('name="op"', f"name={name!r}"))
    with pytest.raises(registry.OperatorNotFound, match="use letters, digits"):
        registry.load("anything", [str(d)], warn=lambda line: None)


@pytest.mark.e2e
def test_broken_ops_path_module_does_not_break_a_builtin_run(harness, tmp_path):
    d = ops_dir(tmp_path, broken="def f(:\n")
    shapes = tmp_path / "one.yaml"
    shapes.write_text("softmax: {shapes: [[2, 8]], dtypes: [fp32]}\n")
    proc = harness("record", "softmax", "--backend", "interpreter", "--ops-path", d, "--shapes", shapes,
                   "--out", tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warning = (f"warning: skipped operator module {d / 'broken.py'}, which does not import: "
               f"{d / 'broken.py'}:1: SyntaxError: invalid syntax")
    assert proc.stderr.splitlines() == [warning]  # the parent's, on the terminal
    assert warning not in proc.stdout  # once: the child's is not shown again
    assert (run_dir_of(proc) / "run.log").read_text().count(warning) == 1  # the child's, into the archive
    assert "Traceback" not in proc.stdout + proc.stderr
    # The op asked for is found nowhere: the error is the broken module's, in one line.
    proc = harness("record", "nope", "--backend", "interpreter", "--ops-path", d)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: {d / 'broken.py'}:1: SyntaxError: invalid syntax (operator 'nope' is defined nowhere else: "
        "that module may be its home)"], proc.stderr
