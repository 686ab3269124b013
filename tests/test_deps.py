"""The light packages are declared twice, for two installers: harness.core.deps (what the nox sessions
install into .nox/deps) and pyproject.toml (what `pip install -e .` installs). The two must agree."""

import sys

import pytest
from conftest import REPO

import noxfile
from harness import __main__ as entry
from harness.core import deps, paths

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_declared_dependencies_are_the_harness_s_light_packages():
    assert PROJECT["dependencies"] == list(deps.HARNESS)
    assert not {"torch", "triton"} & {*PROJECT["dependencies"], *sum(PROJECT["optional-dependencies"].values(), [])}


def test_the_test_extra_is_what_the_tests_session_adds():
    assert sorted(PROJECT["optional-dependencies"]["test"]) == sorted(noxfile.TEST_EXTRAS)


def test_the_command_is_the_harness_entry_point():
    module, function = PROJECT["scripts"]["zl-bench"].split(":")
    assert sys.modules[module] is entry and callable(getattr(entry, function))


def test_a_copy_away_from_its_checkout_refuses_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(paths, "SHAPES_DIR", tmp_path / "shapes")
    assert entry._run() == 2
    assert capsys.readouterr().err == (f"error: zl_bench runs from its checkout, and {paths.REPO_ROOT} has no "
                                       "shapes/ (not an editable install?): pip install -e CHECKOUT\n")
