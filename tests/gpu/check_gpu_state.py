"""GPU check (run on a CUDA host with nvidia-ml-py, not collected by pytest): every row of a real
record carries the device's state before and after its measurement, read through NVML.

    python tests/gpu/check_gpu_state.py [--device N] [--ab-repeats R]

Step 1 opens the monitor the child would open (backends.cuda's) and prints the device NVML found
next to the one torch sees: they must be the same card (NVML numbers devices its own way, so the
monitor finds the child's device by UUID). Step 2 records softmax on four small shapes
(`python -m harness record softmax --backend cuda ...`, well under a minute) and prints each row's
gpu_state before -> after and its markers (a CLOCK_THROTTLED marker is legitimate if the card
really was thermally or power limited; it is printed, not failed). Exit 0 and a last line PASS when
the record succeeded, no line said "GPU state not recorded", run.json says recorded, and every row
has clocks, temperature, power, power cap and a throttle-reason list on both sides.

With --ab-repeats R, step 3 runs an A/B of the default plan (FP fusion) on mm and softmax with big
bf16 shapes (R=7: about 5 minutes on an H200, long enough to heat the card and reach its power
cap) and prints, per side, the range of every row's clocks, temperature and power, which slowdown
counters grew, and the CLOCK_THROTTLED rows with their SM clock before -> after; then the A/B's
headline lines. Printed, not failed: it is the evidence for which slowdowns a row should be flagged for.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

AB_SHAPES = ("mm:\n  shapes: [[8192, 8192, 8192], [4096, 4096, 4096]]\n  dtypes: [bf16]\n"
             "softmax:\n  shapes: [[8192, 8192], [32768, 4096]]\n  dtypes: [bf16]\n")
SHAPES = "softmax:\n  shapes: [[1024, 1024], [4096, 4096], [8192, 8192], [64, 512]]\n  dtypes: [bf16]\n"
REQUIRED = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "power_cap_w", "throttle_reasons")


def brief(s: dict) -> str:
    return (f"sm {s['sm_clock_mhz']} MHz mem {s['mem_clock_mhz']} MHz {s['temperature_c']} C "
            f"{s['power_w']}/{s['power_cap_w']} W reasons={','.join(s['throttle_reasons'] or []) or '-'} "
            f"counters={s.get('slowdown_counters')}")


def step1(device: int) -> bool:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(device)  # as the child sees it: one device, index 0
    import torch

    import backends

    monitor = backends.get("cuda").monitor()
    import pynvml

    print(f"step 1: monitor {monitor.source}; NVML device {pynvml.nvmlDeviceGetName(monitor.handle)!r}, "
          f"torch device {torch.cuda.get_device_name(0)!r}")
    print(f"step 1: sample {brief(monitor.sample())}")
    return True


def step2(device: int) -> bool:
    with tempfile.TemporaryDirectory(prefix="zl_gpu_state_") as tmp:
        shapes = Path(tmp) / "shapes.yaml"
        shapes.write_text(SHAPES)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        proc = subprocess.run([sys.executable, "-m", "harness", "record", "softmax", "--backend", "cuda",
                               "--device", str(device), "--shapes", str(shapes), "--out", tmp, "--no-ir"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        print(proc.stdout)
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            print(f"step 2: record exited {proc.returncode}")
            return False
        run_dir = Path(next(ln for ln in reversed(proc.stdout.splitlines()) if "run dir: " in ln)
                       .split("run dir: ", 1)[1].strip())
        rows = json.loads((run_dir / "results.json").read_text())["rows"]
        status = json.loads((run_dir / "run.json").read_text())["observed"].get("gpu_state")
    print(f"step 2: run.json observed.gpu_state = {status}")
    ok = "GPU state not recorded" not in proc.stdout and bool(status and status.get("recorded")) and bool(rows)
    for r in rows:
        state = r.get("gpu_state")
        complete = bool(state) and all(state[side].get(k) is not None for side in ("before", "after") for k in REQUIRED)
        ok &= complete and r["status"] == "SUCCESS"
        print(f"row {r['case']} {r['status']} candidate {r['candidate_ms']} ms")
        if state:
            print(f"    before: {brief(state['before'])}\n    after:  {brief(state['after'])}")
        print(f"    markers: {r['markers'] or '-'}{'' if complete else '   <-- gpu_state missing or incomplete'}")
    return ok


def _span(values) -> str:
    values = [v for v in values if v is not None]
    return f"{min(values)}..{max(values)}" if values else "-"


def step3(device: int, repeats: int) -> bool:
    with tempfile.TemporaryDirectory(prefix="zl_gpu_state_ab_") as tmp:
        shapes = Path(tmp) / "shapes.yaml"
        shapes.write_text(AB_SHAPES)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "harness", "ab", str(REPO / "ops" / "ab_default.yaml"),
                               "--ops", "mm", "softmax", "--shapes", str(shapes), "--dtypes", "bf16",
                               "--repeats", str(repeats), "--device", str(device), "--out", tmp],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=580)
        wall = time.monotonic() - start
        print(proc.stdout[-4000:])
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
        print(f"step 3: A/B wall {wall:.0f} s, exit {proc.returncode}")
        by_side: dict[str, list[dict]] = {}
        for results in sorted(Path(tmp).rglob("results.json")):
            step = results.parent.parent.name  # <ab dir>/<op>/{A-record,A-passes,A-1,...}/<run>/results.json
            side = "A record" if step == "A-record" else step.split("-")[0]
            by_side.setdefault(side, []).extend(json.loads(results.read_text())["rows"])
    for side, rows in sorted(by_side.items()):
        states = [r["gpu_state"][k] for r in rows if r.get("gpu_state") for k in ("before", "after")]
        grew = collections.Counter(
            name for r in rows if r.get("gpu_state")
            for name, n in (r["gpu_state"]["after"].get("slowdown_counters") or {}).items()
            if n > (r["gpu_state"]["before"].get("slowdown_counters") or {}).get(name, n))
        throttled = [(r["case"], m) for r in rows for m in r["markers"] if m.startswith("CLOCK_THROTTLED")]
        print(f"side {side}: {len(rows)} rows; sm {_span(s['sm_clock_mhz'] for s in states)} MHz, "
              f"mem {_span(s['mem_clock_mhz'] for s in states)} MHz, {_span(s['temperature_c'] for s in states)} C, "
              f"power {_span(s['power_w'] for s in states)} W of cap {_span(s['power_cap_w'] for s in states)} W; "
              f"counters grew in {dict(grew) or 'no row'}; CLOCK_THROTTLED rows {len(throttled)}")
        for case, m in throttled:
            print(f"    {case}: {m}")
    return proc.returncode == 0 and bool(by_side)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--ab-repeats", type=int, default=0, help="also step 3, an A/B of this many repeats")
    args = parser.parse_args()
    device = args.device
    ok = step2(device) and (not args.ab_repeats or step3(device, args.ab_repeats))
    ok = ok and step1(device)  # the runs first: step 1 narrows this process's visible devices
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
