"""The A/B step's cost and independence, forked by warm workers vs fresh processes (issue 30), measured
side by side in one run. Run by hand on one H200 (not collected by pytest; no nox needed):

    python3 tests/gpu/bench_speed.py --json bench_speed.json
    python3 tests/gpu/bench_speed.py --backend interpreter --json /tmp/b.json   # the pipeline on a CPU

Per start path (`--step-start fork`, `prewarmed` and `fresh`; all `--step-passes once`, so only the
start differs), two A/Bs of identical sides, every step in ab.json:
  op A/B     softmax, 2 rows, 3 repeats: its wall (target <= 20 s), finding the Triton host modules the
             warm-up A/B built kept (harness.core.host_modules), as a corpus A/B's ops after its first
             do where they share a kernel signature; and (not fresh) with none kept, as a first A/B;
  fixed cost each timing-only replay's wall (ab.json) minus its GPU-busy time, taken as the timer's
             own device budget (rows x 2 sides x (warmup_ms + rep_ms) of its run.json): the rest is
             process start, imports, device init, collection and writing (target <= 1.5 s);
  corpus     the op A/B's wall at 5 repeats (its wall at 3 plus 4 timing-only replays) x 1,124 ops,
             on one GPU, at this op's size (target <= 8 h); and from the op A/B with none kept;
  batch      a batch record of the built-in operators, 2 rows each, one device, each op's record forked
             by the device's warm worker (`--op-start fork`) and started fresh: the batch's wall and each
             op's (ops_status.csv), fork against fresh (issue 30, item 4: where start-up is a large share);
  spread     an A/A of softmax and add, 4 rows each, 5 repeats (3 on the interpreter): per row and
             side, the variance of log latency between repeats, pooled over rows and sides (df = sum
             of n - 1); F = pooled variance fresh / fork (and fresh / prewarmed), one-sided p =
             P(F' >= F) for F' ~ F(df fresh, df fork): a small p (< 0.05) says forked repeats are
             measurably more alike than fresh ones (noise understated), and then that path must not
             be the default. A Brown-Forsythe companion (Mann-Whitney) is printed beside it.
Prints the figures and a table against the targets; writes them as JSON to --json. About 7
minutes on an H200 (`--only spread`: about 5; `--starts prewarmed,fresh`: about 6; `--only ab`: about 2;
`--only batch`: about 2).
A discarded warm-up A/B runs first. Exit 0 once everything ran.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # busy_s reads the timer's constants; run as a script from anywhere
CORPUS_OPS = 1124  # FlagGems' 1,119 benchmark functions plus the built-ins
TARGETS = {"fixed_s": 1.5, "op_ab_s": 20.0, "corpus_h": 8.0}
STARTS = ("fork", "prewarmed", "fresh")  # fresh last: each of the others is tested against it
PARTS = ("ab", "batch", "spread")
BATCH_OPS = ("add", "gelu", "mm", "rms_norm", "softmax")  # the built-ins
OP_STARTS = ("fresh", "fork")
AA_REPEATS = {"cuda": 5, "interpreter": 3}  # the interpreter checks the pipeline: fewer, slow, steps
SHAPES = {  # two rows per op
    "cuda": "softmax:\n  shapes: [[64, 512], [1024, 4096]]\n  dtypes: [fp16]\n"
            "pointwise:\n  shapes: [[65536], [4096, 4096]]\n  dtypes: [fp16]\n",
    "interpreter": "softmax:\n  shapes: [[4, 16], [3, 40]]\n  dtypes: [fp32]\n"
                   "pointwise:\n  shapes: [[300], [2, 700]]\n  dtypes: [fp32]\n",
}


def ab(out: Path, shapes: Path, backend: str, start: str, repeats: int, *ops: str,
       user_cache: Path | None = None) -> tuple[float, Path]:
    """(wall seconds, ab dir) of `python -m harness ab` over `ops`, sides identical. `user_cache`: the
    harness's XDG_CACHE_HOME (its kept Triton host modules, harness.core.host_modules), else the bench's own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "XDG_CACHE_HOME": str(user_cache or out.parent / "user-cache")}
    env.pop("TRITON_INTERPRET", None)
    argv = [sys.executable, "-m", "harness", "ab", "--ops", *ops, "--backend", backend, "--shapes", str(shapes),
            "--repeats", str(repeats), "--step-start", start, "--step-passes", "once", "--out", str(out)]
    began = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    found = [line.split("ab dir: ", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("ab dir: ")]
    if proc.returncode != 0 or not found:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, Path(found[0])


BATCH_SHAPES = {  # two rows per shape key of the built-ins
    "cuda": SHAPES["cuda"] + "norm:\n  shapes: [[64, 4096], [1024, 4096]]\n  dtypes: [fp16]\n"
                             "blas:\n  shapes: [[128, 4096, 4096], [1024, 1024, 1024]]\n  dtypes: [fp16]\n",
    "interpreter": SHAPES["interpreter"] + "norm:\n  shapes: [[4, 16], [3, 40]]\n  dtypes: [fp32]\n"
                                           "blas:\n  shapes: [[4, 8, 8], [8, 16, 8]]\n  dtypes: [fp32]\n",
}


def batch(out: Path, backend: str, op_start: str) -> tuple[float, dict[str, float]]:
    """(wall seconds, op -> its elapsed seconds as ops_status.csv says) of `python -m harness batch` over
    the built-ins on device 0, each op's record started as `op_start` says."""
    import csv

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "XDG_CACHE_HOME": str(out.parent / "user-cache")}
    env.pop("TRITON_INTERPRET", None)
    shapes = out.parent / "batch_rows.yaml"
    shapes.write_text(BATCH_SHAPES[backend])
    argv = [sys.executable, "-m", "harness", "batch", "--ops", *BATCH_OPS, "--backend", backend, "--devices", "0",
            "--shapes", str(shapes), "--op-start", op_start, "--batch-dir", str(out)]
    began = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(out / "ops_status.csv", newline="") as f:
        return wall, {row["op"]: float(row["elapsed_s"]) for row in csv.DictReader(f)}


def steps(ab_dir: Path) -> list[dict]:
    return json.loads((ab_dir / "ab.json").read_text())["steps"]


def busy_s(run_dir: Path) -> float:
    """The timer's device time for the run, per row and side (baseline, candidate): its warmup budget and
    the samples it took (`samples.<side>.n`; a graph sample is replays of about GRAPH_SAMPLE_MS, or
    one call where that is longer, a direct one a call), at most its rep budget. Under --max-noise a side
    stops early: rows x 2 x (warmup + rep) overstated it."""
    from harness.measure.timers import GRAPH_SAMPLE_MS

    spec = json.loads((run_dir / "run.json").read_text())["spec"]
    rows = json.loads((run_dir / "results.json").read_text())["rows"]
    total_ms = 0.0
    for row in rows:
        for side, sampled in (row.get("samples") or {}).items():
            call_ms = row.get(f"{side}_ms") or 0.0
            sample_ms = max(call_ms, GRAPH_SAMPLE_MS) if row.get("timer") == "graph" else call_ms
            total_ms += spec["warmup_ms"] + min(spec["rep_ms"], (sampled.get("n") or 0) * sample_ms)
    return total_ms / 1000


def timing_only_replays(ab_dir: Path) -> list[dict]:
    """The timed repeats (every replay but the passes steps): the steps a repeat costs."""
    return [s for s in steps(ab_dir) if s["usable"] and s["args"][0] == "replay" and "--timing-only" in s["args"]]


def fixed_costs(ab_dir: Path) -> list[float]:
    return [s["seconds"] - busy_s(Path(s["run_dir"])) for s in timing_only_replays(ab_dir)]


def log_latencies(ab_dir: Path) -> dict[tuple, list[float]]:
    """(op, dtype, shape, side) -> log candidate latency per repeat."""
    out: dict[tuple, list[float]] = {}
    for s in steps(ab_dir):
        if s["usable"] and s["args"][0] == "replay" and not s.get("passes"):  # the passes steps' timings are not used
            rows = json.loads((Path(s["run_dir"]) / "results.json").read_text())["rows"]
            for r in rows:
                if r["status"] == "SUCCESS" and r.get("candidate_ms"):
                    key = (r["op"], r["dtype"], tuple(r["shape"] or ()), s["side"])
                    out.setdefault(key, []).append(math.log(r["candidate_ms"]))
    return out


def pooled(groups: dict[tuple, list[float]]) -> tuple[float, int]:
    """(pooled variance, its degrees of freedom) of the groups' between-repeat variances."""
    df = sum(len(v) - 1 for v in groups.values() if len(v) > 1)
    ss = sum(statistics.variance(v) * (len(v) - 1) for v in groups.values() if len(v) > 1)
    return (ss / df if df else math.nan), df


def f_test(fresh: tuple[float, int], fork: tuple[float, int]) -> dict:
    from scipy import stats

    (var_fresh, df_fresh), (var_fork, df_fork) = fresh, fork
    f = var_fresh / var_fork if var_fork > 0 else math.inf
    one = float(stats.f.sf(f, df_fresh, df_fork)) if math.isfinite(f) else 0.0
    two = min(1.0, 2 * min(one, float(stats.f.cdf(f, df_fresh, df_fork)))) if math.isfinite(f) else 0.0
    return {"F": f, "df_fresh": df_fresh, "df_fork": df_fork, "p_fork_more_alike": one, "p_two_sided": two,
            "sd_log_fresh": math.sqrt(var_fresh), "sd_log_fork": math.sqrt(var_fork),
            "fork_more_alike": one < 0.05}


# The A/A's rows: 4 shapes an op (16 row-sides, df 64 a path at 5 repeats).
SPREAD_SHAPES = {
    "cuda": "softmax:\n  shapes: [[64, 512], [256, 1024], [1024, 4096], [4096, 1024]]\n  dtypes: [fp16]\n"
            "pointwise:\n  shapes: [[65536], [1048576], [4096, 4096], [8192, 2048]]\n  dtypes: [fp16]\n",
    "interpreter": SHAPES["interpreter"],
}


def measure(out: Path, backend: str, starts: tuple[str, ...], parts: tuple[str, ...]) -> dict:
    shapes, spread_shapes = out / "two_rows.yaml", out / "spread_rows.yaml"
    shapes.write_text(SHAPES[backend])
    spread_shapes.write_text(SPREAD_SHAPES[backend])
    figures: dict = {start: {} for start in starts}
    # A first A/B on a fresh machine pays for a cold page cache (torch's libraries read from disk by many
    # processes at once): 12 s against 6.6 s for the same record on an H200. Whichever path ran first paid
    # it; a corpus A/B pays it once. Discarded.
    wall, _ = ab(out / "warm-up", shapes, backend, starts[0], 2, "softmax")
    figures["warm_up_s"] = wall
    print(f"warm-up A/B ({starts[0]}, discarded): {wall:.1f} s", flush=True)
    for start in starts if "ab" in parts else ():  # the op A/B
        # As a first A/B on the machine: no Triton host module kept from before (the warm-up's are).
        cold = None
        if start != "fresh":
            cold, _ = ab(out / f"op-{start}-cold", shapes, backend, start, 3, "softmax",
                         user_cache=out / f"cold-{start}")
        wall, d = ab(out / f"op-{start}", shapes, backend, start, 3, "softmax")
        replays = timing_only_replays(d)
        mean_replay = statistics.mean(s["seconds"] for s in replays)
        fixed = fixed_costs(d)
        record = next(s for s in steps(d) if s["args"][0] == "record")
        observed = json.loads((Path(record["run_dir"]) / "run.json").read_text())["observed"]
        figures[start].update(
            # how A's record precompiled its sweeps: the pool's start (fork or spawn), workers, seconds
            record_precompile=observed.get("autotune", {}).get("precompile"),
            op_ab_s=wall, steps_s={s["what"].split("] ", 1)[1]: s["seconds"] for s in steps(d)},
            fixed_s=statistics.median(fixed), fixed_all_s=fixed,
            op_ab_5_repeats_s=wall + 4 * mean_replay,
            corpus_h=(wall + 4 * mean_replay) * CORPUS_OPS / 3600,
            op_ab_cold_store_s=cold,
            corpus_cold_store_h=None if cold is None else (cold + 4 * mean_replay) * CORPUS_OPS / 3600)
        print(f"{start:5s} op A/B (2 rows, 3 repeats): {wall:.1f} s"
              + ("" if cold is None else f" ({cold:.1f} s with no Triton host module kept)") + "; steps "
              + ", ".join(f"{w} {t:.1f}" for w, t in figures[start]["steps_s"].items())
              + f"; record's precompile {figures[start]['record_precompile']}"
              + f"; fixed cost per repeat {figures[start]['fixed_s']:.2f} s (median of {len(fixed)}); corpus "
              f"{figures[start]['corpus_h']:.1f} h", flush=True)
    if "batch" in parts:
        figures["batch"] = {}
        for op_start in OP_STARTS:
            wall, per_op = batch(out / f"batch-{op_start}", backend, op_start)
            figures["batch"][op_start] = {"wall_s": wall, "op_s": per_op,
                                          "op_median_s": statistics.median(per_op.values())}
            print(f"batch record ({len(per_op)} built-ins), --op-start {op_start}: {wall:.1f} s; per op "
                  + ", ".join(f"{op} {t:.1f}" for op, t in per_op.items())
                  + f" (median {figures['batch'][op_start]['op_median_s']:.1f} s)", flush=True)
        fork, fresh = figures["batch"]["fork"]["op_s"], figures["batch"]["fresh"]["op_s"]
        figures["batch"]["saved_per_op_s"] = statistics.median(fresh[op] - fork[op] for op in fork)
        print(f"batch: each op's start saved by forking: median {figures['batch']['saved_per_op_s']:.1f} s", flush=True)
    spread = {}
    if "spread" not in parts:
        return figures
    for start in starts[::-1]:  # the A/A, the other order: no path always runs first
        wall, d = ab(out / f"aa-{start}", spread_shapes, backend, start, AA_REPEATS[backend], "softmax", "add")
        latencies = log_latencies(d)
        spread[start] = (*pooled(latencies), latencies)
        figures[start].update(aa_wall_s=wall, aa_pooled_var_log=spread[start][0], aa_df=spread[start][1])
        print(f"{start:5s} A/A ({len(spread[start][2])} row-sides, {AA_REPEATS[backend]} repeats): {wall:.1f} s; "
              "between-process sd of log "
              f"latency {math.sqrt(spread[start][0]):.4f} (df {spread[start][1]})", flush=True)
    figures["spread_tests"] = {start: {"F": f_test(spread["fresh"][:2], spread[start][:2]),
                                       "robust": brown_forsythe(spread["fresh"][2], spread[start][2])}
                               for start in starts if start != "fresh"}
    return figures


def brown_forsythe(fresh: dict[tuple, list[float]], fork: dict[tuple, list[float]]) -> dict:
    """The same question without the F test's normality: each repeat's absolute deviation from its
    row-side's median (Brown-Forsythe), fresh against fork, one-sided Mann-Whitney (fresh larger:
    fork more alike). Reported beside the F test, which a few heavy-tailed rows can swing."""
    from scipy import stats

    def deviations(groups):
        return [abs(x - statistics.median(v)) for v in groups.values() if len(v) > 1 for x in v]

    a, b = deviations(fresh), deviations(fork)
    test = stats.mannwhitneyu(a, b, alternative="greater")
    return {"n_fresh": len(a), "n_fork": len(b), "median_dev_fresh": statistics.median(a),
            "median_dev_fork": statistics.median(b), "p_fork_more_alike": float(test.pvalue)}


def _starts(text: str) -> tuple[str, ...]:
    starts = tuple(s for s in STARTS if s in text.split(","))  # fresh last, whatever the order given
    if "fresh" not in starts or len(starts) < 2 or set(text.split(",")) - set(STARTS):
        raise argparse.ArgumentTypeError(f"a comma list of {', '.join(STARTS)}: fresh and at least one other")
    return starts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("bench_speed.json"), metavar="PATH",
                        help="where the figures go (default: bench_speed.json)")
    parser.add_argument("--backend", choices=tuple(SHAPES), default="cuda",
                        help="cuda (the H200), or interpreter to run the whole script on a CPU (default: cuda)")
    parser.add_argument("--only", choices=PARTS, default=None,
                        help="ab: the op A/B's figures alone; batch: the batch record's alone; spread: the A/A "
                             "spread alone (default: all)")
    parser.add_argument("--starts", default=",".join(STARTS), type=_starts, metavar="LIST",
                        help=f"the step starts compared, fresh among them (default: {','.join(STARTS)})")
    parser.add_argument("--out", type=Path, default=None, help="keep the A/B dirs here (default: a temp dir, removed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zl_bench_speed_") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        figures = measure(out, args.backend, args.starts, (args.only,) if args.only else PARTS)
        figures["total_s"] = time.monotonic() - began
    figures["backend"] = args.backend
    figures["targets"] = TARGETS
    for start in figures.get("spread_tests", ()):
        test, robust = figures["spread_tests"][start]["F"], figures["spread_tests"][start]["robust"]
        print(f"\nspread, {start}: F = var fresh / var {start} = {test['F']:.2f} (df {test['df_fresh']}, "
              f"{test['df_fork']}); p({start} more alike) = {test['p_fork_more_alike']:.3f}, two-sided p = "
              f"{test['p_two_sided']:.3f}: "
              + (f"{start} repeats are MEASURABLY MORE ALIKE: {start} must not be the default"
                 if test["fork_more_alike"] else f"no evidence {start} repeats are more alike (independence holds)"))
        print(f"robust (Brown-Forsythe, Mann-Whitney): median |deviation| fresh {robust['median_dev_fresh']:.4f}, "
              f"{start} {robust['median_dev_fork']:.4f}; p({start} more alike) = {robust['p_fork_more_alike']:.3f}")
    rows = (("fixed_s", "s"), ("op_ab_s", "s"), ("corpus_h", "h")) if args.only in (None, "ab") else ()
    if rows:
        print(f"\n{'figure':10s} " + " ".join(f"{start:>10s}" for start in args.starts) + "  target")
    for name, unit in rows:
        cells = " ".join(f"{figures[start][name]:9.2f}{unit}" for start in args.starts)
        meets = [start for start in args.starts if figures[start][name] <= TARGETS[name]]
        print(f"{name:10s} {cells}  <= {TARGETS[name]}{unit}: met by {', '.join(meets) or 'none'}")
    print(f"total {figures['total_s']:.0f} s; figures in {args.json}")
    args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
