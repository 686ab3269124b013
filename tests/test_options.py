"""The run options, declared once (harness.core.options): the parser, the argv, the stored form and
its checks all come from one declaration per option."""

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest

from harness import cli
from harness.core.options import BatchOptions, CorpusOptions, ExperimentOptions, OptionSet, RunOptions, _plain, declared

FULL = RunOptions(backend="cuda", device=2, shapes=Path("/s.yaml"), dtypes=("fp16",), ops_paths=("/tmp", "mod.x"),
                  flaggems_dirs=("flaggems=/fg",), level="core", flagtune="1", libtuner_cache="user", seed=3,
                  timer="direct", l2="cold", warmup_ms=1.5, rep_ms=7.0, windows=3)


def refuse(name, value, what):
    return ValueError(f"{name} = {value!r} is not {what}")


# What a command line could give an option, by the type its field holds: an option's example is the first
# that its parser type and its stored-value check take (a list: KEY=VAL items for --a-env, dtypes for --dtypes).
EXAMPLE_TEXTS = {str: [["0,1"]], int: [["3"]], float: [["0.5"], ["0.5%"]], Path: [["/p"]],
                 tuple: [["X=1", "Y=2"], ["fp16", "bf16"]]}


def held_type(option_set, field) -> type:
    """The type a field holds when set: `str` of `str | None`, `tuple` of `tuple[str, ...]`."""
    hint = typing.get_type_hints(option_set)[field.name]
    if isinstance(hint, types.UnionType):
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    return typing.get_origin(hint) or hint


def example(option_set, field, meta, switched: bool):
    """A value of the field's type that the command line could give it, other than what its parser gives
    when it is not given; `switched` is a --X/--no-X switch's."""
    kind = held_type(option_set, field)
    defaults = (meta.default, meta.record_default)
    if kind is bool:
        return switched if meta.switch else True  # a flag alone: its False is not given
    if meta.choices:
        return next(c for c in meta.choices if c not in defaults)
    convert = meta.type or str
    for texts in EXAMPLE_TEXTS[kind]:
        try:
            if meta.repeat or meta.nargs:
                value = tuple(map(convert, texts))
            elif kind is tuple:  # one comma-separated value (--dtypes)
                value = tuple(convert(",".join(texts)))
            else:
                value = convert(texts[0])
        except (argparse.ArgumentTypeError, ValueError):
            continue
        if meta.check(_plain(value)) and value not in defaults:
            return value
    pytest.fail(f"no example for {option_set.__name__}.{field.name}: add one to EXAMPLE_TEXTS")


def taken_by(option_set, command: str) -> list:
    """The options of `option_set` that `command` parses (replay refuses the record-only ones)."""
    return [(field, meta) for field, meta in declared(option_set) if command in meta.commands
            and not (command == "replay" and meta.record_only)]


# Every option set, with every command that parses any of its options: a new one is covered as it is declared.
PARSERS = [(option_set, command) for option_set in OptionSet.__subclasses__()
           for command in dict.fromkeys(c for _, meta in declared(option_set) for c in meta.commands)]


@pytest.mark.parametrize("switched", [False, True], ids=["switches-off", "switches-on"])
@pytest.mark.parametrize(("option_set", "command"), PARSERS, ids=[f"{s.__name__}-{c}" for s, c in PARSERS])
def test_every_option_given_a_value_not_its_default_parses_back_from_the_argv_it_writes(option_set, command,
                                                                                          switched):
    """Each option a command takes, set to a value of its type that is not its default (a switch turned off
    too: `--no-triage`), is in the argv `to_argv` writes and parses back to the same value."""
    taken = taken_by(option_set, command)
    given = option_set(**{field.name: example(option_set, field, meta, switched) for field, meta in taken})
    assert set(given.given()) == {field.name for field, _ in taken}
    parsed = cli.build_parser().parse_args([command, *given.to_argv()])
    assert option_set.from_namespace(parsed) == given


@pytest.mark.parametrize("command", ["record", "ab", "batch"])
def test_every_option_parses_back_from_its_argv_on_every_command_that_takes_it(command):
    argv = [command, *(["add"] if command == "record" else []), *FULL.to_argv()]
    assert RunOptions.from_namespace(cli.build_parser().parse_args(argv)) == FULL


def test_the_experiment_options_parse_back_from_their_argv_and_are_what_a_resume_names():
    """`ab`'s experiment group is derived from ExperimentOptions: each option parses back from the argv
    the set writes, and `flags` names each one given (a corpus A/B's resume refuses them by these)."""
    given = ExperimentOptions(repeats=5, fdr=0.1, a_env=("X=1", "Y=2"), a_python="/a/python", b_env=("Z=3",),
                              b_python="/b/python", step_start="fork", step_passes="every")
    parsed = cli.build_parser().parse_args(["ab", *given.to_argv()])
    assert ExperimentOptions.from_namespace(parsed) == given
    assert given.flags() == ["--repeats", "--fdr", "--a-env", "--a-python", "--b-env", "--b-python", "--step-start",
                             "--step-passes"]
    assert ExperimentOptions.from_namespace(cli.build_parser().parse_args(["ab"])).given() == {}
    with pytest.raises(ValueError, match="repeats = 1 is not an integer from 2 to 100"):
        ExperimentOptions.from_dict({"repeats": 1}, refuse)
    with pytest.raises(ValueError, match="a_env = \\['X'\\] is not a list of KEY=VAL"):
        ExperimentOptions.from_dict({"a_env": ["X"]}, refuse)


@pytest.mark.parametrize("command", ["ab", "batch"])
def test_the_corpus_options_parse_back_from_their_argv_and_their_defaults_are_not_given(command):
    """The selection and running options a batch and a corpus A/B share: a flag alone (--all), one or more
    values (--repos), a repeated one (--slurm-param); a value the parser gives when it is not given
    (--executor local, --sample-seed 0) is not given, so it makes no `ab` a corpus A/B."""
    given = CorpusOptions(all=True, ops_file=Path("/f"), repos=("builtin", "flaggems"), sample=3, sample_seed=7,
                          resume=True, batch_dir=Path("/b"), executor="ray", ray_address="host:1",
                          slurm_param=("partition=gpu", "account=x"))
    argv = given.to_argv()
    assert argv[:4] == ["--all", "--ops-file", "/f", "--repos"] and argv[4:6] == ["builtin", "flaggems"]
    assert CorpusOptions.from_namespace(cli.build_parser().parse_args([command, *argv])) == given
    parsed = CorpusOptions.from_namespace(cli.build_parser().parse_args([command]))
    assert (parsed.all, parsed.resume, parsed.executor, parsed.sample_seed) == (False, False, "local", 0)
    assert parsed.given() == {} and parsed.to_argv() == []
    defaults = CorpusOptions(all=False, executor="local", sample_seed=0, resume=False)
    assert defaults.given() == {} and defaults.to_argv() == []


def test_the_stored_form_round_trips_through_json_without_the_device_which_is_each_ops_own():
    stored = json.loads(json.dumps(FULL.to_dict()))
    assert "device" not in stored and set(stored) == {f.name for f, meta in declared(RunOptions) if meta.stored}
    assert RunOptions.from_dict(stored, refuse) == dataclasses.replace(FULL, device=None)
    how = BatchOptions(devices="0,1", op_timeout=5.0, replay_root=Path("/r"), triage=False)
    assert BatchOptions.from_dict(json.loads(json.dumps(how.to_dict())), refuse) == how


def test_a_stored_value_is_checked_as_its_flag_would_be_and_made_absolute_against_its_file(tmp_path):
    for name, value in (("seed", -1), ("timer", "fast"), ("dtypes", ["fp64"]), ("flagtune", True), ("device", "0"),
                        ("windows", 0), ("windows", 2.0), ("windows", True)):
        with pytest.raises(ValueError, match=f"^{name} = "):
            RunOptions.from_dict({name: value}, refuse)
    loaded = RunOptions.from_dict({"shapes": "s.yaml", "ops_paths": ["ops"], "flaggems_dirs": ["ck"],
                                   "libtuner_cache": "t.db", "flagtune": 1}, refuse, tmp_path)
    assert loaded == RunOptions(shapes=tmp_path / "s.yaml", ops_paths=(str(tmp_path / "ops"),),
                                flaggems_dirs=(f"flaggems={tmp_path / 'ck'}",), libtuner_cache=str(tmp_path / "t.db"),
                                flagtune="1")
    assert RunOptions.from_dict({"shapes": "upstream"}, refuse, tmp_path).shapes == Path("upstream")


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "two"])
def test_windows_that_are_not_a_positive_integer_are_refused_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["record", "add", "--windows", value])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exc.value.code == 2 and len(errors) == 1
    assert errors[0].endswith(f"error: argument --windows: must be an integer >= 1, not {value!r}")
    assert cli.build_parser().parse_args(["record", "add", "--windows", "2"]).windows == 2


def test_a_replay_keeps_what_its_record_was_given_and_a_resume_is_the_stored_set_with_what_is_given():
    assert FULL.for_replay() == RunOptions(device=2, shapes=Path("/s.yaml"), dtypes=("fp16",),
                                           ops_paths=("/tmp", "mod.x"), flaggems_dirs=("flaggems=/fg",))
    assert FULL.measurement() == RunOptions(seed=3, timer="direct", l2="cold", warmup_ms=1.5, rep_ms=7.0, windows=3)
    given = RunOptions.from_namespace(cli.build_parser().parse_args(["batch", "--l2", "warm", "--seed", "0"]))
    assert given.given() == {"l2": "warm", "seed": 0}  # seed 0 was given
    assert given.flags() == ["--seed", "--l2"]


@pytest.mark.parametrize(("command", "flag", "value", "what"), [
    ("record", "--seed", "-1", "an integer from 0 to 4294967295"),
    ("record", "--seed", "4294967296", "an integer from 0 to 4294967295"),
    ("record", "--rep-ms", "nan", "a number of ms from 0 to 600000"),
    ("record", "--warmup-ms", "inf", "a number of ms from 0 to 600000"),
    ("record", "--warmup-ms", "1e308", "a number of ms from 0 to 600000"),
    ("record", "--windows", "65", "an integer from 1 to 64"),
    ("batch", "--op-timeout", "inf", "a number of seconds > 0, at most 604800 (a week)"),
    ("batch", "--op-timeout", "1e308", "a number of seconds > 0, at most 604800 (a week)"),
    ("batch", "--sample", "0", "an integer >= 1"),
    ("ab", "--repeats", "1000000000000", "an integer from 2 to 100, or auto"),
    ("ab", "--repeats", "1", "an integer from 2 to 100, or auto"),
    ("ab", "--max-repeats", "2", "an integer from 3 to 100"),
    ("ab", "--resolve", "50%", "a percentage above 0.3% (the margin a call clears) and below 50%"),
    ("ab", "--resolve", "0.3%", "a percentage above 0.3% (the margin a call clears) and below 50%"),
    ("ab", "--fdr", "nan", "a number between 0 and 1"),
])
def test_a_number_its_option_declares_out_of_range_is_refused_at_the_door(command, flag, value, what, capsys):
    """The parser applies the declaration's own check, the one a plan or a batch.json gets: no NaN, infinity or
    count beyond its ceiling reaches a run."""
    argv = [command, *(["softmax"] if command == "record" else []), flag, value]
    with pytest.raises(SystemExit) as refused:
        cli.build_parser().parse_args(argv)
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {flag}: must be {what}, not {value!r}")
