"""GPU check (run on a host with 2 GPUs, not collected by pytest): a corpus A/B under a plan
(default ops/ab_f32_ieee.yaml, tf32 vs IEEE fp32; ops/ab_default.yaml is the FP-fusion switch) over the
built-in corpus and, with --flaggems-dir, 10 FlagGems pointwise and reduction ops, once on 1 device and
once on 2, with a small shape file.

    python tests/gpu/bench_corpus_ab.py [--plan P] [--flaggems-dir D] [--devices 0,1] [--repeats 3]
                                        [--only 1|2|again] [--out DIR]

Prints the wall time of each run (1 device vs 2), each run's verdict counts, and every row whose
verdict is FASTER in one run and SLOWER in the other. Success: both runs exit 0 (every op PASS), the
2-device run's wall time is clearly below the 1-device one's (about half: the ops are spread by a
stable hash, so not exactly), and no row flips between FASTER and SLOWER (mm's fp32 rows should be
SLOWER under IEEE in both runs). Exit 0 then, 1 otherwise. The built-in corpus alone takes about 6
minutes on two H200s. With FlagGems ops a run can outlast one device-tool call: `--only 1 --out DIR`
in one call, `--only 2 --out DIR` in the next (DIR kept or carried between them), and the report
once both are there. Each run's wall and exit code are kept in DIR/<run>.json.

A run longer than one call: `--budget S` stops it after S seconds (SIGTERM, which the corpus A/B
takes as Ctrl-C) and the next call with the same --only and --out resumes it (`ab --resume`). Its
wall is then the sum of its calls' walls, which also counts the ops the stops cut off and redone;
the report prints beside it the sum of the ops' own elapsed times (their final runs only), so the
1- vs 2-device ratio can be read both ways.

On a host with one GPU, `--only again` runs the 1-device A/B a second time into the same --out: the
report then counts the verdicts that flip between the two 1-device runs (the wall ratio needs the
2-device run). Any two finished runs make a report; flips are counted between every pair.
"""

from __future__ import annotations

import argparse
import collections
import csv
import itertools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPES = """\
softmax: {shapes: [[1024, 1024], [4096, 4096]], dtypes: [fp32]}
norm: {shapes: [[1024, 4096]], dtypes: [fp32]}
pointwise: {shapes: [[4096, 4096]], dtypes: [fp32]}
blas: {shapes: [[1024, 1024, 1024], [4096, 4096, 4096]], dtypes: [fp32]}
# FlagGems' Benchmark classes take shapes by class name: small ones keep each op's A/B short.
UnaryPointwiseBenchmark: {shapes: [[1024, 1024], [4096, 4096]]}
BinaryPointwiseBenchmark: {shapes: [[1024, 1024], [4096, 4096]]}
UnaryReductionBenchmark: {shapes: [[1024, 1024], [4096, 4096]]}
"""
# Qualified: FlagGems has ops of these names too.
BUILTIN_OPS = ["builtin:softmax", "builtin:rms_norm", "builtin:add", "builtin:gelu", "builtin:mm"]
# Polynomial and transcendental pointwise ops (FP fusion changes their code), plain ones, a reduction.
FLAGGEMS_OPS = ["flaggems:i0", "flaggems:special_i0e", "flaggems:exp", "flaggems:sigmoid", "flaggems:tanh",
                "flaggems:rsqrt", "flaggems:abs", "flaggems:greater_equal_", "flaggems:multiply_", "flaggems:sum_dim"]
RUNS = {"1": "1_device", "2": "2_devices", "again": "1_device_again"}


def _batch_dir(out: Path) -> Path | None:
    """The corpus A/B's batch dir under `out`, once it has started one."""
    return next((p for p in out.iterdir() if (p / "batch.json").is_file()), None) if out.is_dir() else None


STOPPED = (130, 143)  # the corpus A/B's exit codes after Ctrl-C or SIGTERM: resumable


def run(plan: str, ops: list[str], devices: str, repeats: int, shapes: Path, out: Path,
        flaggems_dir: Path | None, budget: float | None) -> tuple[float, int, Path] | None:
    """One corpus A/B, or the next part of one an earlier call stopped at its --budget: (wall
    seconds over all its calls, exit code, its batch dir), also kept in `out`.json; None when this
    call's budget ran out first (the part's wall is kept in `out`.calls.json)."""
    calls_file = out.with_suffix(".calls.json")
    calls = json.loads(calls_file.read_text()) if calls_file.is_file() else []
    batch_dir = _batch_dir(out)
    if batch_dir is None or not calls:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        calls = []
        cmd = [sys.executable, "-m", "harness", "ab", plan, "--ops", *ops, "--shapes", str(shapes), "--dtypes", "fp32",
               "--devices", devices, "--repeats", str(repeats), "--out", str(out)]
        if flaggems_dir is not None:
            cmd += ["--flaggems-dir", str(flaggems_dir)]
    else:
        cmd = [sys.executable, "-m", "harness", "ab", "--resume", "--batch-dir", str(batch_dir)]
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO)
    try:
        code = proc.wait(budget)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the A/B kills its running ops and keeps what finished
        code = proc.wait()
    calls.append(time.monotonic() - start)
    calls_file.write_text(json.dumps(calls))
    batch_dir = _batch_dir(out) or out
    if code in STOPPED:
        print(f"{out.name}: stopped after {calls[-1]:.0f} s (call {len(calls)}); run again to resume it")
        return None
    out.with_suffix(".json").write_text(json.dumps({"wall_s": sum(calls), "calls_s": calls, "exit": code,
                                                    "devices": devices, "ops": ops}))
    return sum(calls), code, batch_dir


def done(out: Path) -> tuple[float, int, Path] | None:
    """A run an earlier call finished: (wall, exit code, batch dir), or None."""
    facts = out.with_suffix(".json")
    if not facts.is_file():
        return None
    data = json.loads(facts.read_text())
    return data["wall_s"], data["exit"], _batch_dir(out) or out


def op_seconds(batch_dir: Path) -> float:
    """The sum of the ops' own elapsed times (ops_status.csv: each op's final run)."""
    path = batch_dir / "ops_status.csv"
    if not path.is_file():
        return float("nan")
    with open(path, newline="") as f:
        return sum(float(r["elapsed_s"] or 0) for r in csv.DictReader(f))


def verdicts(batch_dir: Path) -> dict[tuple, tuple[str, str]]:
    """(op, dtype, shape) -> (verdict, IR status), from the corpus report the A/B wrote."""
    report = batch_dir / "report.json"
    if not report.is_file():
        return {}
    return {(r["op_key"], r["dtype"], tuple(r["shape"])): (r["verdict"], r["ir"]["status"])
            for r in json.loads(report.read_text())["rows"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="0,1", help="the two devices (default 0,1); the 1-device run: the first")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plan", default="ops/ab_f32_ieee.yaml", help="the A/B plan (default ops/ab_f32_ieee.yaml)")
    parser.add_argument("--flaggems-dir", type=Path, default=None, help="a FlagGems checkout: add its 10 ops")
    parser.add_argument("--only", choices=sorted(RUNS), default=None,
                        help="run only the 1- or the 2-device A/B now, or `again`: the 1-device one a second "
                             "time, for the flip count on a host with one GPU (needs --out; the report once two "
                             "runs are done)")
    parser.add_argument("--out", type=Path, default=None, help="where the two batch dirs go (default: a temp dir)")
    parser.add_argument("--budget", type=float, default=None,
                        help="stop a run after this many seconds; the next call with the same --out resumes it")
    args = parser.parse_args()
    if args.only and args.out is None:
        parser.error("--only needs --out, where the other run is or will be")
    root = args.out or Path(tempfile.mkdtemp(prefix="zl_bench_corpus_ab_"))
    shapes = root / "shapes.yaml"
    root.mkdir(parents=True, exist_ok=True)
    shapes.write_text(SHAPES)
    ops = BUILTIN_OPS + (FLAGGEMS_OPS if args.flaggems_dir else [])
    runs = {}
    for key, devices in (("1", args.devices.split(",")[0]), ("2", args.devices),
                         ("again", args.devices.split(",")[0])):
        out = root / RUNS[key]
        earlier = done(out)
        if earlier is None and args.only in (None, key) and (key != "again" or args.only == "again"):
            earlier = run(args.plan, ops, devices, args.repeats, shapes, out, args.flaggems_dir, args.budget)
        if earlier is not None:
            runs[RUNS[key].replace("_", " ")] = earlier
        elif args.only == key:
            return 1  # stopped at its budget: the next call resumes it
    if len(runs) < 2:
        print(f"{', '.join(runs) or 'no run'} done; a report needs two runs (--only 1|2|again --out {root})")
        return 1
    ok = True
    print()
    for label, (wall, code, batch_dir) in runs.items():
        counts = collections.Counter(v for v, _ in verdicts(batch_dir).values())
        print(f"{label}: wall {wall:.0f} s (ops' own {op_seconds(batch_dir):.0f} s), exit {code}, "
              f"verdicts {dict(sorted(counts.items()))}, dir {batch_dir}")
        ok &= code == 0
    if "1 device" in runs and "2 devices" in runs:
        (w1, _, _), (w2, _, _) = runs["1 device"], runs["2 devices"]
        print(f"wall 1 device / 2 devices: {w1:.0f} s / {w2:.0f} s = {w1 / w2:.2f}x")
        ok &= w2 < w1
    for (label_a, (_, _, dir_a)), (label_b, (_, _, dir_b)) in itertools.combinations(runs.items(), 2):
        va, vb = verdicts(dir_a), verdicts(dir_b)
        both = va.keys() & vb.keys()
        flips = sorted(k for k in both if {va[k][0], vb[k][0]} == {"FASTER", "SLOWER"})
        for op, dtype, shape in flips:
            print(f"FLIP {op} {dtype} {'x'.join(map(str, shape))}: {va[(op, dtype, shape)][0]} in {label_a}, "
                  f"{vb[(op, dtype, shape)][0]} in {label_b} (IR {va[(op, dtype, shape)][1]})")
        changed = sum(va[k][0] != vb[k][0] for k in both)
        on_changed_ir = sum(1 for k in flips if va[k][1] == "changed")
        print(f"{label_a} vs {label_b}: rows in both {len(both)}, verdicts that differ {changed}, "
              f"FASTER/SLOWER flips {len(flips)} ({on_changed_ir} on rows whose IR changed)")
        ok &= not flips
    print("OK" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
