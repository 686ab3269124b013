"""GPU check (run on a CUDA host, not collected by pytest): is a chain of short graph replays as good a
clock as one long unrolled graph, at a fraction of the capture's host cost?

    python3 tests/gpu/check_graph_chain.py [--flaggems-dir DIR]

The graph timer captures enough calls to fill GRAPH_REPLAY_TARGET_MS (2 ms) of device time and times one
replay per sample. Capturing costs the host each call's Python: FlagGems' wrappers cost 20-50 us a call, so
a 1.5 us kernel's 1,300-call capture costs ~50 ms a side, more than its samples. The alternative: capture
a graph of CHAIN_MS of device time and time k back-to-back replays of it per sample (k x CHAIN_MS ~ 2 ms);
the host queues replays faster than the device runs them, so the device never idles, and each graph
boundary adds its own small gap. Per kernel: the per-call median of each way (unrolled; chained at
several CHAIN_MS), its ratio to the unrolled one, the samples' relative sd, and the host seconds of the
capture and of the sampling. Rounds alternate the ways, so clocks and heat are shared.

Then the warmup a row needs: with the unrolled graph captured, per warmup budget W (ms of calls before
sampling) and state before it (`busy`: right after other device work, as a row after a row; `idle`: after
IDLE_S of an idle device, as a process's first row), the median of the 10 samples that follow, over the
steady median (the same graph after 100 ms of replays): what the samples of a row read when its warmup is
W. Rounds alternate the budgets.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

TARGET_MS = 2.0
CHAINS_MS = (0.05, 0.2, 0.5)
SAMPLES = 20
ROUNDS = 3
WARMUPS_MS = (0.0, 2.0, 5.0, 25.0)
IDLE_S = 0.5


def events_ms(run) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def capture(fn, calls: int):
    graph = torch.cuda.CUDAGraph()
    started = time.perf_counter()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        for _ in range(calls):
            fn()
    seconds = time.perf_counter() - started
    graph.replay()
    torch.cuda.synchronize()
    return graph, seconds


def per_call_ms(fn) -> float:
    graph, _ = capture(fn, 10)
    return min(events_ms(graph.replay) for _ in range(3)) / 10


def way(fn, t_ms: float, chain_ms: float | None) -> dict:
    """chain_ms None: the unrolled graph, one replay a sample; else a chain of k replays a sample."""
    calls = max(1, min(20000, math.ceil((chain_ms or TARGET_MS) / t_ms)))
    k = 1 if chain_ms is None else max(1, math.ceil(TARGET_MS / (calls * t_ms)))
    graph, capture_s = capture(fn, calls)

    def replays():
        for _ in range(k):
            graph.replay()

    started = time.perf_counter()
    samples = [events_ms(replays) / (k * calls) for _ in range(SAMPLES)]
    sampling_s = time.perf_counter() - started
    median = statistics.median(samples)
    return {"median": median, "sd": statistics.stdev(samples) / median, "capture_s": capture_s,
            "sampling_s": sampling_s, "calls": calls, "k": k}


def warmup_effect(fn, t_ms: float) -> dict:
    calls = max(1, min(20000, math.ceil(TARGET_MS / t_ms)))
    graph, _ = capture(fn, calls)
    for _ in range(50):
        graph.replay()
    steady = statistics.median(events_ms(graph.replay) / calls for _ in range(SAMPLES))
    other = torch.empty(1 << 26, device="cuda")
    got = {}
    for _ in range(ROUNDS):
        for state in ("busy", "idle"):
            for w in WARMUPS_MS:
                if state == "idle":
                    torch.cuda.synchronize()
                    time.sleep(IDLE_S)
                else:
                    for _ in range(20):
                        other.zero_()  # ~5 ms of another row's device work
                end = time.perf_counter() + w / 1e3  # calls for W ms, at the host's or the device's pace
                while time.perf_counter() < end:
                    fn()
                    if t_ms > 0.5:  # a long call: the host would queue W ms of them many times over
                        torch.cuda.synchronize()
                torch.cuda.synchronize()
                samples = [events_ms(graph.replay) / calls for _ in range(10)]
                got.setdefault((state, w), []).append(statistics.median(samples) / steady)
    return {k: statistics.median(v) for k, v in got.items()}


def kernels(flaggems: bool):
    x16 = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    y16 = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    mid = torch.randn(1 << 20, device="cuda", dtype=torch.float32)
    yield "torch add 64x64 fp16", lambda: torch.add(x16, y16)
    yield "torch exp 1M fp32", lambda: torch.exp(mid)
    yield "torch exp 4096x4096 fp16", lambda: torch.exp(big)
    if flaggems:
        import flag_gems

        yield "flag_gems add 64x64 fp16", lambda: flag_gems.ops.add(x16, y16)
        yield "flag_gems exp 1M fp32", lambda: flag_gems.ops.exp(mid)
        yield "flag_gems exp 4096x4096 fp16", lambda: flag_gems.ops.exp(big)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flaggems-dir", help="a FlagGems checkout: its src/ is imported")
    args = parser.parse_args()
    if args.flaggems_dir:
        sys.path.insert(0, f"{args.flaggems_dir}/src")
    print(torch.cuda.get_device_name(), torch.__version__)
    ways = [None, *CHAINS_MS]
    for name, fn in kernels(bool(args.flaggems_dir)):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        host = time.perf_counter()
        for _ in range(200):
            fn()
        host_us = (time.perf_counter() - host) / 200 * 1e6
        torch.cuda.synchronize()
        t_ms = per_call_ms(fn)
        got = {w: [] for w in ways}
        for _ in range(ROUNDS):
            for w in ways:
                got[w].append(way(fn, t_ms, w))
        base = statistics.median(r["median"] for r in got[None])
        print(f"\n{name}: {t_ms * 1e3:.2f} us a call (probe), {host_us:.1f} us of host a call")
        print(f"{'way':<14}{'us/call':>9}{'vs unrolled':>12}{'sd %':>7}{'capture ms':>11}{'sampling ms':>12}"
              f"{'calls x k':>11}")
        for w in ways:
            rs = got[w]
            med = statistics.median(r["median"] for r in rs)
            print(f"{'unrolled' if w is None else f'chain {w} ms':<14}{med * 1e3:>9.3f}{med / base:>12.4f}"
                  f"{100 * statistics.median(r['sd'] for r in rs):>7.2f}"
                  f"{1e3 * statistics.median(r['capture_s'] for r in rs):>11.1f}"
                  f"{1e3 * statistics.median(r['sampling_s'] for r in rs):>12.1f}"
                  f"{rs[0]['calls']:>6} x {rs[0]['k']}")
        effect = warmup_effect(fn, t_ms)
        print("after warmup W ms, the next 10 samples' median over the steady one: "
              + "; ".join(f"{state} W={w:g}: {x:.4f}" for (state, w), x in effect.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
