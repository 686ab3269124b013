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
What is left to walk is counted (run.json `observed.gc`, with `imports_frozen`: whether this process froze
its imports; not the count of frozen objects, which CPython counts by walking them: ~40 ms of every run with
torch and Triton imported). A process of its own once froze only where nothing was frozen yet, which is never
on CPython 3.12 (as of 504efe4): its record and passes steps' collections walked every import, 2.5-10.6 s a
FlagGems step on an H100, while the hosts' repeats took 0.03 s for the same 15 collections."""

import collections
import gc
import time

from harness.core import rundir

# Whether this process froze its imports already: a measuring host as it starts (the runs it serves then
# freeze nothing of their own: they are freed as they end, not kept for the host's life), else its first
# run. Not read off gc.get_freeze_count(): CPython 3.12 starts with objects frozen (375), so a process of
# its own looked frozen and froze nothing, every collection walking the imports (0.2 s each on an H100).
_imports_frozen = False


def freeze_imports() -> None:
    """What this process imported, out of every collection's walk for its life."""
    global _imports_frozen
    _imports_frozen = True
    gc.freeze()


class HeapPlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.collections: collections.Counter[str] = collections.Counter()  # by generation
        self.seconds: collections.Counter[str] = collections.Counter()
        self._started: float | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = str(info.get("generation"))
            self.collections[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started
            self._started = None

    def pytest_configure(self, config):
        gc.callbacks.append(self._on_gc)

    def pytest_collection_finish(self, session):
        if not _imports_frozen:
            freeze_imports()

    def pytest_sessionfinish(self, session):
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"gc": {
            "collections": dict(sorted(self.collections.items())),
            "seconds": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
            "imports_frozen": _imports_frozen}}})
