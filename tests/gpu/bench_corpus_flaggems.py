"""What a whole-corpus A/B costs on one GPU, from a seeded sample of the real corpus (issue 45, item 4): run
by hand on one GPU host (not collected by pytest; no nox needed).

    python3 tests/gpu/bench_corpus_flaggems.py --flaggems-dir FlagGems --out DIR [--plan P] [--sample 30]
        [--seed 45] [--repeats 5] [--chunk K] [--record-jobs J] [--budget S] [--inventory 1124] [--b-env KEY=VAL ...]
    python3 tests/gpu/bench_corpus_flaggems.py --backend interpreter --flaggems-dir tests/resources/flaggems_checkout \
        --sample 4 --repeats 2 --out /tmp/c     # the pipeline on a CPU

A corpus A/B (`python -m harness ab [P] --all --sample N --sample-seed S`, one device) over a seeded sample of
every inventory the checkout makes runnable (FlagGems ops at their own level-core shapes, and the built-ins),
then, per op from its ab.json: its wall, its rows, its record and passes steps, its timed repeat step (median)
with the fixed cost in it (the step's wall minus the timer's device budget: rows x 2 sides x (warmup + rep);
tests/gpu/bench_speed.py's measure) and the GPU work's share of the op's wall. The whole inventory's A/B at
--repeats on one device is extrapolated from the ops that finished: inventory x their mean wall, with a 95%
interval of that mean (t, over ops), scaled by the calls' wall over the rows' sum (what no op's row counts: the
A/B parents', a chunk's hosts'). Ops that timed out or failed are listed and counted apart.
`--budget S` stops the A/B after S seconds (SIGINT, which it takes as Ctrl-C) and the next call with the same
--out resumes it (`ab --resume`): a sample longer than one device-tool call runs over several; the report
reads every op finished so far. Writes DIR/report.json; exit 0 once a report was written.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_corpus_ab import _batch_dir  # noqa: E402  (the corpus A/B's batch dir under an --out)
from bench_speed import busy_s  # noqa: E402  (the fixed cost as bench_speed measures it)

REPO = HERE.parents[1]
INVENTORY = 1124  # FlagGems' 1,119 benchmark functions plus the built-ins
WALLS = "calls_wall_s.txt"  # each call's wall, one a line: the whole A/B's, resumes included


def run(args) -> int | None:
    """The corpus A/B, or its next part; its exit code (None: stopped at --budget, to resume)."""
    out = args.out / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    batch_dir = _batch_dir(out)
    if batch_dir is not None:
        argv = ["ab", "--resume", "--batch-dir", str(batch_dir)]
    else:
        argv = ["ab", *([args.plan] if args.plan else []), "--all", "--sample", str(args.sample), "--sample-seed",
                str(args.seed), "--repeats", str(args.repeats), "--devices", "0", "--out", str(out),
                *(arg for d in args.flaggems_dir for arg in ("--flaggems-dir", d)),
                *(arg for e in args.b_env for arg in ("--b-env", e)),
                *(["--backend", args.backend] if args.backend else []),
                *(["--op-timeout", str(args.op_timeout)] if args.op_timeout else []),
                *(["--chunk", str(args.chunk)] if args.chunk else []),
                *(["--chunk-records", args.chunk_records] if args.chunk_records else []),
                *(["--record-jobs", str(args.record_jobs)] if args.record_jobs else [])]
    env = dict(os.environ)
    if args.profile_hosts:  # each hosted run profiled (tests/gpu/profile_hosts.py reads them)
        args.profile_hosts.mkdir(parents=True, exist_ok=True)
        env["ZL_BENCH_HOST_PROFILE"] = str(args.profile_hosts.resolve())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HERE / "host_profile"), env.get("PYTHONPATH"))))
    with open(args.out / "corpus.log", "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(timeout=args.budget)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            return None
    return code


def op_figures(ab_json: Path) -> dict:
    """One op's A/B, from its ab.json: its steps' walls, its timed repeat step's fixed cost and GPU work."""
    state = json.loads(ab_json.read_text())
    steps = [s for s in state["steps"] if s["usable"]]
    records = [s for s in steps if s["args"][0] == "record"]
    passes = [s for s in steps if s.get("passes") and s["args"][0] != "record"]  # A's record: A's passes
    timed = [s for s in steps if s["args"][0] == "replay" and not s.get("passes")]
    observed = {s["run_dir"]: json.loads((Path(s["run_dir"]) / "run.json").read_text())["observed"] for s in steps}
    busy = [busy_s(Path(s["run_dir"])) for s in timed]
    rows = len(json.loads((Path(timed[0]["run_dir"]) / "results.json").read_text())["rows"]) if timed else 0
    wall = sum(s["seconds"] for s in state["steps"])
    # Where a repeat step's time went: the timer's host seconds by phase (run.json observed.timer_seconds),
    # the mean over the op's timed steps.
    phases = [observed[s["run_dir"]].get("timer_seconds") or {} for s in timed]
    names = sorted({k for p in phases for k in p})

    # The garbage collections' seconds (run.json observed.gc, every generation) per kind of step: the record,
    # B's passes, a repeat (mean): a FlagGems benchmark collects after every row.
    def gc_s(step) -> float:
        return sum(((observed[step["run_dir"]].get("gc") or {}).get("seconds") or {}).values())

    gc_seconds = {"record": round(sum(map(gc_s, records)), 3), "passes": round(sum(map(gc_s, passes)), 3),
                  "repeat": round(statistics.mean(map(gc_s, timed)), 3) if timed else None}
    # The passes and record steps' precompile: the record's pool (fork or spawn) and B's compiles done ahead.
    pools = {s["step"].rsplit("/", 1)[-1]: (observed[s["run_dir"]].get("autotune") or {}).get("precompile") or {}
             for s in steps if s["args"][0] == "record" or s.get("passes")}
    # Entries the steps wrote into their side's Triton cache (run.json observed.triton_cache_written): a repeat
    # that writes any compiled what its record or passes should have left there.
    def written(kind_steps) -> int:
        return sum(observed[s["run_dir"]].get("triton_cache_written") or 0 for s in kind_steps)

    # Graph sides of the repeats by how each was sized (run.json observed.graph_sizes): by the record's sizes,
    # afresh where its call time no longer held, by a probe.
    sized = collections.Counter()
    for s in timed:
        sized.update({k: v for k, v in (observed[s["run_dir"]].get("graph_sizes") or {}).items() if isinstance(v, int)})

    return {"cache_written": {"record": written(records), "passes": written(passes), "repeats": written(timed)},
            "repeat_graph_sizes": dict(sized),
            "timer_phases_s": {k: round(statistics.mean(p.get(k, 0.0) for p in phases), 3) for k in names},
            "gc_s": gc_seconds,
            "precompile": pools,
            "op": state["plan"]["ops"][0], "rows": rows, "steps_wall_s": round(wall, 1),
            "record_s": sum(s["seconds"] for s in records), "passes_s": sum(s["seconds"] for s in passes),
            "repeat_step_s": statistics.median(s["seconds"] for s in timed) if timed else None,
            "fixed_per_step_s": (statistics.median(s["seconds"] - b for s, b in zip(timed, busy, strict=True))
                                 if timed else None),
            "gpu_share": round(sum(busy) / wall, 3) if wall else None, "complete": state.get("complete", False)}


def chunk_walls(batch_dir: Path) -> list[tuple[int, float]]:
    """(ops, wall seconds) of each chunk that ran whole within one call: its A/B complete and none of its steps
    taken over from an attempt an earlier call stopped (a resumed chunk's ops' walls leave those out). The wall
    runs from the chunk's plan file, written as the corpus A/B began the chunk (else its first step), to the last
    of its steps' ends and its ops' own reports (each op's, written after the chunk's: ~1 s an op, the device
    idle): its A/B's start, its records together, its repeats and its reports, each second once."""
    reported: dict[str, float] = collections.defaultdict(float)  # a chunk's A/B dir -> its ops' last report
    for op_report in batch_dir.glob("ops/*/attempt*/*/report.json"):
        chunk = json.loads(op_report.read_text()).get("context", {}).get("chunk")
        if chunk:
            key = str(Path(chunk).resolve())
            reported[key] = max(reported[key], op_report.stat().st_mtime)
    out = []
    for ab_json in sorted((batch_dir / "chunks").glob("*/ab/ab.json")):
        state = json.loads(ab_json.read_text())
        steps = state.get("steps", [])
        if not state.get("complete") or not steps or any(s.get("taken_over") for s in steps):
            continue
        plan = ab_json.parent.parent / "plan.yaml"
        began = plan.stat().st_mtime if plan.is_file() else min(s["started"] for s in steps)
        ended = max(max(s["started"] + s["seconds"] for s in steps), reported[str(ab_json.parent.resolve())])
        out.append((len(state["plan"]["ops"]), ended - began))
    return out


def report(args) -> dict:
    batch_dir = _batch_dir(args.out / "corpus")
    if batch_dir is None:
        sys.exit("no corpus A/B ran: see corpus.log")
    import csv

    with open(batch_dir / "ops_status.csv", newline="") as f:
        status = {f"{r['repo']}:{r['op']}": r for r in csv.DictReader(f)}
    ops, failed = [], []
    for key, row in sorted(status.items()):
        found = sorted((batch_dir / row["run_dir"]).glob("ab.json")) if row["run_dir"] else []
        if row["status"] == "PASS" and found:
            ops.append({**op_figures(found[0]), "elapsed_s": float(row["elapsed_s"]), "key": key})
        else:
            failed.append({"key": key, "status": row["status"], "elapsed_s": row["elapsed_s"], "notes": row["notes"]})
    walls = [o["elapsed_s"] for o in ops]
    result = {"batch_dir": str(batch_dir), "repeats": args.repeats, "ops": ops, "not_finished": failed}
    # The calls' wall over the rows' sum, applied to every op: above 1 where no op's row counts it (the A/B
    # parents' and the hosts' start, a chunk's waits), below where an op's steps ran beside another's.
    calls = args.out / WALLS
    total = sum(float(x) for x in calls.read_text().split()) if calls.is_file() else 0.0
    # An op the budget stopped inside its chunk reads 0 s in ops_status.csv, though its steps ran: their seconds
    # from its ab.json count as spent, or the factor charges them to every finished op (31.6 h for ~18 h).
    finished = {o["op"] for o in ops}
    unfinished_steps = 0.0
    for ab_json in batch_dir.rglob("ab.json"):
        state = json.loads(ab_json.read_text())
        if state["plan"]["ops"][0] not in finished:
            unfinished_steps += sum(st["seconds"] for st in state["steps"])
    spent = sum(walls) + max(unfinished_steps, sum(float(f["elapsed_s"] or 0) for f in failed))
    overhead = total / spent if spent and total else 1.0
    if len(walls) >= 2:
        mean, sd = statistics.mean(walls) * overhead, statistics.stdev(walls) * overhead
        from scipy import stats

        half = stats.t.ppf(0.975, len(walls) - 1) * sd / math.sqrt(len(walls))
        result["corpus_h"] = {"estimate": round(args.inventory * mean / 3600, 2),
                              "ci95": [round(args.inventory * (mean - half) / 3600, 2),
                                       round(args.inventory * (mean + half) / 3600, 2)],
                              "from_ops": len(walls), "inventory": args.inventory,
                              "overhead_factor": round(overhead, 3), "calls_wall_s": round(total, 1)}
    # From whole chunks' walls: what a call cost per op, overlap and the chunks' starts counted once (the
    # estimate above sums steps' seconds, which overlap while records run together, and misses a resumed
    # chunk's taken-over steps).
    chunks = chunk_walls(batch_dir)
    if chunks:
        per_op = [wall / n for n, wall in chunks]
        mean = sum(wall for _, wall in chunks) / sum(n for n, _ in chunks)
        half = 0.0
        if len(per_op) >= 2:
            from scipy import stats

            half = stats.t.ppf(0.975, len(per_op) - 1) * statistics.stdev(per_op) / math.sqrt(len(per_op))
        result["corpus_h_by_chunk"] = {"estimate": round(args.inventory * mean / 3600, 2),
                                       "ci95": [round(args.inventory * (mean - half) / 3600, 2),
                                                round(args.inventory * (mean + half) / 3600, 2)],
                                       "chunks": [[n, round(wall, 1)] for n, wall in chunks],
                                       "s_per_op": round(mean, 1)}
    print(f"{'op':<40} {'rows':>4} {'wall s':>7} {'record':>7} {'passes':>7} {'repeat':>7} {'fixed':>6} {'gpu %':>6}")
    for o in ops:
        fixed = o["fixed_per_step_s"]
        print(f"{o['key']:<40} {o['rows']:>4} {o['elapsed_s']:>7.1f} {o['record_s']:>7.1f} {o['passes_s']:>7.1f} "
              f"{o['repeat_step_s'] or 0:>7.2f} {fixed if fixed is not None else float('nan'):>6.2f} "
              f"{100 * (o['gpu_share'] or 0):>6.1f}")
    for o in ops:
        for step, facts in o["precompile"].items():
            ahead = facts.get("ahead")
            print(f"{o['key']:<40} {step}: pool {facts.get('pool')}, {facts.get('compiled', 0)} precompiled in "
                  f"{facts.get('seconds', 0)} s" + (f", ahead {ahead}" if ahead else ""))
        if o["timer_phases_s"]:
            print(f"{o['key']:<40} a repeat step's timer, s: "
                  + " ".join(f"{k} {v:.2f}" for k, v in o["timer_phases_s"].items()))
        print(f"{o['key']:<40} garbage collections, s: " + " ".join(f"{k} {v}" for k, v in o["gc_s"].items()))
        print(f"{o['key']:<40} Triton cache entries written: "
              + " ".join(f"{k} {v}" for k, v in o["cache_written"].items())
              + "; repeats' graphs sized: " + (" ".join(f"{k} {v}" for k, v in o["repeat_graph_sizes"].items())
                                               or "none"))
    for f in failed:
        print(f"{f['key']:<40} {f['status']} after {f['elapsed_s']} s: {f['notes'][:100]}")
    if "corpus_h" in result:
        c = result["corpus_h"]
        print(f"whole corpus ({c['inventory']} ops, {args.repeats} repeats, one device): ~{c['estimate']} h "
              f"(95% {c['ci95'][0]}-{c['ci95'][1]} h, from {c['from_ops']} ops; {len(failed)} not finished)")
    if "corpus_h_by_chunk" in result:
        c = result["corpus_h_by_chunk"]
        print(f"whole corpus from whole chunks' walls: ~{c['estimate']} h (95% {c['ci95'][0]}-{c['ci95'][1]} h over "
              f"{len(c['chunks'])} chunks, {c['s_per_op']} s an op; chunks (ops, s): {c['chunks']})")
    (args.out / "report.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flaggems-dir", action="append", default=[], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plan")
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--b-env", action="append", default=[])
    parser.add_argument("--chunk", type=int, help="time the repeats of K ops in one process a side (ab --chunk)")
    parser.add_argument("--chunk-records", choices=("beside", "first"), help="ab --chunk-records")
    parser.add_argument("--record-jobs", type=int, help="ab --record-jobs")
    parser.add_argument("--backend")
    parser.add_argument("--op-timeout", type=float)
    parser.add_argument("--budget", type=float, help="seconds this call runs the A/B before stopping it to resume")
    parser.add_argument("--inventory", type=int, default=INVENTORY)
    parser.add_argument("--profile-hosts", type=Path, help="each run a measuring host serves profiled into DIR "
                        "(tests/gpu/profile_hosts.py)")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.flaggems_dir = [str(Path(d).resolve()) if "=" not in d else d for d in args.flaggems_dir]
    began = time.monotonic()
    code = run(args)
    with open(args.out / WALLS, "a") as f:
        f.write(f"{time.monotonic() - began:.1f}\n")
    print(f"corpus A/B: {'stopped at --budget: run again to resume' if code is None else f'exit {code}'} "
          f"after {time.monotonic() - began:.0f} s")
    report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
