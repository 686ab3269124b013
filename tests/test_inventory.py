"""Inventories: the static scan of a FlagGems-style checkout, pytest's collection check, shape-file
migration, and selection across repos. The checkout is our own fixture (no GPU needed)."""

import dataclasses
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from harness import cli
from harness.core import batchdir
from harness.core.errors import UsageError
from harness.core.options import RunOptions
from harness.core.paths import OPS_DIR
from harness.providers import builtin_scan, catalog, flaggems_scan, selection
from harness.sessions import batch, inventory_regen

CHECKOUT = REPO / "tests" / "resources" / "flaggems_checkout"


def rows(entries):
    return {(e.op, e.op_file, e.file, e.skip, e.op_names, e.classes) for e in entries}


def test_scan_of_the_fixture_checkout():
    entries = flaggems_scan.scan(CHECKOUT, "flaggems")
    assert {e.repo for e in entries} == {"flaggems"}
    assert rows(entries) == {
        ("avg_pool2d", "avg_pool2d", "benchmark/test_avg_pool2d.py", "", "avg_pool2d",
         "AvgPoolBenchmark;GenericBenchmark;Benchmark"),
        ("mm", "mm", "benchmark/test_mm.py", "", "mm", "BlasBenchmark;Benchmark"),
        ("softmax", "softmax", "benchmark/test_softmax.py", "", "softmax", "UnaryReductionBenchmark;Benchmark"),
        ("log_softmax", "softmax", "benchmark/test_softmax.py", "", "log_softmax",
         "UnaryReductionBenchmark;Benchmark"),
        # A test_-prefixed subfolder: op_file keeps the folder, minus its prefix.
        ("scale_nested", "special/nested", "benchmark/test_special/test_nested.py", "", "scale_nested",
         "NestedBenchmark;GenericBenchmark;Benchmark"),
        ("cholesky", "unsupported", "benchmark/test_unsupported.py", "not supported by this build", "", ""),
        ("own_shapes", "own_shapes", "benchmark/test_own_shapes.py", "", "own_shapes", "OwnShapesBenchmark;Benchmark"),
        ("direct_latency", "own_shapes", "benchmark/test_own_shapes.py", "", "direct_latency", "Benchmark"),
        ("sparse_input", "input_kinds", "benchmark/test_input_kinds.py", "", "sparse_input",
         "SparseInputBenchmark;Benchmark"),
        # Batch triage's fixtures (tests/test_triage.py): they construct no Benchmark.
        ("broken_upstream", "triage", "benchmark/test_triage.py", "", "", ""),
        ("ours_only", "triage", "benchmark/test_triage.py", "", "", ""),
    }


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_scan_follows_classes_helpers_and_marks_statically(tmp_path):
    root = _write(tmp_path, {
        "benchmark/__init__.py": "",
        "benchmark/base.py": """
            class Benchmark:
                def __init__(self, op_name, torch_op=None, **kw): ...
            class BlasBenchmark(Benchmark): ...
            class Mixin: ...
        """,
        "benchmark/test_a.py": """
            import pytest
            import flag_gems  # not importable here: the scan must not import
            from . import base
            from .base import Benchmark, Mixin

            pytestmark = [pytest.mark.filterwarnings("ignore")]
            _gpu_only = pytest.mark.skipif(not flag_gems.has_gpu, reason="needs a GPU")
            _broken = pytest.mark.skip(reason="broken upstream")

            class Parallel(Mixin, base.BlasBenchmark): ...

            class Fixed(Benchmark):
                def __init__(self):
                    super().__init__("fixed_name", None)

            def _run(name, dtype):
                Parallel(op_name=name).run()

            def test_helper():
                _run("via_helper", "fp16")

            @_gpu_only
            def test_local_class():
                class Local(base.GenericMissing, Benchmark): ...
                Local(op_name="local")

            @_broken
            def test_aliased_skip():
                Fixed()

            @pytest.mark.skipif(True, reason="always")
            def test_skipif_true():
                pass

            def helper_not_a_test():
                pass
        """,
        "benchmark/test_a_dup.py": "def test_helper():\n    pass\n",
        "benchmark/test_FLA/test_kda.py": """
            import pytest
            from benchmark.base import Benchmark
            pytestmark = pytest.mark.skip("whole module")
            class KdaBenchmark(Benchmark): ...
            def test_perf_kda():
                KdaBenchmark(op_name="kda")
        """,
        "benchmark/models_benchmark/test_not_collected.py": "def test_x():\n    pass\n",
    })
    by_op = {(e.op, e.op_file): e for e in flaggems_scan.scan(root, "fg")}
    assert set(by_op) == {("helper", "a"), ("local_class", "a"), ("aliased_skip", "a"), ("skipif_true", "a"),
                          ("helper", "a_dup"), ("perf_kda", "FLA/kda")}
    helper = by_op[("helper", "a")]
    assert helper.op_names == "via_helper" and helper.classes == "Parallel;Mixin;BlasBenchmark;Benchmark"
    local = by_op[("local_class", "a")]  # skipif is conditional: not a skip
    assert (local.op_names, local.classes, local.skip) == ("local", "Local;GenericMissing;Benchmark", "")
    assert by_op[("aliased_skip", "a")].skip == "broken upstream"
    assert by_op[("aliased_skip", "a")].op_names == "fixed_name"  # passed up by the class's __init__
    assert by_op[("skipif_true", "a")].skip == "always"
    kda = by_op[("perf_kda", "FLA/kda")]
    assert (kda.file, kda.skip, kda.classes) == ("benchmark/test_FLA/test_kda.py", "whole module",
                                                  "KdaBenchmark;Benchmark")
    # One name in two files: both stay selectable, and their keys and per-op dirs differ.
    entries = catalog.qualify(list(by_op.values()))
    dup = [e for e in entries if e.op == "helper"]
    assert {e.key for e in dup} == {"fg:helper@a", "fg:helper@a_dup"}
    assert len({batchdir.op_dir(tmp_path, e.key) for e in dup}) == 2
    with pytest.raises(catalog.SelectionError, match=r"'helper': ambiguous"):
        catalog.select(entries, ["helper"], False, None, {})
    selected, _ = catalog.select(entries, ["fg:helper@a_dup"], False, None, {})
    assert [e.file for e in selected] == ["benchmark/test_a_dup.py"]


@pytest.fixture
def checkout_copy(tmp_path):
    """The fixture checkout copied, so pytest's collection writes nothing into the repo."""
    return Path(shutil.copytree(CHECKOUT, tmp_path / "checkout"))


def test_verify_collect_marks_what_pytest_does_not_collect(checkout_copy):
    (checkout_copy / "benchmark" / "test_broken.py").write_text(
        "import no_such_module\n\n\ndef test_broken():\n    pass\n")
    entries = flaggems_scan.verify_collect(checkout_copy, flaggems_scan.scan(checkout_copy, "flaggems"))
    collected = {e.op: e.collected for e in entries}
    assert collected == {"avg_pool2d": "yes", "mm": "yes", "softmax": "yes", "log_softmax": "yes",
                         "scale_nested": "yes", "cholesky": "yes", "own_shapes": "yes", "direct_latency": "yes",
                         "sparse_input": "yes", "broken_upstream": "yes", "ours_only": "yes", "broken": "no"}
    # Without a new verification, a regeneration keeps the last one's values (new ops: blank).
    fresh = flaggems_scan.scan(checkout_copy, "flaggems") + [catalog.Entry("flaggems", "new", "new", "x")]
    kept = {e.op: e.collected for e in flaggems_scan.keep_verified(fresh, entries)}
    assert kept == {**collected, "new": ""}
    # A suite whose conftest cannot import says nothing per op: an error, not `no` everywhere.
    with open(checkout_copy / "benchmark" / "conftest.py", "a") as f:
        f.write("\nraise ImportError('no device here')\n")
    with pytest.raises(catalog.SelectionError, match="pytest could not collect"):
        flaggems_scan.verify_collect(checkout_copy, entries)


def test_migrate_shapes_keeps_merges_and_sets_aside(checkout_copy, tmp_path):
    with open(checkout_copy / "benchmark" / "core_shapes.yaml", "a") as f:
        f.write("gone_upstream:\n  shapes: [[1]]\n")  # names no op of the checkout: never merged
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump({
        "softmax": {"shapes": [[8, 8]]},             # an op_name
        "BlasBenchmark": {"shapes": [[1, 2, 3, 4]]},  # a Benchmark class
        "norm": {"shapes": [[4, 4]]},                 # a built-in family key
        "zz_removed_op": {"shapes": [[2]]},           # names nothing any more
    }, sort_keys=False))
    out = tmp_path / "out" / "shapes.yaml"
    entries = flaggems_scan.scan(checkout_copy, "flaggems")
    counts = inventory_regen.migrate_shapes(source, out, entries, {"flaggems": checkout_copy})
    assert counts == {"kept": 3, "merged": 1, "unmatched": 1}
    migrated = yaml.safe_load(out.read_text())
    assert list(migrated) == ["softmax", "BlasBenchmark", "norm", "UnaryReductionBenchmark"]
    assert migrated["softmax"] == {"shapes": [[8, 8]]}  # ours wins over upstream's
    assert migrated["UnaryReductionBenchmark"] == {"shapes": [[2, 16]]}
    assert yaml.safe_load((tmp_path / "out" / "shapes.unmatched.yaml").read_text()) == {
        "zz_removed_op": {"shapes": [[2]]}}


def test_inventory_regen_cli(checkout_copy, tmp_path, harness):
    source = tmp_path / "in.yaml"
    source.write_text("mm:\n  shapes: [[1, 2, 3, 4]]\nzz_gone:\n  shapes: [[1]]\n")
    out = tmp_path / "migrated.yaml"
    proc = harness("inventory-regen", "--flaggems-dir", f"fx={checkout_copy}", "--migrate-shapes", source, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "kept 1, merged 3 from the checkouts' core_shapes.yaml; unmatched 1" in proc.stdout
    # --check writes nothing; an inventory never generated is out of date, with the command to fix it.
    proc = harness("inventory-regen", "--flaggems-dir", f"fx={checkout_copy}", "--check")
    assert proc.returncode == 2 and "inventory_fx.csv" in proc.stderr
    assert f"--flaggems-dir fx={checkout_copy}" in proc.stderr
    assert not (OPS_DIR / "inventory_fx.csv").exists()
    proc = harness("inventory-regen", "--verify-collect")
    assert proc.returncode == 2 and "give --flaggems-dir" in proc.stderr


# --- selection across repos ----------------------------------------------------------------------
def _corpus():
    builtin = builtin_scan.scan_dir(OPS_DIR, catalog.BUILTIN, OPS_DIR.parent)
    return builtin + flaggems_scan.scan(CHECKOUT, "flaggems") + [
        catalog.Entry("vllm", "fused_moe", "fused_moe", "benchmark/test_fused_moe.py", collected="no")]


def test_selection_across_repos():
    entries = _corpus()
    with pytest.raises(catalog.SelectionError) as info:
        catalog.select(entries, ["softmax", "mm", "flaggems:nope"], False, None, {})
    text = str(info.value)
    assert "'softmax': ambiguous (builtin:softmax@softmax, flaggems:softmax@softmax)" in text
    assert "'mm': ambiguous" in text and "'flaggems:nope': unknown" in text
    selected, _ = catalog.select(entries, ["builtin:softmax", "flaggems:softmax", "log_softmax",
                                             "flaggems:scale_nested@special/nested"], False, None, {})
    assert [e.key for e in selected] == ["builtin:softmax", "flaggems:softmax", "flaggems:log_softmax",
                                         "flaggems:scale_nested"]
    # Dismissals name a repo's op, or an op in every repo.
    selected, excluded = catalog.select(entries, None, True, None, {"flaggems:mm": "needs tf32", "gelu": "slow"})
    assert {e.key for e, _ in excluded} == {"flaggems:mm", "builtin:gelu", "flaggems:cholesky", "vllm:fused_moe"}
    assert dict((e.key, why) for e, why in excluded)["vllm:fused_moe"].startswith("pytest did not collect")
    assert "builtin:mm" in {e.key for e in selected}


def test_bare_names_resolve_among_the_inventories_that_can_run():
    entries = _corpus()
    here = {catalog.BUILTIN, catalog.PATH_REPO}  # no FlagGems checkout given
    selected, _ = catalog.select(entries, ["softmax", "mm", "log_softmax"], False, None, {}, here)
    # softmax and mm are the built-in ones; log_softmax exists only in flaggems, so it stays
    # selected there and needs its checkout (require_checkouts says so before anything runs).
    assert [e.key for e in selected] == ["builtin:softmax", "builtin:mm", "flaggems:log_softmax"]
    selected, _ = catalog.select(entries, ["flaggems:softmax"], False, None, {}, here)
    assert [e.key for e in selected] == ["flaggems:softmax"]  # named explicitly: its repo, runnable or not
    with pytest.raises(catalog.SelectionError, match=r"'softmax': ambiguous \(builtin:softmax@softmax, "
                                                       r"flaggems:softmax@softmax\)"):
        catalog.select(entries, ["softmax"], False, None, {}, here | {"flaggems"})  # its checkout given


def parse_batch(*argv):
    """The selection that `batch ARGV` asks."""
    return cli.parse_request(["batch", *argv]).selection


def test_batch_bare_names_need_no_flaggems_checkout():
    selected, _, _ = selection.select(parse_batch("--ops", "softmax", "add"), None, [], {})
    assert [e.key for e in selected] == ["builtin:softmax", "builtin:add"]
    with pytest.raises(UsageError, match="--flaggems-dir flaggems=PATH"):
        selection.select(parse_batch("--ops", "flaggems:softmax"), None, [], {})


def test_flaggems_ops_without_their_checkout_fail_before_running():
    selected, _ = catalog.select(_corpus(), ["flaggems:mm", "flaggems:softmax", "builtin:add"], False, None, {})
    with pytest.raises(UsageError) as info:
        selection.require_checkouts(selected, {})
    assert "flaggems (2 ops)" in str(info.value)
    assert "--flaggems-dir flaggems=PATH" in str(info.value) and "--repos builtin" in str(info.value)
    selection.require_checkouts(selected, {"flaggems": CHECKOUT})


def test_batch_all_without_checkouts_says_what_it_leaves_out(harness, capsys):
    selection.select(parse_batch("--all"), None, [], {})
    out = capsys.readouterr().out
    assert "NOTE: --all leaves out the FlagGems inventories flaggems (" in out and "--flaggems-dir flaggems=PATH" in out
    proc = harness("batch", "--backend", "interpreter", "--ops", "flaggems:mm@mm")
    assert proc.returncode == 2 and "--flaggems-dir flaggems=PATH" in proc.stderr


def test_batch_runs_flaggems_ops_with_their_checkout(tmp_path, capsys):
    entries = selection.all_entries([], {"flaggems": CHECKOUT})
    # The checkout given is what runs: selection reads its scan, not the committed catalog.
    assert {e.op for e in entries if e.repo == "flaggems"} == {e.op for e in flaggems_scan.scan(CHECKOUT, "x")}
    assert "differs from a scan of" in capsys.readouterr().out
    opts = batch.Options(RunOptions(backend="interpreter", flaggems_dirs=[f"flaggems={CHECKOUT}"],
                                    level="comprehensive"), [0])
    runner = batch.Batch(tmp_path, opts, {})
    nested = next(e for e in entries if e.op == "scale_nested")
    cmd = runner._command(nested, 0, ["fp32"], tmp_path / "a1")
    assert cmd[:4] == ["record", "flaggems:scale_nested@special/nested", "--level", "comprehensive"]
    assert cmd[cmd.index("--flaggems-dir") + 1] == f"flaggems={CHECKOUT}"
    assert cmd[cmd.index("--dtypes") + 1] == "fp32"
    earlier = tmp_path / "earlier"
    earlier_pass = batchdir.StatusRow(nested.op, nested.repo, nested.op_file, "PASS", run_dir="ops/x/attempt1/run")
    runner.replay_sources = {nested.id: earlier_pass}
    runner.opts = dataclasses.replace(runner.opts, replay_root=earlier)
    cmd = runner._command(nested, 0, None, tmp_path / "a1")
    assert cmd[:2] == ["replay", str(earlier / "ops/x/attempt1/run")] and "--level" not in cmd
    assert cmd[cmd.index("--flaggems-dir") + 1] == f"flaggems={CHECKOUT}"


def test_committed_flaggems_inventories_are_well_formed():
    """Generated from checkouts this repo does not hold: at least their rows must agree with themselves."""
    for path in OPS_DIR.glob("inventory_*.csv"):
        repo = path.stem.removeprefix("inventory_")
        if not catalog.needs_checkout(repo):
            continue
        entries = catalog.read_csv(path)
        assert path.read_text() == catalog.to_csv(entries)
        assert len({e.id for e in entries}) == len(entries)
        if repo == "flaggems":  # rows docs/user-guide.md names
            by_id = {e.id: e.file for e in entries}
            assert by_id["flaggems:mm@mm"] == "benchmark/test_mm.py"
            assert by_id["flaggems:perf_fused_recurrent_gated_delta_rule@FLA/fused_recurrent_gated_delta_rule_perf"] \
                == "benchmark/test_FLA/test_fused_recurrent_gated_delta_rule_perf.py"
        for e in entries:
            assert e.repo == repo and e.file.startswith("benchmark/") and e.collected in ("", "yes", "no")
            # docs/user-guide.md's rule, restated here rather than calling the scanner that wrote the file.
            parts = Path(e.file).relative_to("benchmark").with_suffix("").parts
            assert "/".join(part.removeprefix("test_") for part in parts) == e.op_file


# --- files ---------------------------------------------------------------------------------------
def test_inventory_csv_round_trips_every_column(tmp_path):
    entries = [catalog.Entry("fg", "mm", "mm", "benchmark/test_mm.py", "", "mm", "BlasBenchmark;Benchmark", "yes"),
               catalog.Entry("fg", "addmm", "mm", "benchmark/test_mm.py", 'needs "tf32", sm80\r\nsee #12', "addmm",
                             "", "no"),
               catalog.Entry("fg", "abs", "unary", "benchmark/test_unary.py")]
    path = catalog.inventory_path("fg", tmp_path)
    assert path == tmp_path / "inventory_fg.csv"
    path.write_text(catalog.to_csv(entries), newline="")
    assert path.read_text().splitlines()[0] == ",".join(catalog.COLUMNS)
    assert catalog.read_csv(path) == [entries[1], entries[0], entries[2]]  # by op_file, then op


def test_inventory_csv_without_a_newer_column_reads_it_blank(tmp_path):
    path = tmp_path / "inventory_old.csv"
    path.write_text("repo,op,op_file,file,skip\nold,mm,mm,benchmark/test_mm.py,\n")
    assert catalog.read_csv(path) == [catalog.Entry("old", "mm", "mm", "benchmark/test_mm.py")]
    assert catalog.read_csv(tmp_path / "inventory_none.csv") == []


def test_load_reads_every_inventory_and_nothing_else(tmp_path):
    for repo, op in (("b", "mm"), ("a", "add"), ("c", "gelu")):
        catalog.inventory_path(repo, tmp_path).write_text(catalog.to_csv([catalog.Entry(repo, op, op, f"{op}.py")]))
    (tmp_path / "other.csv").write_text(catalog.to_csv([catalog.Entry("x", "x", "x", "x.py")]))
    assert [e.id for e in catalog.load(tmp_path)] == ["a:add@add", "b:mm@mm", "c:gelu@gelu"]


def test_dismiss_list(tmp_path):
    path = tmp_path / "dismiss.txt"
    assert catalog.load_dismissed(path) == {}
    path.write_text("# why each op is left out\n\n"
                    "mm  # needs tf32\n"
                    "fg:softmax@softmax #  flaky upstream (#12)  \n")
    assert catalog.load_dismissed(path) == {"mm": "needs tf32", "fg:softmax@softmax": "flaky upstream (#12)"}
    path.write_text("# header\nmm  # needs tf32\n\nfg:gelu   #   \n")
    with pytest.raises(catalog.SelectionError) as info:
        catalog.load_dismissed(path)
    assert str(info.value) == f"{path}:4: 'fg:gelu' has no reason (write `op  # why it is dismissed`)"


def test_ops_file(tmp_path):
    path = tmp_path / "ops.txt"
    with pytest.raises(catalog.SelectionError) as info:
        catalog.read_ops_file(path)
    assert str(info.value) == f"--ops-file {path} does not exist"
    path.write_text("# screening list\nsoftmax\n\n  fg:mm@mm   # the big one\n#gelu\nadd# tight\n")
    assert catalog.read_ops_file(path) == ["softmax", "fg:mm@mm", "add"]


def test_entry_keys_and_repos():
    e = catalog.Entry("fg", "mm", "blas/mm", "benchmark/test_blas/test_mm.py")
    assert (e.key, e.id) == ("fg:mm", "fg:mm@blas/mm")
    assert catalog.dataclasses.replace(e, qualified=True).key == "fg:mm@blas/mm"
    assert catalog.dataclasses.replace(e, qualified=True) == e  # `qualified` is presentation only
    assert [catalog.needs_checkout(r) for r in (catalog.BUILTIN, catalog.PATH_REPO, "flaggems")] == [False, False, True]


def test_builtin_scan_skips_private_modules_and_names_a_broken_file(tmp_path):
    _write(tmp_path / "ops", {
        "good.py": 'good = Operator(name="good", skip="slow", shape_keys=("norm", "x"))\n',
        "_helpers.py": 'h = Operator(name="private")\n',
        "more.py": 'm = Operator(name="more", shape_keys=["norm", "y", 3 + 1])\n',
    })
    entries = builtin_scan.scan_dir(tmp_path / "ops", "path")
    assert [(e.repo, e.op, e.op_file, e.file, e.skip) for e in entries] == [
        ("path", "good", "good", "ops/good.py", "slow"), ("path", "more", "more", "ops/more.py", "")]
    assert builtin_scan.builtin_family_keys(tmp_path / "ops") == {"norm", "x", "y"}
    (tmp_path / "ops" / "bad.py").write_text("def broken(:\n")
    with pytest.raises(SyntaxError) as info:
        builtin_scan.scan_dir(tmp_path / "ops", "path")
    assert info.value.filename == str(tmp_path / "ops" / "bad.py")


# --- selection -------------------------------------------------------------------------------------
def _entries():
    E = catalog.Entry
    return [E("builtin", "softmax", "softmax", "ops/softmax.py"), E("builtin", "mm", "mm", "ops/mm.py"),
            E("fg", "softmax", "softmax", "benchmark/test_softmax.py"),
            E("fg", "helper", "a", "benchmark/test_a.py"), E("fg", "helper", "a_dup", "benchmark/test_a_dup.py"),
            E("fg", "cholesky", "linalg", "benchmark/test_linalg.py", skip="not supported"),
            E("fg", "lost", "lost", "benchmark/test_lost.py", collected="no"),
            E("vllm", "moe", "moe", "benchmark/test_moe.py")]


def keys(selected):
    return [e.key for e in selected]


def test_selection_errors_list_every_bad_entry_in_one_line():
    with pytest.raises(catalog.SelectionError) as info:
        catalog.select(_entries(), ["nope", "builtin:mm", "helper", "fg:mm"], False, None, {})
    assert str(info.value) == ("bad operator selection: 'nope': unknown; 'helper': ambiguous "
                               "(fg:helper@a, fg:helper@a_dup); 'fg:mm': unknown; "
                               "known here: builtin: mm, softmax; fg: cholesky, helper, lost, softmax; vllm: moe")
    for specs in (None, []):
        with pytest.raises(catalog.SelectionError) as info:
            catalog.select(_entries(), specs, False, None, {})
        assert str(info.value) == "nothing selected: give --all, --ops or --ops-file"


def test_selection_keeps_to_the_repos_asked_for():
    selected, _ = catalog.select(_entries(), ["softmax"], False, ["fg"], {})
    assert keys(selected) == ["fg:softmax"]
    selected, excluded = catalog.select(_entries(), None, True, ["builtin", "vllm"], {})
    assert keys(selected) == ["builtin:softmax", "builtin:mm", "vllm:moe"] and excluded == []
    with pytest.raises(catalog.SelectionError, match="'mm': unknown"):
        catalog.select(_entries(), ["mm"], False, ["fg"], {})


def test_selection_spec_forms():
    selected, _ = catalog.select(_entries(), ["fg:helper@a_dup", "vllm:moe", "mm", "builtin:mm", "helper@a"],
                                 False, None, {})
    # One op named twice runs once; names shared within a repo carry their op_file.
    assert keys(selected) == ["fg:helper@a_dup", "vllm:moe", "builtin:mm", "fg:helper@a"]
    with pytest.raises(catalog.SelectionError, match=r"'fg:helper@b': unknown"):
        catalog.select(_entries(), ["fg:helper@b"], False, None, {})


def test_dismissals_and_marks_exclude_with_their_reason():
    dismissed = {"fg:helper@a_dup": "one file is enough", "builtin:mm": "slow here", "moe": "needs 8 GPUs"}
    selected, excluded = catalog.select(_entries(), None, True, None, dismissed)
    assert keys(selected) == ["builtin:softmax", "fg:softmax", "fg:helper@a"]
    assert [(e.key, why) for e, why in excluded] == [
        ("builtin:mm", "dismissed: slow here"), ("fg:helper@a_dup", "dismissed: one file is enough"),
        ("fg:cholesky", "skip mark: not supported"),
        ("fg:lost", "pytest did not collect it (inventory-regen --verify-collect)"),
        ("vllm:moe", "dismissed: needs 8 GPUs")]
    # Named explicitly, a skip-marked or uncollected op runs (to see why); a dismissed one never.
    selected, excluded = catalog.select(_entries(), ["cholesky", "lost", "moe"], False, None, dismissed)
    assert keys(selected) == ["fg:cholesky", "fg:lost"]
    assert [(e.key, why) for e, why in excluded] == [("vllm:moe", "dismissed: needs 8 GPUs")]


def test_sample_of_one():
    pool = [catalog.Entry("r", f"op{i}", f"op{i}", f"op{i}.py") for i in range(5)]
    (one,) = catalog.sample(pool, 1, seed=3)
    assert one in pool and catalog.sample(pool, 1, seed=3) == [one]


def test_one_selection_grammar_parses_every_form():
    parse = catalog.Selection.parse
    assert parse("softmax") == catalog.Selection("softmax")
    assert parse("builtin:softmax") == catalog.Selection("softmax", "builtin")
    assert parse("flaggems:kda@FLA/kda") == catalog.Selection("kda", "flaggems", "FLA/kda")
    assert parse("mm@mm") == catalog.Selection("mm", None, "mm")


def test_a_dismissal_takes_the_selection_grammar_op_at_file_too(tmp_path):
    entries = [catalog.Entry("flaggems", "softmax_backward", "softmax", "benchmark/test_softmax.py"),
               catalog.Entry("flaggems", "softmax_backward", "softmax_b", "benchmark/test_softmax_b.py")]
    selected, excluded = catalog.select(entries, None, True, None, {"softmax_backward@softmax": "flaky"})
    assert [e.op_file for e in selected] == ["softmax_b"]
    assert [(e.op_file, why) for e, why in excluded] == [("softmax", "dismissed: flaky")]


def test_the_docs_command_examples_name_operators_the_inventories_have():
    inventory = catalog.load()
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    examples = [m.group(0) for page in pages for line in page.read_text().splitlines() if "nox -s " in line
                for m in re.finditer(r"\b(builtin|flaggems):[\w.-]+(@[\w/.-]+)?", line)]
    assert "flaggems:softmax_backward@softmax" in examples
    unknown = [e for e in examples if not any(catalog.Selection.parse(e).matches(i) for i in inventory)]
    assert unknown == []
