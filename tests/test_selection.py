"""Which operators a batch runs (harness.providers.selection): the inventories, a selection from
them (given, stored or sampled), the checkouts it needs and the dtypes its ops take."""

from __future__ import annotations

import dataclasses

import pytest
from batch_fakes import ADD, CHECKOUT, FG, MM, OPS
from batch_fakes import parse as parse_batch

from harness.core.errors import UsageError
from harness.providers import catalog, flaggems_scan, selection
from harness.providers.catalog import Entry


def parse(*argv):
    """The selection that `batch ARGV` asks (harness.core.commands.Selection)."""
    return parse_batch(*argv).selection


def test_entries_scan_a_given_checkout_and_ops_path_dirs(tmp_path, monkeypatch, capsys):
    committed = [e for e in catalog.load()]
    assert {e.repo for e in selection.all_entries([], {})} == {e.repo for e in committed}
    assert capsys.readouterr().out == ""
    fresh = flaggems_scan.scan(CHECKOUT, "fg")
    inventory = tmp_path / "inventory_fg.csv"
    kept = [dataclasses.replace(e, collected="yes") for e in fresh[1:]]
    inventory.write_text(catalog.to_csv([*kept, Entry("fg", "gone", "gone", "benchmark/test_gone.py")]))
    monkeypatch.setattr(catalog, "inventory_path", lambda repo: tmp_path / f"inventory_{repo}.csv")
    entries = selection.all_entries([str(OPS), str(OPS / "misbehaving.py"), "a.module"], {"fg": CHECKOUT})
    assert capsys.readouterr().out == (
        f"NOTE: inventory_fg.csv differs from a scan of {CHECKOUT} (1 ops only in the checkout, 1 only in the "
        f"inventory): selecting from the checkout; refresh it with nox -s inventory-regen -- --flaggems-dir "
        f"fg={CHECKOUT}\n")
    fg = [e for e in entries if e.repo == "fg"]
    assert [e.id for e in fg] == [e.id for e in fresh]
    assert [e.collected for e in fg] == [""] + ["yes"] * len(kept)  # the inventory's verdicts are kept
    path_ops = [e for e in entries if e.repo == catalog.PATH_REPO]
    assert {e.op for e in path_ops} >= {"crash_op", "fp32_op", "skip_op"} and len(path_ops) == len(
        {e.id for e in path_ops})  # the dir once; the file and the module name are not scanned
    assert path_ops[0].file == "batch_ops/misbehaving.py"
    assert [e for e in entries if e.repo not in ("fg", catalog.PATH_REPO)] == committed
    inventory.write_text(catalog.to_csv(fresh))
    selection.all_entries([], {"fg": CHECKOUT})
    assert capsys.readouterr().out == ""


def test_select_all_leaves_out_flaggems_repos_loudly(capsys, monkeypatch):
    fg_ops = sum(1 for e in catalog.load() if e.repo == "flaggems")
    selected, excluded, left_out = selection.select(parse("--all"), None, [str(OPS)], {})
    assert {e.repo for e in selected} == {"builtin", "path"} and "skip_op" not in {e.op for e in selected}
    assert [(e.op, why) for e, why in excluded] == [("skip_op", "skip mark: not meaningful on this backend")]
    assert left_out == {"flaggems": fg_ops}
    assert capsys.readouterr().out == (
        f"NOTE: --all leaves out the FlagGems inventories flaggems ({fg_ops} ops): their checkouts were not given; "
        "to include them add --flaggems-dir flaggems=PATH\n")
    selected, _, left_out = selection.select(parse("--all", "--repos", "builtin"), None, [], {})
    assert {e.repo for e in selected} == {"builtin"} and left_out == {} and capsys.readouterr().out == ""
    committed = catalog.load()
    monkeypatch.setattr(catalog, "load", lambda: [*committed, Entry("vllm", "moe", "moe", "benchmark/test_moe.py")])
    assert selection.select(parse("--all"), None, [], {})[2] == {"flaggems": fg_ops, "vllm": 1}
    assert capsys.readouterr().out == (
        f"NOTE: --all leaves out the FlagGems inventories flaggems ({fg_ops} ops), vllm (1 op): their checkouts were "
        "not given; to include them add --flaggems-dir flaggems=PATH --flaggems-dir vllm=PATH\n")


def test_select_uses_the_stored_selection_only_when_none_is_given(tmp_path, capsys):
    stored = [MM.id, ADD.id]
    assert [e.op for e in selection.select(parse(), stored, [], {})[0]] == ["mm", "add"]
    assert [e.op for e in selection.select(parse("--ops", "softmax"), stored, [], {})[0]] == ["softmax"]
    (tmp_path / "ops.txt").write_text("gelu  # a comment\n\n")
    assert [e.op for e in selection.select(parse("--ops", "softmax", "--ops-file", tmp_path / "ops.txt"), stored, [],
                                        {})[0]] == ["softmax", "gelu"]
    assert {e.op for e in selection.select(parse("--repos", "builtin", "--all"), stored, [], {})[0]} > {"add", "mm"}
    assert capsys.readouterr().out == ""
    with pytest.raises(UsageError, match=r"bad operator selection: 'nope': unknown"):
        selection.select(parse("--ops", "nope"), None, [], {})
    with pytest.raises(UsageError, match="--ops-file .* does not exist"):
        selection.select(parse("--ops-file", tmp_path / "missing"), None, [], {})


def test_ops_handed_in_are_selected_as_if_given_only_when_the_command_line_selects_nothing(tmp_path, capsys):
    """A corpus A/B hands in its plan's ops: they are what `--ops` would select (sampled too),
    unless the command line names a selection of its own."""
    assert [e.op for e in selection.select(parse(), None, [], {}, ["mm", "add"])[0]] == ["mm", "add"]
    assert [e.op for e in selection.select(parse("--ops", "softmax"), None, [], {}, ["mm"])[0]] == ["softmax"]
    (tmp_path / "ops.txt").write_text("gelu\n")
    assert [e.op for e in selection.select(parse("--ops-file", tmp_path / "ops.txt"), None, [], {}, ["mm"])[0]] == [
        "gelu"]
    assert len(selection.select(parse("--sample", "1"), None, [], {}, ["mm", "add", "gelu"])[0]) == 1
    capsys.readouterr()


def test_select_samples_a_fresh_selection_not_a_stored_one(capsys):
    five = ["add", "gelu", "mm", "rms_norm", "softmax"]
    full = selection.select(parse("--ops", *five), None, [], {})[0]
    picked = selection.select(parse("--ops", *five, "--sample", "2", "--sample-seed", "3"), None, [], {})[0]
    assert picked == catalog.sample(full, 2, 3) and len(picked) == 2
    assert capsys.readouterr().out == "sample: 2 ops (seed 3) from the selection\n"
    stored = [e.id for e in full]
    assert selection.select(parse("--sample", "2"), stored, [], {})[0] == full  # a resume keeps its sample
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit) as refused:  # refused at the door, as the option declares
        parse("--ops", "add", "--sample", "0")
    assert refused.value.code == 2


def test_a_flaggems_op_needs_its_checkout():
    with pytest.raises(UsageError) as info:
        selection.select(parse("--ops", "flaggems:Concat@Concat"), None, [], {})
    assert str(info.value) == (
        "the selection includes operators of FlagGems repos whose checkouts were not given: flaggems (1 op); add "
        "--flaggems-dir flaggems=PATH, or leave them out with --repos builtin")
    two = [Entry("vllm", "a", "a", "x"), Entry("flaggems", "b", "b", "x"), Entry("vllm", "c", "c", "x"), ADD]
    with pytest.raises(UsageError, match=r"repos whose checkouts were not given: flaggems \(1 op\), vllm \(2 ops\); "
                                         r"add --flaggems-dir flaggems=PATH --flaggems-dir vllm=PATH, or"):
        selection.require_checkouts(two, {"other": CHECKOUT})
    selection.require_checkouts(two, {"vllm": CHECKOUT, "flaggems": CHECKOUT})


def test_op_dtypes_are_known_for_builtin_and_path_ops_only():
    fp32_op = Entry("path", "fp32_op", "misbehaving", "batch_ops/misbehaving.py")
    got = selection.op_dtypes([FG, ADD, fp32_op], [str(OPS)], 120)
    from harness.providers import registry
    assert got == {ADD.id: registry.load("add")[0].dtypes, fp32_op.id: ("fp32",)}
    with pytest.raises(UsageError, match="no_such_op"):
        selection.op_dtypes([Entry("builtin", "no_such_op", "x", "x")], [], 120)
