"""GPU check (run on a CUDA host, not collected by pytest): what sets a small kernel's latency state.

A kernel of a few us sits in one of two latency states about 8% apart (an H200), and a row's
repeats, one process each, disagree by the state. This times small rows through the harness's graph
timer in several windows per process, in several processes, with the buffers handled four ways:
  - same:     the same input and output buffers in every window (each window captured afresh);
  - inputs:   fresh input copies before each window;
  - buffers:  fresh inputs and outputs before each window, after a pad of random size, so they
              land at other offsets and, past the pad, in other segments;
  - rotate:   every window after a pad, like `buffers`, and each window itself rotates over 4 sets of
              buffers inside its graph.
and prints, per mode and row: the spread between windows within a process, the spread between
processes of the first window (a row timed once) and of the mean over windows.

    python tests/gpu/check_small_state.py [--processes 5] [--windows 6]

About 2-3 minutes on an H200.
"""

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("same", "inputs", "buffers", "rotate")
ROWS = (("add", (16, 4096)), ("add", (256, 4096)), ("add", (1024, 1024)), ("softmax", (1024, 1024)),
        ("softmax", (64, 1024)))
ROTATE = 4


def chosen_configs(op) -> str:
    """The configs the op's autotuners chose in this process (a per-process choice would explain a
    per-process state)."""
    module = sys.modules[op.candidate.__module__]
    return "; ".join(f"{name}: {sorted(map(str, obj.cache.values()))}" for name, obj in vars(module).items()
                     if isinstance(getattr(obj, "cache", None), dict))


def child(windows: int, seed: int, only: str | None) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    import backends
    from harness.measure.timers import Timer
    from harness.providers import registry

    random.seed(seed)
    cuda = backends.get("cuda")
    timer = Timer(cuda, "graph", 25, 100, lambda _: None, attribute=False)
    keep = []  # every buffer lives to the end: a fresh allocation must not reuse a freed one
    out = {}
    for name, shape in ROWS:
        if only and name != only:
            continue
        op, _ = registry.load(name)
        base = op.inputs(shape, torch.bfloat16, "cuda")
        for side, kernel in (("baseline", op.baseline), ("candidate", op.candidate)):
            for mode in MODES:
                medians = []
                sets = [base]
                for window in range(windows):
                    if mode != "same" and window:
                        if mode in ("buffers", "rotate"):
                            keep.append(torch.empty(random.randrange(1, 64) << 20, dtype=torch.int8, device="cuda"))
                        sets = [tuple(a.clone() for a in base) for _ in range(ROTATE if mode == "rotate" else 1)]
                        keep.extend(sets)
                    calls = iter(range(10**9))

                    def fn(sets=sets, calls=calls, kernel=kernel):
                        return kernel(*sets[next(calls) % len(sets)])

                    medians.append(timer._graph(fn).median_ms * 1e3)
                out[f"{name} {shape} {side} {mode}"] = medians
        out[f"{name} {shape} configs"] = chosen_configs(op)
    print("RESULT " + json.dumps(out))


def log_sd(values) -> float:
    logs = [math.log(v) for v in values]
    return 100 * statistics.stdev(logs) if len(logs) > 1 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--only", default=None, help="one op's rows")
    parser.add_argument("--child", type=int, default=None)
    args = parser.parse_args()
    if args.child is not None:
        child(args.windows, args.child, args.only)
        return 0
    runs = []
    for p in range(args.processes):
        done = subprocess.run([sys.executable, __file__, "--child", str(p), "--windows", str(args.windows),
                               *(["--only", args.only] if args.only else [])],
                              capture_output=True, text=True, check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        runs.append(json.loads(line[len("RESULT "):]))
        print(f"process {p} done", flush=True)
    print(f"{'row':<40}{'us':>8}{'win sd%':>9}{'1st-win between%':>18}{'mean between%':>15}  windows (process 0)")
    for key in runs[0]:
        per_proc = [r[key] for r in runs]
        if key.endswith("configs"):
            print(f"{key}: " + " | ".join(per_proc))
            continue
        within = statistics.mean(log_sd(w) for w in per_proc)
        first = log_sd([w[0] for w in per_proc])
        mean = log_sd([math.exp(statistics.mean(math.log(v) for v in w)) for w in per_proc])
        us = statistics.median(v for w in per_proc for v in w)
        print(f"{key:<40}{us:>8.2f}{within:>9.2f}{first:>18.2f}{mean:>15.2f}  "
              + " ".join(f"{v:.2f}" for v in per_proc[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
