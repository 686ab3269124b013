"""Process facts shared by every place that starts or reaps a harness subprocess."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

_PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
except OSError:  # not Linux: no parent-death signal; children are reaped by their parent only
    _LIBC = None


def die_with_parent(signum: int = signal.SIGTERM):
    """A `preexec_fn`: the child gets `signum` when the thread that started it dies, even by
    SIGKILL, so no measurement outlives the run that owns its device. Call Popen from a thread
    that lives as long as the child (the main thread, or the worker that waits on it).

    The child also starts with no signal blocked: a parent holding SIGINT off around Popen would
    otherwise hand that mask through exec, and the child would never see a forwarded Ctrl-C."""

    parent = os.getpid()

    def arm() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os.kill(os.getpid(), signum)

    return arm


def describe_exit(code: int) -> str:
    """`killed by signal 9 (SIGKILL)` for a negative Popen return code, else `exited N`."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code} ({name})"
    return f"exited {code}"


def shell_code(code: int) -> int:
    """An exit code for our own exit: a child killed by signal N becomes 128+N, as a shell says."""
    return 128 - code if code < 0 else code
