"""GPU check (run on a host with 2 GPUs, not collected by pytest): the built-in corpus A/B under
ops/ab_f32_ieee.yaml (tf32 vs IEEE fp32), once on 1 device and once on 2, with a small shape file.

    python tests/gpu/bench_corpus_ab.py [--devices 0,1] [--repeats 3] [--out DIR]

Prints the wall time of each run (1 device vs 2), each run's per-op statuses and verdict counts,
and every row whose verdict is FASTER in one run and SLOWER in the other. Success: both runs exit 0
(every op PASS), the 2-device run's wall time is clearly below the 1-device one's (about half: the
ops are spread by a stable hash, so not exactly), and no row flips between FASTER and SLOWER
(mm's fp32 rows should be SLOWER under IEEE in both runs). Exit 0 then, 1 otherwise. Takes about
6 minutes on two H200s; `--repeats 2` makes it shorter.
"""

from __future__ import annotations

import argparse
import collections
import json
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
"""


def run(devices: str, repeats: int, shapes: Path, out: Path) -> tuple[float, int, Path]:
    """One corpus A/B; (wall seconds, exit code, its batch dir)."""
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "harness", "ab", "ops/ab_f32_ieee.yaml", "--all", "--repos", "builtin",
           "--shapes", str(shapes), "--devices", devices, "--repeats", str(repeats), "--out", str(out)]
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    code = subprocess.run(cmd, cwd=REPO).returncode
    return time.monotonic() - start, code, next(out.iterdir())


def verdicts(batch_dir: Path) -> dict[tuple, str]:
    """(op, dtype, shape) -> verdict, from each op's single-op A/B report."""
    found = {}
    for report in batch_dir.glob("ops/*/attempt*/ab_*/report.json"):
        for r in json.loads(report.read_text())["rows"]:
            found[(r["op"], r["dtype"], tuple(r["shape"]))] = (r["comparison"] or {}).get("verdict", "UNPAIRED")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="0,1", help="the two devices (default 0,1); the 1-device run: the first")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="where the two batch dirs go (default: a temp dir)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="zl_bench_corpus_ab_"))
    shapes = root / "shapes.yaml"
    root.mkdir(parents=True, exist_ok=True)
    shapes.write_text(SHAPES)
    runs = {}
    for label, devices in (("1 device", args.devices.split(",")[0]), ("2 devices", args.devices)):
        runs[label] = run(devices, args.repeats, shapes, root / label.replace(" ", "_"))
    ok = True
    print()
    for label, (wall, code, batch_dir) in runs.items():
        counts = collections.Counter(verdicts(batch_dir).values())
        print(f"{label}: wall {wall:.0f} s, exit {code}, verdicts {dict(sorted(counts.items()))}, dir {batch_dir}")
        ok &= code == 0
    (w1, _, d1), (w2, _, d2) = runs["1 device"], runs["2 devices"]
    print(f"wall 1 device / 2 devices: {w1:.0f} s / {w2:.0f} s = {w1 / w2:.2f}x")
    v1, v2 = verdicts(d1), verdicts(d2)
    flips = sorted(k for k in v1.keys() & v2.keys() if {v1[k], v2[k]} == {"FASTER", "SLOWER"})
    for op, dtype, shape in flips:
        print(f"FLIP {op} {dtype} {'x'.join(map(str, shape))}: {v1[(op, dtype, shape)]} on 1 device, "
              f"{v2[(op, dtype, shape)]} on 2")
    print(f"rows compared in both runs: {len(v1.keys() & v2.keys())}; FASTER/SLOWER flips: {len(flips)}")
    ok &= not flips and w2 < w1
    print("OK" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
