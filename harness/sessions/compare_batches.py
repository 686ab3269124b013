"""`python -m harness ab --compare BATCH_A BATCH_B`: the corpus report of two batch dirs, the corpus
screened under compiler A and then under B (reports.corpus.from_batch_pair): nothing is rerun."""

from __future__ import annotations

from pathlib import Path

from harness.core import batchdir, paths, rundir
from harness.core.commands import ABRequest
from harness.core.errors import UsageError
from reports import corpus, stats


def names_batches(dirs: list[Path]) -> bool:
    """Whether `--compare` names two batch dirs; two other dirs are run dirs (harness.sessions.ab),
    and one of each is bad input."""
    is_batch = [batchdir.is_batch_dir(d) for d in dirs]
    if any(is_batch) and not all(is_batch):
        batch, other = (dirs[0], dirs[1]) if is_batch[0] else (dirs[1], dirs[0])
        raise UsageError(f"--compare: {batch} is a batch dir and {other} is not: give two batch dirs (a corpus "
                         "report) or two run dirs")
    return all(is_batch)


def run_from_args(request: ABRequest) -> int:
    dir_a, dir_b = (Path(d).resolve() for d in request.compare)
    print(f"corpus A/B of two batches: A = {dir_a}, B = {dir_b} (nothing rerun)", flush=True)
    try:
        data = corpus.from_batch_pair(dir_a, dir_b, {"name": f"{dir_a.name} vs {dir_b.name}"},
                                      stats.FDR if request.experiment.fdr is None else request.experiment.fdr)
    except UsageError as exc:
        raise UsageError(f"--compare: {exc}") from exc
    out = rundir.claim_run_dir(paths.runs_root(request.out), "corpus")
    print()
    print("\n".join(corpus.headline(data)))
    files = corpus.write(out, data)
    print("report: " + ", ".join(str(f) for f in files))
    summary = data["summary"]
    return 0 if summary["rows"] and summary["headline_rows"] == summary["rows"] and not data["unpaired_ops"] else 1
