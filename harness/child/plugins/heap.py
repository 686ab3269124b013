"""Heap: what the run imported (torch, Triton, the operator library, the benchmark and its conftest) is
frozen out of the garbage collector's view once the cases are collected, before the first one runs.

A collection otherwise walks every object those imports made: ~0.13 s with torch, Triton and pytest
alone on a CPU host, 0.22 s with FlagGems on an H200 host, whose benchmarks call gc.collect() after
every row (15 calls, 3.3 s of a 15-row step). The same walk, triggered by allocations, would land
inside a timed loop. Frozen, a collection walks only what the cases made; their own cycles are freed
as before. The child ends without the interpreter's teardown, so nothing frozen needs unfreezing. In a
measuring host (harness.child.host), which froze what its worker imported as it started, a run freezes
nothing: what it made (its pytest session, plugins, timer) is freed as it ends, not kept for the host's life."""

import gc


class HeapPlugin:
    def pytest_collection_finish(self, session):
        if gc.get_freeze_count() == 0:
            gc.freeze()
