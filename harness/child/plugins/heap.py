"""Heap: what the run imported (torch, Triton, the operator library, the benchmark and its conftest) is
frozen out of the garbage collector's view once the cases are collected, before the first one runs; and
what the collections cost the run (run.json `observed.gc`).

A collection otherwise walks every object those imports made: ~0.13 s with torch, Triton and pytest
alone on a CPU host, 0.22 s with FlagGems on an H200 host, whose benchmarks call gc.collect() after
every row (15 calls, 3.3 s of a 15-row step). The same walk, triggered by allocations, would land
inside a timed loop. Frozen, a collection walks only what the cases made; their own cycles are freed
as before. The child ends without the interpreter's teardown, so nothing frozen needs unfreezing. In a
measuring host (harness.child.host), which froze what its worker imported as it started, a run freezes
nothing: what it made (its pytest session, plugins, timer) is freed as it ends, not kept for the host's life.
What is left to walk was counted: a record or passes step's own heap (its compiles, lazy imports, the
libraries' caches) still made each of a FlagGems step's collections cost ~0.2 s, 2.5-10.6 s a step on an
H100 (as of deeb708). So in a process of its own, what survives each full collection is frozen too: every
object is walked by at most one full collection, the next walks only what was made since. An object
frozen while alive is still freed by its reference count; one that becomes garbage in a cycle later is
kept until the process ends with its run (never in a host, which freezes only as a run ends)."""

import collections
import gc
import time

from harness.core import rundir


class HeapPlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.collections: collections.Counter[str] = collections.Counter()  # by generation
        self.seconds: collections.Counter[str] = collections.Counter()
        self._started: float | None = None
        self.freeze_survivors = False  # this process ends with its run (not a host)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = str(info.get("generation"))
            self.collections[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started
            self._started = None
            if self.freeze_survivors and generation == "2":
                gc.freeze()

    def pytest_configure(self, config):
        gc.callbacks.append(self._on_gc)

    def pytest_collection_finish(self, session):
        if gc.get_freeze_count() == 0:
            gc.freeze()
            self.freeze_survivors = True

    def pytest_sessionfinish(self, session):
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"gc": {
            "collections": dict(sorted(self.collections.items())),
            "seconds": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
            "frozen": gc.get_freeze_count()}}})
