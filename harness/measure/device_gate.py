"""The device gate: one device shared by an A/B's timed repeats and, beside them, the records and passes
of its next ops, whose timings no verdict reads. A lock file (flock) of the A/B's: a timed run holds it
while it times a row (`timing`), a run beside (`beside`, a token-timing run) holds it while its cases run
and lets it go while it compiles, so the device runs one of them at a time and its compilers the CPU-bound
rest beside the timing. A run beside also lowers its CPU priority (`BESIDE_NICENESS`) and leaves
`TIMING_CORES` of the host's cores out of its own (and so out of its compile pools' and statistics'): its
compiles must not take the cores of the host launching the timed graphs.

The lock file names the role of its holder while it is held (`held_by`): a corpus A/B charges a wait to the
op whose step holds the device."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

# A run beside the timing and its compile pools (which inherit it): below the timed host's priority.
BESIDE_NICENESS = 10
TIMING_CORES = 2  # left to the timed host by a run beside it, where it has more than twice as many


TIMED, BESIDE = "timed", "beside"  # a holder's role, written in the lock file while it holds it (held_by)
_NAME_BYTES = 8192  # the most of a holder's name (role, pid, run dir) a reader reads


def holder(gate: str | os.PathLike | None) -> tuple[str, str | None] | None:
    """(the role of the run holding the gate at `gate` now, TIMED or BESIDE; the run dir it named or None);
    None where no run holds it. A corpus A/B charges a wait to the op whose step holds the device."""
    if gate is None:
        return None
    try:
        # Named by an ab.json: open no device, never wait on what it names (a FIFO), read no more than a holder
        # writes.
        if not stat.S_ISREG(os.stat(gate).st_mode):
            return None
        fd = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)
        try:
            role, pid_text, *owner = os.read(fd, _NAME_BYTES).decode().split(" ", 2)
        finally:
            os.close(fd)
        pid = int(pid_text)
        if pid <= 0:  # kill(0 or -1) would ask about a group
            return None
        os.kill(pid, 0)  # one killed holding it left its name: the kernel let the lock go
    except (OSError, ValueError, OverflowError):
        return None
    return (role, owner[0] if owner and owner[0] else None) if role in (TIMED, BESIDE) else None


def held_by(gate: str | os.PathLike | None) -> str | None:
    """The role of the run holding the gate at `gate` now (TIMED or BESIDE), None where no run holds it."""
    found = holder(gate)
    return None if found is None else found[0]


class DeviceGate:
    """The lock at `path`, held by this process in nested sections (`held`) and let go for the length of a
    `released` one inside them. `facts`: how often and how long it waited for the lock and held it.
    `role`: what it holds the lock for (TIMED, BESIDE), written in the lock file while it does."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic, role: str = BESIDE,
                 settle: Callable[[], None] | None = None, owner: str | None = None):
        self.path = Path(path)
        self.owner = owner  # written after role and pid while held: its run dir (which of several steps beside)
        self.clock = clock
        self.role = role
        self.settle = settle  # the device's queued work ends before another takes it (a release)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._depth = 0  # nested held sections
        self._released = 0  # nested released sections inside them
        self._since = 0.0
        self.counts = {"held": 0, "waits": 0, "waited_s": 0.0, "held_s": 0.0, "released": 0}

    def _lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            started = self.clock()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self.counts["waits"] += 1
            self.counts["waited_s"] = round(self.counts["waited_s"] + self.clock() - started, 3)
        self.counts["held"] += 1
        self._since = self.clock()
        with contextlib.suppress(OSError):  # the name is for a reader's accounting: a full disk must not hold the lock
            os.ftruncate(self._fd, 0)
            name = " ".join((self.role, str(os.getpid()), *([self.owner] if self.owner else [])))
            os.pwrite(self._fd, name.encode()[:_NAME_BYTES], 0)

    def _unlock(self) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.counts["held_s"] = round(self.counts["held_s"] + self.clock() - self._since, 3)

    @property
    def holding(self) -> bool:
        return self._depth > 0 and self._released == 0

    @contextlib.contextmanager
    def held(self):
        if self._depth == 0:
            self._lock()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                if self._released == 0:
                    self._unlock()
                # A compile that raised never said it ended: what it let go ends with the section.
                self._released = 0

    def release(self) -> None:
        """Let the lock go until `reacquire` (a compile's start and end): nothing where it is not held."""
        if self._depth == 0:
            return
        if self._released == 0:
            if self.settle is not None:
                self.settle()
            self._unlock()
            self.counts["released"] += 1
        self._released += 1

    def reacquire(self) -> None:
        if self._released == 0:
            return
        self._released -= 1
        if self._released == 0:
            self._lock()

    @contextlib.contextmanager
    def released(self):
        self.release()
        try:
            yield
        finally:
            self.reacquire()

    def close(self) -> None:
        if self._depth and not self._released:
            self._unlock()
        self._depth = self._released = 0
        os.close(self._fd)

    def facts(self) -> dict:
        return dict(self.counts)


class CompileRelease:
    """Triton's JIT hooks letting `gate` go for the length of each compile: installed in front of the hooks
    there (so the gate is let go before another hook waits on a compile pool), and taken out as it goes."""

    def __init__(self, gate: DeviceGate):
        self.gate = gate
        self._previous: dict[str, Callable | None] = {}

    def install(self) -> None:
        from triton import knobs

        self._previous = {"jit_cache_hook": knobs.runtime.jit_cache_hook,
                          "jit_post_compile_hook": knobs.runtime.jit_post_compile_hook}
        knobs.runtime.jit_cache_hook = self._before
        knobs.runtime.jit_post_compile_hook = self._after

    def uninstall(self) -> None:
        from triton import knobs

        for name, hook in (("jit_cache_hook", self._before), ("jit_post_compile_hook", self._after)):
            if getattr(knobs.runtime, name) == hook:  # a bound method: equal, never the same object
                setattr(knobs.runtime, name, self._previous.get(name))
        self._previous = {}

    def _before(self, **kw):
        self.gate.release()
        previous = self._previous.get("jit_cache_hook")
        handled = previous(**kw) if previous is not None else None
        if handled:  # the JIT compiles nothing and calls no post-compile hook
            self.gate.reacquire()
        return handled

    def _after(self, **kw):
        self.gate.reacquire()
        previous = self._previous.get("jit_post_compile_hook")
        return previous(**kw) if previous is not None else None


def open_gate(path: str | None, beside: bool, settle: Callable[[], None] | None = None,
              owner: str | None = None) -> DeviceGate | None:
    """The run's gate, where its spec names one (None: it has the device to itself). A run beside the
    timing lowers its priority here, for itself and the processes it starts, and `settle`s the device each
    time it lets the gate go."""
    if path is None:
        return None
    if not beside:
        return DeviceGate(Path(path), role=TIMED, owner=owner)
    with contextlib.suppress(OSError):
        os.nice(BESIDE_NICENESS)
    with contextlib.suppress(OSError, AttributeError):  # (no affinity outside Linux)
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 2 * TIMING_CORES:  # this thread's, and whatever it starts from now on
            os.sched_setaffinity(0, cpus[:-TIMING_CORES])
    return DeviceGate(Path(path), role=BESIDE, settle=settle, owner=owner)
