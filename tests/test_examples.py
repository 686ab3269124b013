"""docs/examples/ holds real H200 reports (a single A/B, a corpus A/B) beside the results they were
made from (results.tar.xz: the run files the report code reads). Each is regenerated here, on a CPU,
by the tool's own report code from those results, and must come out byte for byte as committed:
an example that no longer matches what the code writes fails here, so it is re-rendered or the
change is questioned. docs/examples/README.md says how to refresh one."""

import json
import os
import re
import tarfile
import types
from pathlib import Path

import matplotlib
from conftest import REPO

from harness.sessions import ab, corpus_ab
from reports import compare, sequential

EXAMPLES = REPO / "docs" / "examples"
AB_EXAMPLE = EXAMPLES / "ab-h200"
CORPUS_EXAMPLE = EXAMPLES / "corpus-h200"
RESULTS = "results.tar.xz"
AB_FILES = ("report.md", "report.csv", "report.json", "report.html", "ratios.png")
CORPUS_FILES = ("report.md", "report.csv", "report.json", "report.html")
# Set to 1 after a deliberate change to the reports: the committed files are rewritten with what the
# code writes now (review the diff), instead of compared.
REWRITE = os.environ.get("ZL_BENCH_REWRITE_EXAMPLES") == "1"


def _unpack(example: Path, dest: Path) -> Path:
    dest.mkdir()
    with tarfile.open(example / RESULTS, "r:xz") as tar:
        # The safe filter where this Python has it (3.10.12 on): the archive is ours, committed here.
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest


def _moved(ab_json: Path, original: str, here: Path) -> None:
    """ab.json names each step's run dir by its absolute path on the H200 host: pointed at the
    unpacked copy, as the report code reads the runs from there."""
    ab_json.write_text(ab_json.read_text().replace(original, str(here)))


def _step_prefix(step: dict) -> str:
    """The A/B dir a step's run dir (`<ab dir>/<op>/<step>/<op>_<ts>`) lay in when it ran."""
    run_dir = step["run_dir"]
    suffix = f"/{step['step']}/{Path(run_dir).name}"
    assert run_dir.endswith(suffix), run_dir
    return run_dir[: -len(suffix)]


def regenerate_ab(ab_dir: Path) -> None:
    """The report `python -m harness ab` writes once its steps are done (ab.run_from_args: validity,
    context, ab.report), from the steps ab.json lists, collected per op as Runner.run collects them."""
    state = json.loads((ab_dir / "ab.json").read_text())
    # An incomplete or failed A/B gets warnings from run_from_args that this does not rebuild.
    assert state["complete"] and all(s["usable"] for s in state["steps"])
    plan = ab.plan_from_data(state["plan"], ab_dir / "ab.json")
    by_dir = {op.replace(":", "-").replace("@", "-").replace("/", "-"): op for op in plan.ops}
    results = {op: {"record": [], "A": [], "B": []} for op in plan.ops}
    for step in state["steps"]:
        runs = results[by_dir[step["step"].split("/")[0]]]
        kind = ("record" if step["args"][0] == "record" else
                compare.passes_key(step["side"]) if step.get("passes") else step["side"])
        runs.setdefault(kind, []).append(Path(step["run_dir"]))
    warnings, ir_per_op = ab.validity(results)
    context = {"name": plan.name, "a": plan.a.describe(), "b": plan.b.describe(), "repeats": plan.repeats,
               "ir": ir_per_op}
    schedule = (sequential.Schedule(first=plan.first, cap=plan.max_repeats, resolve=plan.resolve)
                if plan.sequential else None)
    ab.report(ab_dir, list(results.values()), context, warnings, {plan.options.backend}, plan.first_repeats,
              plan.fdr, schedule)


def regenerate_corpus(batch_dir: Path) -> None:
    """The corpus report a corpus A/B writes at its end (CorpusAB.summarize), over the batch dir."""
    meta = json.loads((batch_dir / "batch.json").read_text())
    batch = types.SimpleNamespace(dir=batch_dir, opts=types.SimpleNamespace(plan=meta["request"]["plan"],
                                                                            backend=meta["backend"]))
    corpus_ab.CorpusAB.summarize(batch)


def _assert_same(example: Path, made: Path, names: tuple[str, ...], original: str) -> None:
    for name in names:
        committed = (example / name).read_bytes()
        if name.endswith(".png"):
            # matplotlib stamps its version in the PNG, and another version draws other bytes: compared
            # where the installed one is the one that drew it.
            got = (made / name).read_bytes()
            if not REWRITE and f"Matplotlib version{matplotlib.__version__},".encode() not in committed:
                continue
        else:
            # The report names run dirs (each row's IR files) by absolute path: these ran under
            # `made`, the committed ones where the H200 run wrote them. Nothing else differs.
            # Read as bytes: the CSV's \r\n line ends are compared too.
            got = (made / name).read_bytes().decode().replace(str(made), original).encode()
        if REWRITE:
            (example / name).write_bytes(got)
            continue
        assert got == committed, (f"{example.relative_to(REPO)}/{name} is not what the report code writes now "
                                  f"(regenerated: {made / name}); see docs/examples/README.md")


def test_ab_example_regenerates(tmp_path, capsys):
    made = _unpack(AB_EXAMPLE, tmp_path / "ab")
    steps = json.loads((made / "ab.json").read_text())["steps"]
    original = _step_prefix(steps[0])
    _moved(made / "ab.json", original, made)
    regenerate_ab(made)
    capsys.readouterr()  # the report as printed: what is compared is what was written
    _assert_same(AB_EXAMPLE, made, AB_FILES, original)


def test_corpus_example_regenerates(tmp_path):
    made = _unpack(CORPUS_EXAMPLE, tmp_path / "corpus")
    ab_jsons = sorted(made.glob("ops/*/attempt*/*/ab.json"))
    assert ab_jsons
    # Each op's ab.json names its run dirs under the batch dir the corpus A/B ran in.
    first = _step_prefix(json.loads(ab_jsons[0].read_text())["steps"][0])
    original = first[: -len("/" + str(ab_jsons[0].parent.relative_to(made)))]
    for path in ab_jsons:
        _moved(path, original, made)
    regenerate_corpus(made)
    _assert_same(CORPUS_EXAMPLE, made, CORPUS_FILES, original)


def test_examples_show_every_verdict_and_what_changed():
    """What the examples are there for: real verdicts of every kind, and the compiled code's changes
    behind the calls."""
    ab_md = (AB_EXAMPLE / "report.md").read_text()
    counts = dict(re.findall(r"(FASTER|SLOWER|SAME|NOISY) (\d+)", ab_md.split("verdicts: ", 1)[1].split("\n")[0]))
    assert set(counts) == {"FASTER", "SLOWER", "SAME", "NOISY"}
    assert re.search(r"^\d+ SLOWER rows share: wgmma", ab_md, re.M)
    corpus_md = (CORPUS_EXAMPLE / "report.md").read_text()
    assert re.search(r"^- \d+ SLOWER rows share: ", corpus_md, re.M)
    total = sum(p.stat().st_size for p in EXAMPLES.rglob("*") if p.is_file())
    assert total < 1_500_000, f"docs/examples/ is {total} bytes: keep it small"
