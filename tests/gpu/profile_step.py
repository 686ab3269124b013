"""Where a forked A/B step's fixed cost goes (issue 45): run by hand on a GPU host (not collected by pytest).

    python3 tests/gpu/profile_step.py --flaggems-dir third_party/FlagGems --out DIR \
        [--op flaggems:exp --op builtin:softmax ...] [--shapes FILE] [--replays 3]

Per op: a fresh `record` (it compiles into the Triton cache its replays read, as an A/B side's: `--triton-cache`;
without it each run compiles into a private cache of its own), then, from this process set
up as a side's warm worker is (harness.worker: its imports and `_warm`), `--replays` timing-only replays
forked as the worker forks them (the checkouts' packages preloaded, unless --no-preload), each step's wall
printed; then one more, its pytest child profiled (DIR/<op>.child.prof), and the child's imports by top-level
package (inclusive seconds of the outermost import, so nested imports are not counted twice) and the
count of modules it imported that the worker had not.
Prints, per op, the median forked replay wall and the tables. No nox needed.

With --setup-steps the record and B's passes are forked from the warm process too, each profiled
(DIR/<op>.record.prof, DIR/<op>.passes-cold.prof): the record as an A/B's (--passes-only: A's passes
ride on it) into a fresh Triton cache, then B's passes in a cold cache of its own, as a side whose
compiler differs compiles every kernel again.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _flaggems_args(flaggems_dirs: list[str]) -> list[str]:
    return [arg for d in flaggems_dirs for arg in ("--flaggems-dir", d)]


def record(op: str, run_dir: Path, args) -> None:
    argv = [sys.executable, "-m", "harness", "record", op, "--run-dir", str(run_dir), "--no-ir",
            "--triton-cache", os.environ["TRITON_CACHE_DIR"],
            *_flaggems_args(args.flaggems_dir), *(["--shapes", args.shapes] if args.shapes else []),
            *(["--dtypes", args.dtypes] if args.dtypes else []), *(["--backend", args.backend] if args.backend else [])]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    print(f"{op}: record exit {done.returncode} in {time.monotonic() - start:.1f} s")
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"{op}: the record failed")


class ImportClock:
    """Inclusive seconds of each outermost import, by top-level package (patched into importlib's
    _find_and_load, which CPython's import statement calls by attribute)."""

    def __init__(self):
        import importlib._bootstrap as bootstrap

        self.bootstrap = bootstrap
        self.original = bootstrap._find_and_load
        self.depth = 0
        self.seconds: collections.Counter[str] = collections.Counter()

    def __enter__(self):
        original = self.original

        def timed(name, import_):
            self.depth += 1
            start = time.perf_counter()
            try:
                return original(name, import_)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.seconds[name.split(".")[0]] += time.perf_counter() - start

        self.bootstrap._find_and_load = timed
        return self

    def __exit__(self, *exc):
        self.bootstrap._find_and_load = self.original


def forked_step(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, exit code) of `python -m harness ARGV` forked from this warm process."""
    from harness import worker

    start = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            log = os.open(os.devnull, os.O_WRONLY)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = worker._step(argv)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return time.monotonic() - start, os.waitstatus_to_exitcode(status)


def profile_child(out: Path, op_name: str, kind: str = "child") -> None:
    """The forked pytest child (harness.sessions.run forks runner.entry) profiled, its imports clocked."""
    from harness.child import runner

    original = runner.entry

    def entry(argv):
        before = set(sys.modules)
        prof = cProfile.Profile()
        clock = ImportClock()
        try:
            with clock:
                prof.enable()
                try:
                    return original(argv)
                finally:
                    prof.disable()
        finally:
            prof.dump_stats(str(out / f"{op_name}.{kind}.prof"))
            new = sorted(set(sys.modules) - before)
            (out / f"{op_name}.imports.json").write_text(json.dumps(
                {"seconds": dict(clock.seconds.most_common()), "new_modules": len(new),
                 "by_package": collections.Counter(m.split(".")[0] for m in new).most_common(30)}, indent=1))

    runner.entry = entry
    return original


def setup_steps(op: str, name: str, record_dir: Path, work: Path, args) -> dict:
    """The A/B's record of `op` and B's passes, forked from this warm process and profiled; their walls."""
    extra = [*_flaggems_args(args.flaggems_dir), *(["--shapes", args.shapes] if args.shapes else []),
             *(["--dtypes", args.dtypes] if args.dtypes else []),
             *(["--backend", args.backend] if args.backend else [])]
    steps = {
        "record": ["record", op, "--run-dir", str(record_dir), "--passes-only", "--triton-cache",
                   os.environ["TRITON_CACHE_DIR"], *extra],
        "passes-cold": ["replay", str(record_dir), "--run-dir", str(work / name / "passes-cold"), "--passes-only",
                        "--triton-cache", str(work / name / "cold-cache")],
    }
    walls = {}
    for kind, argv in steps.items():
        original = profile_child(args.out, name, kind)
        try:
            walls[kind], code = forked_step(argv)
        finally:
            sys.modules["harness.child.runner"].entry = original
        print(f"{op}: {kind} forked, profiled: {walls[kind]:.2f} s (exit {code})")
        if kind == "record" and code not in (0, 1):
            raise SystemExit(f"{op}: the record failed")
        stats = pstats.Stats(str(args.out / f"{name}.{kind}.prof"))
        print(f"--- {op}: {kind} profile, top by cumulative time")
        stats.sort_stats("cumulative").print_stats(40)
        print(f"--- {op}: {kind} profile, top by own time")
        stats.sort_stats("tottime").print_stats(15)
    return walls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", default=None)
    parser.add_argument("--flaggems-dir", action="append", default=[])
    parser.add_argument("--shapes")
    parser.add_argument("--dtypes")
    parser.add_argument("--no-preload", action="store_true", help="the checkout's package left to each step")
    parser.add_argument("--backend")
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--setup-steps", action="store_true", help="the record and passes forked and profiled too")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ops = args.op or ["builtin:softmax", "flaggems:exp", "flaggems:layer_norm"]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="profile_step"))
    scratch = None
    try:
        os.environ["TRITON_CACHE_DIR"] = str(work / "triton")
        os.chdir(REPO)

        records = {}
        for op in ops:
            records[op] = work / op.replace(":", "-") / "record"
            if not args.setup_steps:
                record(op, records[op], args)

        # This process becomes a side's warm worker: the same imports and set-up, no device touched.
        start = time.monotonic()
        import backends
        from harness import worker
        from harness.core import deps, paths

        os.environ.update(backends.get(args.backend or "cuda").child_env)  # as the A/B gives its workers
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        deps.use_deps_dir()
        worker.import_once(args.backend or "cuda")
        import torch

        scratch = paths.make_private_dir("profile")
        if args.flaggems_dir and not args.no_preload:  # as a worker whose steps run FlagGems ops
            backend = args.backend or "cuda"
            facts = worker._read_facts(None, worker._start_facts(backend, None))
            if facts is not None:
                worker._preload(backend, [str(Path(d.partition("=")[2] or d).resolve()) for d in args.flaggems_dir],
                                "0", facts, scratch)
        print(f"warm set-up: {time.monotonic() - start:.1f} s; cuda initialized here: {torch.cuda.is_initialized()}")

        summary = {}
        for op in ops:
            name = op.replace(":", "-")
            if args.setup_steps:
                summary[op] = setup_steps(op, name, records[op], work, args)
            walls = []
            for i in range(args.replays):
                argv = ["replay", str(records[op]), "--run-dir", str(work / name / f"r{i}"), "--timing-only",
                        "--triton-cache", os.environ["TRITON_CACHE_DIR"]]
                wall, code = forked_step(argv)
                walls.append(wall)
                print(f"{op}: forked replay {i + 1}: {wall:.2f} s (exit {code})")
            original = profile_child(args.out, name)
            try:
                argv = ["replay", str(records[op]), "--run-dir", str(work / name / "profiled"), "--timing-only",
                        "--triton-cache", os.environ["TRITON_CACHE_DIR"]]
                wall, code = forked_step(argv)
            finally:
                sys.modules["harness.child.runner"].entry = original
            print(f"{op}: profiled forked replay: {wall:.2f} s (exit {code})")
            run_json = json.loads((work / name / "r0" / "run.json").read_text())
            summary[op] = {**summary.get(op, {}), "walls": walls, "median": statistics.median(walls), "profiled": wall,
                           "rows": run_json.get("outcome", {}).get("rows_done")}
            imports = json.loads((args.out / f"{name}.imports.json").read_text())
            print(f"--- {op}: child imports (inclusive s, outermost): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in list(imports["seconds"].items())[:15]))
            print(f"    new modules in the child: {imports['new_modules']}: {imports['by_package'][:12]}")
            for which in ("child",):
                print(f"--- {op}: {which} profile, top by cumulative time")
                stats = pstats.Stats(str(args.out / f"{name}.{which}.prof"))
                stats.sort_stats("cumulative").print_stats(35)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary, indent=1))
    finally:  # a step that failed (SystemExit) leaves no work dir behind
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
