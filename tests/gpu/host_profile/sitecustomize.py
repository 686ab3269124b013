"""Put on PYTHONPATH by `tests/gpu/profile_hosts.py` (never by the product): where ZL_BENCH_HOST_PROFILE names a
dir, each run a measuring host serves (harness.child.host._run: one op's timed replay in a chunk) is profiled
with cProfile into `<dir>/<its run dir's name>@<its step's>-<pid>.prof`. Loaded at every interpreter's start, it
imports only harness.child.host (no torch) and only where the variable is set."""

import os
import sys
from pathlib import Path

_OUT = os.environ.get("ZL_BENCH_HOST_PROFILE")
if _OUT:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: harness importable
    import cProfile

    from harness.child import host as _host

    _served = _host._run

    def _profiled_run(entry, request, fds, served):
        profile = cProfile.Profile()
        try:
            return _served(lambda argv: profile.runcall(entry, argv), request, fds, served)
        finally:
            # Named by the step too: a repeat's A and B runs of one op start in the same second.
            run_dir = Path(request["run_dir"])
            profile.dump_stats(str(Path(_OUT) / f"{run_dir.name}@{run_dir.parent.name}-{os.getpid()}.prof"))

    _host._run = _profiled_run
