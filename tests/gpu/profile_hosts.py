"""Where a measuring host's time goes, op by op (issue 45): run by hand on a GPU host (not collected by pytest).

    python3 tests/gpu/bench_corpus_flaggems.py ... --profile-hosts DIR    # each hosted run profiled into DIR
    python3 tests/gpu/profile_hosts.py DIR [--top 30]

The first line runs the corpus sample with tests/gpu/host_profile/sitecustomize.py on PYTHONPATH, which profiles
each run a chunk's measuring host serves (one op's timed replay) into DIR/<run dir name>.prof. This one sums
them per op: the run's seconds under the profiler (each profile's total), and the share in each of the parts a
replay is made of (the timer, the inputs drawn, their digests, FlagGems' use_gems() entered and left, collections,
pytest's set-up and collection, the rows written), what is left outside them; then the functions that cost most
over all runs. cProfile slows Python-heavy parts more than device waits: read the parts against each other, not
as walls. On an H200 host (torch 2.11) cProfile lost the callers of some frames (get_latency, FlagGems'
register_impl read as roots or with more cumulative seconds than the run), so a part can read less than it took;
the totals and the functions' own seconds hold."""

from __future__ import annotations

import argparse
import collections
import pstats
import re
from pathlib import Path

# (name, file suffix, function names): a part's seconds are the cumulative seconds of its functions (none of
# them calls another part's).
PARTS = (
    ("timer", "harness/measure/timers.py", ("measure_pair",)),
    ("inputs", "harness/child/plugins/flaggems.py", ("_next_input",)),
    ("digest", "harness/child/plugins/seeds.py", ("input_sha256",)),
    ("use_gems", "flag_gems/__init__.py", ("__enter__", "__exit__")),
    ("gc", "~", ("<built-in method gc.collect>",)),
    ("pytest set-up", "_pytest/config/__init__.py", ("_prepareconfig",)),
    ("collection", "_pytest/main.py", ("pytest_collection",)),
    ("rows written", "harness/child/plugins/results.py", ("_flush",)),
    ("run.json", "harness/core/rundir.py", ("merge_json",)),
)
REPO = Path(__file__).resolve().parents[2]


def unfound_parts() -> list[str]:
    """The parts of our own modules whose functions the module no longer defines: a rename would zero its
    column without a word."""
    unfound = []
    for part, suffix, names in PARTS:
        if not suffix.startswith("harness/"):
            continue  # torch's, pytest's, flag_gems': not ours to check
        source = REPO / suffix
        text = source.read_text() if source.is_file() else ""
        unfound += [f"{part}: {suffix} defines no {name}()" for name in names
                    if not re.search(rf"^\s*def {re.escape(name)}\(", text, re.MULTILINE)]
    return unfound


def op_of(prof: Path) -> str:
    return re.sub(r"_\d{8}-\d{6}(-\d+)?$", "", prof.stem.split("@")[0])


def parts(stats: pstats.Stats) -> dict[str, float]:
    out = collections.Counter()
    for (file, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        for part, suffix, names in PARTS:
            if file.endswith(suffix) and name in names:
                out[part] += cumulative
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    if unfound := unfound_parts():
        raise SystemExit("error: the parts this tool sums name what the code no longer has: " + "; ".join(unfound))
    profs = sorted(args.dir.glob("*.prof"))
    if not profs:
        raise SystemExit(f"no .prof files in {args.dir}")
    by_op: dict[str, list[Path]] = collections.defaultdict(list)
    for prof in profs:
        by_op[op_of(prof)].append(prof)
    names = [p[0] for p in PARTS]
    print(f"{'op':<52} {'runs':>4} {'run s':>6} " + " ".join(f"{n[:10]:>10}" for n in names) + f" {'rest':>6}")
    total = None
    for op, files in sorted(by_op.items()):
        stats = pstats.Stats(*map(str, files))
        total = stats if total is None else total.add(*map(str, files)) or total
        found = parts(stats)
        run = stats.total_tt / len(files)  # the profiles' own totals: the entry's frame may be among those lost
        shown = [found[n] / len(files) for n in names]
        print(f"{op:<52} {len(files):>4} {run:>6.2f} " + " ".join(f"{s:>10.3f}" for s in shown)
              + f" {run - sum(shown):>6.2f}")
    total.files = []  # no header line a profile file
    print("\nover all runs, by cumulative seconds:")
    total.sort_stats("cumulative").print_stats(args.top)
    print("by own seconds:")
    total.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
