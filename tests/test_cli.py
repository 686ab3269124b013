"""The command line's own help: what a newcomer reads first."""

import pytest

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
