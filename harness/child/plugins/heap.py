"""Heap: what the run imported (torch, Triton, the operator library, the benchmark and its conftest) is
frozen out of the garbage collector's view once the cases are collected, before the first one runs.

A collection otherwise walks every object those imports made: ~0.13 s with torch, Triton and pytest
alone on a CPU host, 0.22 s with FlagGems on an H200 host, whose benchmarks call gc.collect() after
every row (15 calls, 3.3 s of a 15-row step). The same walk, triggered by allocations, would land
inside a timed loop. Frozen, a collection walks only what the cases made; their own cycles are freed
as before. The child ends without the interpreter's teardown, so nothing frozen needs unfreezing."""

import gc


class HeapPlugin:
    def pytest_collection_finish(self, session):
        gc.freeze()
