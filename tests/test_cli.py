"""The command line's own help: what a newcomer reads first."""

import argparse

from harness import cli


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_help_describes_the_tool_and_every_command_in_whole_sentences(capsys):
    parser = cli.build_parser()
    assert parser.description.endswith(".") and "nox" in parser.description
    commands = _subparsers(parser)
    assert set(commands) == set(cli.COMMANDS)
    for name, sub in commands.items():
        assert sub.description and sub.description.endswith("."), name
    parser.print_help()
    assert "what the nox\n" not in capsys.readouterr().out  # the docstring's first line, cut mid-sentence
