"""How a case is measured: timers, autotune record/replay, IR collection."""
