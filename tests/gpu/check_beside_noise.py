"""What widens the spread of the rows a chunk times beside its next ops' records (`--chunk-records beside`,
docs/performance.md "Records beside the repeats"): the records' device work between the timed rows, or their
compiles on the host's cores while a row is timed.

One process times rows (torch kernels of 1 us to 1 ms) as the graph timer does (a graph of ~0.5 ms replayed
in 2 ms chains, 5 ms of warmup, the median of 10 samples), each row captured afresh, in rounds. Beside it,
under each condition: nothing; a helper process that takes the device between rows through a lock, as a
record's case holds the device gate between them (its kernels: a sweep's matmuls and copies, ~30 ms);
processes that keep the host's other cores busy (compiles) while rows are timed; both; eight idle processes
holding a context and 1 GiB each (a chunk's measuring hosts, alive for the whole chunk beside). Per condition
and row:
the sd across rounds of the row's median (what a process's level does to a verdict) and the median sd of its
samples within a measurement.

    python3 tests/gpu/check_beside_noise.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import multiprocessing as mp
import os
import statistics
import tempfile
import time


def _device_work(lock_path: str, stop) -> None:
    """A record's cases between the timed rows: hold the lock, run ~30 ms of kernels, let it go."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    big = torch.empty(64 * 1024 * 1024, device="cuda", dtype=torch.float16)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    while not stop.is_set():
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for _ in range(6):
                a @ a
                big.mul_(1.0001)
            torch.cuda.synchronize()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep(0.001)


def _idle_context(stop) -> None:
    """A measuring host waiting for its next op: a live context holding its inputs and graph pools."""
    import torch

    held = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    torch.cuda.synchronize()
    stop.wait()
    del held


def _cpu_work(stop) -> None:
    """A compile: the host's cores busy (memory-hungry), at the niceness of a step beside."""
    os.nice(10)
    buf = bytearray(32 * 1024 * 1024)
    i = 0
    while not stop.is_set():
        buf[i % len(buf)] = i & 0xFF
        i += 4099


def _rows():
    import torch

    small = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    mid = torch.randn(1 << 20, device="cuda", dtype=torch.float32)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    mm = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    return {"add 64x64 fp16": lambda: small + small, "exp 1M fp32": lambda: torch.exp(mid),
            "exp 4096^2 fp16": lambda: torch.exp(big), "mm 2048 fp16": lambda: mm @ mm}


def _time_row(fn) -> tuple[float, float]:
    """(the median of 10 chained-graph samples, their relative sd), as the graph timer takes them."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    per_call = max(start.elapsed_time(end) / 3, 1e-4)
    for _ in range(max(1, math.ceil(5.0 / per_call))):  # 5 ms of warmup
        fn()
    unroll = max(1, min(500, math.ceil(0.5 / per_call)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        for _ in range(unroll):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    chain = max(1, math.ceil(2.0 / (per_call * unroll)))
    samples = []
    for _ in range(10):
        start.record()
        for _ in range(chain):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / (chain * unroll))
    return statistics.median(samples), statistics.stdev(samples) / statistics.mean(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    import torch

    print(torch.cuda.get_device_name(), flush=True)
    rows = _rows()
    lock_path = os.path.join(tempfile.mkdtemp(), "device.gate")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    ctx = mp.get_context("spawn")
    cores = max(1, len(os.sched_getaffinity(0)) - 2)
    conditions = ("alone", "device work between rows", "cores busy during rows", "both",
                  "8 idle contexts (hosts waiting)", "alone again")
    for condition in conditions:
        stop = ctx.Event()
        helpers = []
        if condition in ("device work between rows", "both"):
            helpers.append(ctx.Process(target=_device_work, args=(lock_path, stop)))
        if condition in ("cores busy during rows", "both"):
            helpers += [ctx.Process(target=_cpu_work, args=(stop,)) for _ in range(cores)]
        if condition.startswith("8 idle contexts"):
            helpers += [ctx.Process(target=_idle_context, args=(stop,)) for _ in range(8)]
        for p in helpers:
            p.start()
        time.sleep(8 if helpers else 0)  # the helpers' imports and CUDA contexts
        medians = {name: [] for name in rows}
        within = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, fn in rows.items():
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    median, rel_sd = _time_row(fn)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                medians[name].append(median)
                within[name].append(rel_sd)
                time.sleep(0.002)  # the host's inputs and checks between rows: the helper gets the device
        stop.set()
        for p in helpers:
            p.join(30)
            with contextlib.suppress(Exception):
                p.kill()
        print(f"== {condition}")
        for name in rows:
            logs = [math.log(m) for m in medians[name]]
            print(f"  {name:<16} median {statistics.median(medians[name]) * 1000:9.2f} us  sd between measurements "
                  f"{100 * statistics.stdev(logs):.3f}%  within {100 * statistics.median(within[name]):.3f}%",
                  flush=True)


if __name__ == "__main__":
    main()
