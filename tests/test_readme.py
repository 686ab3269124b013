"""Every documented example runs as written where a CPU can run it: the command lines of the code
blocks of README.md and of every docs/*.md page are each either run here, on the interpreter, or
listed in NOT_RUN_HERE with the reason, so a new example fails this test until it is classified.
README stays the front door: short, and linking every docs page."""

import re
import shlex

import pytest
import yaml
from conftest import REPO, run_dir_of, run_harness

from harness.providers import shapes
from ops import Operator

README = REPO / "README.md"
DOCS = REPO / "docs"
# README is the front door (what it is, a fresh machine, each session, how to read a report, when
# things go wrong): the rest lives in docs/.
README_MAX_LINES = 300
# The page that holds the operator (python) and shape-file (yaml) examples.
EXAMPLES_PAGE = DOCS / "user-guide.md"
# The programs a command line starts with; a code block's other lines (the layout tree, a report's
# headline) are not commands.
COMMAND = re.compile(r"(nox|python3?|pip|ray|\.|\.ci/\S+)(\s|$)")
FENCE = "```"

NOT_RUN_HERE = {
    "python3 -m venv .venv": "makes the environment this test already runs in",
    ". .venv/bin/activate": "enters the environment this test already runs in",
    "pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0": "downloads torch from the "
                                                                                  "network; this environment "
                                                                                  "has it",
    "pip install nox triton": "downloads triton from the network; this environment has it",
    "pip install -e '.[cluster]'": "downloads ray and submitit from the network; tests/test_ray_executor.py and "
                                   "tests/test_slurm_executor.py use them",
    "nox -s tests": "the whole test suite, this test included",
    'nox -s tests -- -m "not e2e"': "the fast tests, this file's fast tests included",
    "nox -s ab": "too long for CI: 5 ops, 45 steps, about 4 min on the interpreter",
    "nox -s ab -- ops/ab_mma_v3.yaml --flaggems-dir ~/FlagGems": "needs a FlagGems checkout",
    "nox -s ab -- --ops softmax mm --b-env KEY=VAL --repeats 5": "too long for CI: 26 steps, 3 min on "
                                                                 "the interpreter (tests/test_ab.py runs --b-env "
                                                                 "ad hoc A/Bs at 2 repeats)",
    "nox -s ab -- --all --b-env KEY=VAL": "the whole inventory: hours on a GPU (tests/test_chunks.py "
                                          "runs corpus A/Bs in chunks on the interpreter)",
    "nox -s ab -- ops/ab_f32_ieee.yaml --all --flaggems-dir ~/FlagGems --devices 0,1,2,3":
        "needs a FlagGems checkout and 4 devices",
    "nox -s ab -- --ops softmax builtin:mm flaggems:softmax_backward@softmax --b-python /opt/b/bin/python "
    "--devices 0,1": "needs a FlagGems checkout and a second compiler build at /opt/b",
    "nox -s ab -- --resume --batch-dir runs/ab-corpus_f32-ieee_<ts>": "resumes the corpus A/B above, which "
                                                                      "needs a FlagGems checkout",
    "nox -s batch -- --all --backend cuda": "needs a cuda GPU",
    "nox -s batch -- --all --flaggems-dir ~/FlagGems --flaggems-dir vllm=~/FlagGems-vllm":
        "needs FlagGems checkouts",
    "nox -s batch -- --ops softmax builtin:mm flaggems:softmax_backward@softmax --flaggems-dir ~/FlagGems "
    "--devices 0,1": "needs a FlagGems checkout",
    "nox -s batch -- --all --timer profiler --l2 cold": "the profiler timer needs a device profiler (cuda, "
                                                        "rocm); the interpreter refuses it",
    ".ci/slurm-up": "needs root and Slurm; tests/test_slurm_executor.py runs it (marker cluster)",
    "nox -s batch -- --ops softmax add --backend interpreter --executor slurm --batch-dir runs/b_slurm":
        "needs the Slurm of .ci/slurm-up; tests/test_slurm_executor.py runs it (marker cluster)",
    "nox -s batch -- --resume --batch-dir runs/b_slurm": "resumes the Slurm batch above; "
                                                         "tests/test_slurm_executor.py runs it (marker cluster)",
    "ray start --head --port 6379 --num-cpus 1 --include-dashboard false":
        "starts a Ray cluster; tests/test_ray_executor.py runs it (marker cluster)",
    "ray start --address 127.0.0.1:6379 --num-cpus 1": "joins the Ray cluster above; tests/test_ray_executor.py "
                                                       "runs it (marker cluster)",
    "nox -s batch -- --ops softmax add --backend interpreter --executor ray --ray-address 127.0.0.1:6379":
        "needs the Ray cluster above; tests/test_ray_executor.py runs it (marker cluster)",
    "nox -s record -- flaggems:softmax --flaggems-dir ~/FlagGems": "needs a FlagGems checkout",
    "nox -s record -- flaggems:softmax_backward@softmax --flaggems-dir ~/FlagGems": "needs a FlagGems checkout",
    "nox -s record -- ~/FlagGems/benchmark/test_mm.py::test_mm --shapes my.yaml": "needs a FlagGems checkout",
    "nox -s record -- vllm:fused_moe --flaggems-dir vllm=~/FlagGems-vllm": "needs a FlagGems-vllm checkout",
    "nox -s bisect -- --builds builds.yaml --ops mm softmax": "a bisect needs verdicts, which the interpreter does "
                                                              "not give; tests/test_bisect.py runs bisects on a "
                                                              "measuring stand-in",
    "nox -s bisect -- --builds builds.yaml --from-ab runs/ab_fp-fusion_20261204-101500":
        "needs a GPU A/B's report; tests/test_bisect.py runs --from-ab on a measuring stand-in",
    "nox -s bisect -- --git-range v3.4.0..main --checkout ~/triton --build-cmd 'pip install --no-build-isolation "
    "./python' --ops mm": "builds Triton from source; tests/test_bisect.py bisects a git range of a tiny repo",
    "nox -s bisect -- --resume runs/bisect_20261205-001935": "resumes a GPU bisect; tests/test_bisect.py resumes "
                                                              "one after kill -9",
    "nox -s bisect -- --builds tests/gpu/bisect_builds.yaml --ops mm softmax add rms_norm gelu --shapes "
    "tests/gpu/bisect_shapes.yaml --repeats 3": "the GPU check of issue 51: needs a cuda GPU",
}

# The commands run here, in this order (a placeholder is filled from an earlier one's output), each
# with its exit code and a pattern of its last line.
RUN_HERE = {
    "nox -s record -- softmax --backend interpreter": (0, r"record ok: 4/4 rows; run dir: "),
    "nox -s replay -- runs/mm_20261129-101500": (0, r"replay ok: 4/4 rows; run dir: "),
    "nox -s replay -- runs/softmax_<ts>": (0, r"replay ok: 4/4 rows; run dir: "),
    "nox -s inventory-regen -- --check": (0, r"up to date: .*inventory_builtin\.csv$"),
    "nox -s ab -- --compare RUN_A RUN_B": (0, r"report: .*report\.json"),
    "nox -s ab -- ops/ab_f32_ieee.yaml": (0, r"report: .*report\.json"),
    "nox -s batch": (0, r"done: PASS 5; summary: "),  # no selection: the built-in inventory, as --all here
    "nox -s batch -- --ops-file my_ops.txt --op-timeout 600 --dtypes bf16": (0, r"done: SKIP 1; summary: "),
    "nox -s batch -- --all --replay-root runs/batch_<ts>": (0, r"done: PASS 5; summary: "),
    "nox -s batch -- --resume --batch-dir runs/batch_<ts>": (0, r"done: PASS 5; summary: "),
    "nox -s ab -- --compare BATCH_A BATCH_B": (0, r"report: .*report\.json"),
}


def pages() -> list:
    """README and every docs page: where examples live."""
    return [README, *sorted(DOCS.glob("*.md"))]


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """A page's code blocks as (language, lines): fenced ones, and indented ones (four spaces after a
    blank line), which a newcomer copies from just the same."""
    blocks, fenced, indented, previous = [], None, None, ""
    for line in text.splitlines():
        if fenced is not None:
            if line.startswith(FENCE):
                blocks.append(fenced)
                fenced = None
            else:
                fenced[1].append(line)
        elif line.startswith(FENCE):
            fenced = (line[len(FENCE):].strip(), [])
        elif line.startswith("    ") and (indented is not None or not previous.strip()):
            indented = indented or ("", [])
            indented[1].append(line)
        elif indented is not None:
            blocks.append(indented)
            indented = None
        previous = line
    if indented is not None:  # a page that ends in an indented block
        blocks.append(indented)
    return blocks


def page_commands(text: str) -> list[str]:
    """The command lines of a page's shell blocks, comments dropped, `a && b` as two, each once."""
    commands = []
    for language, lines in code_blocks(text):
        if language in ("python", "yaml"):
            continue
        for line in lines:
            for part in re.sub(r"\s+#.*$", "", line.strip()).split("&&"):
                if COMMAND.match(part.strip()) and part.strip() not in commands:
                    commands.append(part.strip())
    return commands


def documented_commands() -> dict[str, str]:
    """Each command line of README and the docs pages, with the first page that shows it."""
    found = {}
    for page in pages():
        for command in page_commands(page.read_text()):
            found.setdefault(command, page.relative_to(REPO).as_posix())
    return found


def test_every_documented_command_is_run_here_or_says_why_not():
    commands = documented_commands()
    # The extraction finds the main job at the door, and the examples that moved into docs/.
    assert commands.get("nox -s record -- softmax --backend interpreter") == "README.md"
    assert commands.get("nox -s ab -- --compare BATCH_A BATCH_B") == "docs/user-guide.md"
    unclassified = [f"{c} ({page})" for c, page in commands.items() if c not in RUN_HERE and c not in NOT_RUN_HERE]
    assert not unclassified, f"documented commands neither run by this test nor listed in NOT_RUN_HERE: {unclassified}"
    assert not set(RUN_HERE) & set(NOT_RUN_HERE)
    stale = [c for c in [*RUN_HERE, *NOT_RUN_HERE] if c not in commands]
    assert not stale, f"classified commands that neither README nor docs/ shows any more: {stale}"


def harness_argv(command: str, filled: dict[str, str], out_dir) -> list[str]:
    """`command` as `python -m harness` arguments: `nox -s X -- ARGS` runs exactly `python -m harness X
    ARGS` (tests/test_noxfile.py covers nox itself), so nox's start-up is saved. Placeholders are
    filled; a command that picks a backend gets the interpreter (what a CPU box has) unless it names
    one, and its output goes under `out_dir`, not into the checkout."""
    words = shlex.split(command)
    assert words[:2] == ["nox", "-s"], command
    args = [words[2], *words[4:]]
    args = [filled.get(word, word) for word in args]
    session = args[0]
    if session == "inventory-regen":  # --check only reads: no output to redirect
        return args
    if session == "batch":
        if "--batch-dir" not in args:
            args += ["--batch-dir", str(out_dir / "batch")]
    else:
        args += ["--out", str(out_dir)]
    picks_a_backend = session in ("record", "ab", "batch") and not {"--compare", "--resume"} & set(args)
    if picks_a_backend and "--backend" not in args:
        args += ["--backend", "interpreter"]
    return args


def batch_dir_of(proc) -> str:
    return next(line.split("batch dir: ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("batch dir: "))


@pytest.mark.e2e
def test_documented_commands_run_as_written(tmp_path):
    ops_file = tmp_path / "my_ops.txt"
    ops_file.write_text("softmax\n")
    # runs/batch_<ts> names an earlier batch of every op; the docs' own `--all` screens need a GPU or
    # FlagGems, so the test screens the built-in corpus on the interpreter for it.
    earlier = run_harness("batch", "--all", "--backend", "interpreter", "--batch-dir", tmp_path / "batch_all")
    assert earlier.returncode == 0, earlier.stdout + earlier.stderr
    filled = {"my_ops.txt": str(ops_file), "runs/batch_<ts>": str(tmp_path / "batch_all"),
              "BATCH_A": str(tmp_path / "batch_all")}
    for step, (command, (exit_code, last_line)) in enumerate(RUN_HERE.items()):
        proc = run_harness(*harness_argv(command, filled, tmp_path / f"step{step}"))
        shown = f"{command}\n{proc.stdout}\n{proc.stderr}"
        assert proc.returncode == exit_code, shown
        assert re.match(last_line, proc.stdout.strip().splitlines()[-1]), shown
        if command.startswith("nox -s record"):
            filled["runs/mm_20261129-101500"] = filled["runs/softmax_<ts>"] = filled["RUN_A"] = str(run_dir_of(proc))
        elif command.startswith("nox -s replay"):
            filled["RUN_B"] = str(run_dir_of(proc))
        elif "--replay-root" in command:
            filled["BATCH_B"] = batch_dir_of(proc)


def example_block(language: str) -> str:
    (lines,) = [lines for lang, lines in code_blocks(EXAMPLES_PAGE.read_text()) if lang == language]
    return "\n".join(lines) + "\n"


def test_shape_file_example_reads_as_a_shape_file(tmp_path):
    example = tmp_path / "example.yaml"
    example.write_text(example_block("yaml"))
    default_keys = set(yaml.safe_load((REPO / "shapes" / "default.yaml").read_text()))
    assert set(yaml.safe_load(example.read_text())) <= default_keys
    assert shapes.resolve(example, "softmax", ()) == ("softmax", [[1024, 1024], [64, 512]], ["bf16", "fp16"])


def test_operator_example_builds_an_operator():
    import torch

    # What the example leaves to the reader: its baseline and its candidate.
    namespace = {"torch": torch, "torch_reference": torch.neg, "my_triton_impl": torch.neg}
    exec(compile(example_block("python"), str(EXAMPLES_PAGE), "exec"), namespace)
    my_op = namespace["my_op"]
    assert isinstance(my_op, Operator) and my_op.name == "my_op" and my_op.shape_keys == ("pointwise",)


# A relative link: [text](target), the target a path of this repo with an optional #anchor.
LINK = re.compile(r"\]\((?!https?://)([^)#\s]+)(?:#([^)\s]+))?\)")


def anchors(page) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation but '-' and '_' dropped,
    spaces as '-'."""
    headings = [line.lstrip("#").strip() for line in page.read_text().splitlines() if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_readme_is_the_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    linked = {target for target, _ in LINK.findall(README.read_text())}
    unlinked = [p.relative_to(REPO).as_posix() for p in sorted(DOCS.glob("*.md"))
                if p.relative_to(REPO).as_posix() not in linked]
    assert not unlinked, f"docs pages README does not link: {unlinked}"


def test_every_link_of_readme_and_docs_resolves():
    broken = []
    for page in pages():
        for target, anchor in LINK.findall(page.read_text()):
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
                broken.append(f"{page.name}: {target}#{anchor} (no such heading)")
    assert not broken, f"links that lead nowhere: {list(dict.fromkeys(broken))}"
