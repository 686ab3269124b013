"""No op screens slower than upstream (issue 45, item 3): run by hand on one GPU host (not collected by pytest;
no nox needed).

    python3 tests/gpu/bench_vs_upstream.py --flaggems-dir FlagGems --out DIR [--sample 30] [--seed 45]
        [--level core] [--op-timeout S]
    python3 tests/gpu/bench_vs_upstream.py --flaggems-dir tests/resources/flaggems_checkout --backend interpreter \
        --sample 3 --out /tmp/u      # the pipeline on a CPU (upstream's do_bench needs a device: every op
                                     # is listed as not compared)

A seeded sample of the FlagGems inventory is screened once by the tool (`python -m harness batch --all --repos
flaggems --sample N --sample-seed S --devices 0`, its ops at their own shapes of --level), then each op by
upstream's own command in the checkout, one process an op as a user runs it: `python -m pytest
benchmark/<file>::<function> --level L`. Per op: the tool's wall (its ops_status.csv elapsed_s, plus an
even share of what no op's row counts: the batch's start and end) beside upstream's, and their ratio.
Prints the table, the ops above 1.0x and the median; writes DIR/report.json. Exit 0 when no op is above
1.0x, 1 otherwise, 2 when the batch did not run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def screen(args) -> tuple[Path | None, float]:
    """The tool's batch over the sample: its batch dir and its wall."""
    out = args.out / "screen"
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "harness", "batch", "--all", "--repos", "flaggems", "--sample", str(args.sample),
            "--sample-seed", str(args.seed), "--flaggems-dir", str(args.flaggems_dir), "--level", args.level,
            "--devices", "0", "--out", str(out),
            *(["--backend", args.backend] if args.backend else []),
            *(["--op-timeout", str(args.op_timeout)] if args.op_timeout else [])]
    started = time.monotonic()
    with open(args.out / "screen.log", "w") as log:
        subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    batch_dir = next((p for p in out.iterdir() if (p / "ops_status.csv").is_file()), None)
    return batch_dir, wall


def upstream(args, op: str, op_file: str) -> dict:
    """Upstream's own run of one op's benchmark function, in its checkout: wall and exit code."""
    from harness.providers import flaggems

    selector = f"flaggems:{op}" + (f"@{op_file}" if op_file else "")
    target = flaggems.resolve_target(selector, {"flaggems": args.flaggems_dir.resolve()})
    argv = [sys.executable, "-m", "pytest", f"{target.test_file}::{target.function}", "--level", args.level,
            "-q", "-p", "no:cacheprovider"]
    env = dict(os.environ)
    if args.backend == "interpreter":
        env["TRITON_INTERPRET"] = "1"
    started = time.monotonic()
    with open(args.out / "upstream.log", "a") as log:
        log.write(f"=== {op}: {' '.join(argv)}\n")
        log.flush()
        try:
            proc = subprocess.run(argv, cwd=target.root, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=args.op_timeout, check=False)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    return {"upstream_s": round(time.monotonic() - started, 2), "upstream_exit": code,
            "node": f"{target.test_file}::{target.function}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flaggems-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--level", default="core")
    parser.add_argument("--backend")
    parser.add_argument("--op-timeout", type=float)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batch_dir, wall = screen(args)
    if batch_dir is None:
        print(f"the batch did not run: see {args.out / 'screen.log'}")
        return 2
    with open(batch_dir / "ops_status.csv", newline="") as f:
        status = [r for r in csv.DictReader(f) if r["repo"] == "flaggems"]
    spent = sum(float(r["elapsed_s"] or 0) for r in status)
    share = max(0.0, wall - spent) / len(status) if status else 0.0  # the batch's start and end, per op
    ops = []
    for row in status:
        ours = float(row["elapsed_s"] or 0) + share
        theirs = upstream(args, row["op"], row.get("op_file", ""))
        ops.append({"op": row["op"], "status": row["status"], "rows": row["rows"], "tool_s": round(ours, 2),
                    **theirs, "ratio": round(ours / theirs["upstream_s"], 3) if theirs["upstream_s"] else None})
    print(f"{'op':<44} {'status':<8} {'rows':>4} {'tool s':>7} {'upstream s':>10} {'exit':>4} {'ratio':>6}")
    for o in ops:
        print(f"{o['op']:<44} {o['status']:<8} {o['rows'] or '':>4} {o['tool_s']:>7.1f} {o['upstream_s']:>10.1f} "
              f"{o['upstream_exit'] if o['upstream_exit'] is not None else 'T/O':>4} {o['ratio'] or 0:>6.2f}")
    # Only ops both ran to the end compare: a tool failure or an upstream error or timeout is listed apart.
    compared = [o for o in ops if o["status"] == "PASS" and o["upstream_exit"] == 0 and o["ratio"] is not None]
    slower = [o for o in compared if o["ratio"] > 1.0]
    result = {"batch_dir": str(batch_dir), "batch_wall_s": round(wall, 1), "level": args.level, "ops": ops,
              "compared": len(compared), "above_1": [o["op"] for o in slower],
              "median_ratio": statistics.median(o["ratio"] for o in compared) if compared else None,
              "max_ratio": max((o["ratio"] for o in compared), default=None)}
    print(f"{len(compared)} ops compared, median {result['median_ratio']}, max {result['max_ratio']}; "
          f"above 1.0x: {', '.join(result['above_1']) or 'none'}; not compared: {len(ops) - len(compared)}")
    (args.out / "report.json").write_text(json.dumps(result, indent=1))
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
