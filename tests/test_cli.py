"""The command line's own help: what a newcomer reads first."""

import re
import sys

import pytest
from conftest import REPO

import backends
from harness import cli


def help_of(*argv: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # unwrapped


def test_the_help_describes_the_tool_in_whole_sentences(capsys):
    text = help_of(capsys=capsys)
    assert cli.DESCRIPTION.endswith(".") and cli.DESCRIPTION in text
    assert "what the nox positional" not in text  # the docstring's first line, cut mid-sentence


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_opens_its_help_with_a_description(command, capsys):
    summary, description = cli.COMMANDS[command]
    assert description.endswith(".") and description in help_of(command, capsys=capsys)
    assert summary in help_of(capsys=capsys)  # listed by the top-level help


def test_the_timer_help_names_what_auto_picks_on_every_backend(capsys):
    text = help_of("record", capsys=capsys)
    timer = text[text.index("--timer"):]  # its help, after its choices
    auto = timer[timer.index("auto:"):timer.index("; profiler:")]
    assert {backends.get(name).default_timer for name in backends.NAMES} <= set(re.findall(r"\w+", auto))


def _misspelt_option(command: str) -> tuple[str, str]:
    """(its longest option, that option less its second letter: no prefix, which argparse would take)."""
    usage = cli.build_parser().commands[command].format_usage()
    option = max(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", usage), key=len)
    return option, option[:3] + option[4:]


@pytest.mark.parametrize("command", [c for c in cli.COMMANDS if "--" in cli.build_parser().commands[c].format_usage()])
def test_an_unknown_option_is_the_command_s_error_naming_the_nearest(command, capsys, monkeypatch):
    # Every command, however it was added: argparse alone would show the top-level usage and no guess.
    option, typo = _misspelt_option(command)
    monkeypatch.setattr(sys, "argv", ["/env/bin/zl-bench", command, typo])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(f"usage: zl-bench {command} "), err
    assert err.splitlines()[-1] == f"zl-bench {command}: error: unrecognized arguments: {typo} (did you mean {option}?)"


def test_an_unknown_argument_nothing_resembles_is_said_without_a_guess(capsys):
    with pytest.raises(SystemExit):
        cli.main(["record", "--zzzz"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m harness record: error: unrecognized arguments: --zzzz")


@pytest.mark.parametrize("argv0,prog", [("/env/bin/zl-bench", "zl-bench"),
                                        (str(REPO / "harness" / "__main__.py"), "python -m harness")])
def test_a_bare_command_shows_the_help_under_the_name_it_was_called_by(argv0, prog, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [argv0])
    assert cli.main() == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ") and cli.DESCRIPTION in " ".join(out.split())
