"""GPU check (run on a CUDA host, not collected by pytest): the timers against the device's own
kernel time, on the built-in corpus (softmax, rms_norm, add, gelu; default shapes, bf16, the
Triton candidate), through the harness's Timer as a run uses it.

    python tests/gpu/check_timers.py

Per row: the graph timer, the profiler timer (`--timer profiler`), and the profiler's kernel time
from the attribution pass every row gets (`kernels`, summed); the profiler timer's A/A: the median
|delta| between consecutive repeats; on rows under 5 us, the graph and profiler timers with a
cold L2. Targets (printed PASS/FAIL, exit 0 when both pass):
  - kernels >= 5 us: the graph timer within 3% of the kernel time (the profiler timer's median);
  - kernels < 5 us: the profiler timer's A/A median |delta| <= 0.5% (median over those rows).
About 80 s on an H200, compile and autotune included.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import backends  # noqa: E402
from harness.measure.timers import Timer  # noqa: E402
from harness.providers import registry, shapes  # noqa: E402

OPS = ("softmax", "rms_norm", "add", "gelu")
SHAPES = Path(__file__).resolve().parents[2] / "shapes" / "default.yaml"
AA_REPEATS = 3
SMALL_US = 5.0


def rows():
    for name in OPS:
        op, _ = registry.load(name)
        _, shape_list, _ = shapes.resolve(SHAPES, op.name, op.shape_keys, len(op.dims) if op.dims else None)
        for shape in shape_list:
            yield op, shape


def median_us(timer: Timer, name: str, fn) -> tuple[float, list[dict] | None]:
    m = timer.measure_pair(name, {"candidate": fn}).measurements["candidate"]
    return m.median_ms * 1e3, m.kernels


def main() -> int:
    start = time.monotonic()
    cuda = backends.get("cuda")
    marks: list[str] = []
    warm = {t: Timer(cuda, t, 25, 100, marks.append) for t in ("graph", "profiler")}
    cold = {t: Timer(cuda, t, 25, 100, marks.append, l2="cold") for t in ("graph", "profiler")}
    print(f"device: {torch.cuda.get_device_name(0)}; L2 {cuda.l2_cache_bytes() / 2**20:.0f} MiB; "
          f"torch {torch.__version__}")
    table, big_ratios, small_aa = [], [], []
    for op, shape in rows():
        args = op.inputs(shape, torch.bfloat16, "cuda")
        fn = lambda op=op, args=args: op.candidate(*args)  # noqa: E731
        fn()  # compile and autotune outside the timers
        torch.cuda.synchronize()
        graph_us, kernels = median_us(warm["graph"], op.name, fn)
        attributed_us = sum(k["time_ms"] for k in kernels) * 1e3
        repeats = [median_us(warm["profiler"], op.name, fn)[0] for _ in range(AA_REPEATS)]
        prof_us = repeats[0]
        aa = statistics.median(abs(b / a - 1) for a, b in zip(repeats, repeats[1:], strict=False)) * 100
        small = prof_us < SMALL_US
        row = [op.name, "x".join(map(str, shape)), len(kernels), f"{graph_us:.3f}", f"{prof_us:.3f}",
               f"{attributed_us:.3f}", f"{graph_us / prof_us:.3f}", f"{aa:.2f}"]
        if small:
            small_aa.append(aa)
            row += [f"{median_us(cold[t], op.name, fn)[0]:.3f}" for t in ("graph", "profiler")]
        else:
            big_ratios.append((f"{op.name} {row[1]}", graph_us / prof_us))
            row += ["", ""]
        table.append(row)
        print(f"  {op.name} {row[1]}: graph {row[3]} us, profiler {row[4]} us ({time.monotonic() - start:.0f} s)",
              flush=True)
    print(tabulate(table, headers=["op", "shape", "kernels", "graph us", "profiler us", "kernel us (attrib)",
                                   "graph/profiler", "A/A |d| %", "cold graph us", "cold profiler us"]))
    if marks:
        print("markers:", *sorted(set(marks)), sep="\n  ")
    off = [(name, r) for name, r in big_ratios if abs(r - 1) > 0.03]
    aa_median = statistics.median(small_aa) if small_aa else 0.0
    ok_big, ok_small = not off, aa_median <= 0.5
    offs = f" (off: {', '.join(f'{n} {r:.3f}' for n, r in off)})" if off else ""
    print(f"kernels >= {SMALL_US} us: graph within 3% of kernel time on {len(big_ratios) - len(off)}/{len(big_ratios)} "
          f"rows {'PASS' if ok_big else 'FAIL'}{offs}")
    print(f"kernels < {SMALL_US} us: profiler timer A/A median |delta| {aa_median:.3f}% over {len(small_aa)} rows "
          f"{'PASS' if ok_small else 'FAIL'}")
    print(f"{len(table)} rows in {time.monotonic() - start:.0f} s")
    return 0 if ok_big and ok_small else 1


if __name__ == "__main__":
    sys.exit(main())
