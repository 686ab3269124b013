"""GPU check (run on a CUDA host, not collected by pytest): an op that cannot be graph-captured
falls back to direct timing, and the process's RNG still works afterwards.

    python tests/gpu/check_capture_rng.py

Case 1 is the harness's own path (Timer.measure_pair): the candidate calls .item() inside the
capture, which CUDA refuses; the row must fall back (TIMER_FALLBACK) and torch.randn must work
after it. Case 2 is the same refusal captured the way the harness did before (the default
generator's state forked, not swapped): it shows whether this torch build leaves the generator
stuck, i.e. whether case 1 guards against something real here. Exit 0 when case 1 passes.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import backends  # noqa: E402
from harness.measure.timers import Timer  # noqa: E402


def uncapturable():
    x = torch.randn(1024, device="cuda")  # RNG inside the capture registers the generator first
    return x.sum().item()  # a host sync: not permitted while the stream is capturing


def randn_works() -> str:
    try:
        torch.randn(4, device="cuda").sum().item()
        return "ok"
    except Exception as exc:  # noqa: BLE001 (the error is the finding)
        return f"FAILS: {str(exc).strip().splitlines()[0]}"


def main() -> int:
    marks = []
    timer = Timer(backends.get("cuda"), "graph", 5, 20, marks.append)
    timed = timer.measure_pair("check_capture_rng", {
        "baseline": lambda: torch.randn(1024, device="cuda"), "candidate": uncapturable})
    after = randn_works()
    print(f"case 1 (harness): timer={timed.timer} markers={marks} torch.randn after: {after}")
    ok = timed.timer == "direct" and any(m.startswith("TIMER_FALLBACK") for m in marks) and after == "ok"

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.random.fork_rng(devices=[0], device_type="cuda"), torch.cuda.graph(graph):
            uncapturable()
    except Exception as exc:  # noqa: BLE001
        print(f"case 2 (fork_rng only): capture failed as expected: {str(exc).strip().splitlines()[0][:120]}")
    print(f"case 2 (fork_rng only): torch.randn after: {randn_works()}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
