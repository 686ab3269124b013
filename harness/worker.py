"""`python -m harness.worker FD BACKEND [CACHE_ROOT]`: an A/B side's warm worker (harness.core.forkserver),
started by the A/B with the side's interpreter and environment (or a batch's, one per device thread);
FD is its end of the socket to the A/B,
BACKEND the run's backend (its CPU-side set-up is done here once), CACHE_ROOT the dir of the A/B's side
Triton caches (removed here if the A/B died first).
It imports what every step imports, once, touching no device, then forks each step as
`python -m harness ARGS` would run it (its own pytest child forked in turn: harness.sessions.run)."""

import os
import shutil
import signal
import socket
import sys
from pathlib import Path


def _step(argv: list[str]) -> int:
    """A forked step: `python -m harness ARGV` in this process (harness.__main__ without its start-up,
    done once by the worker)."""
    from harness import cli
    from harness.core import launch

    sys.argv = [str(Path(cli.__file__).with_name("__main__.py")), *argv]  # as `python -m harness ARGV` has it
    launch.adopt_orphans()  # as the step's process does: what its child leaves running ends with it
    try:
        return cli.main(argv)
    except KeyboardInterrupt as exc:
        signum = launch.stopped_by(exc)
        print(f"interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    finally:
        launch.end_orphans()


# What a step's first kernel (a cache hit too) and its pytest session import, beyond the above: on an
# H200 host, gluon alone took 0.17 s of a 2 s repeat. Missing ones (another Triton) are the step's to import.
STEP_MODULES = ("triton.compiler.compiler", "triton.experimental.gluon", "numpy.ma", "numpy.random")


def _warm(backend: str) -> None:
    """Done once here instead of in every step: what depends only on the installed packages and
    touches no device. Triton's cache key (a hash over its sources and libtriton, which every
    step's first compile or cache lookup computes: 0.37 s on an H200 host), the compiler identity
    each run records, the modules a step imports (pytest's built-in plugins among them, and those
    torch's assert_close imports at its first call), and the backend's own (Backend.warm_fork)."""
    import importlib

    import torch
    from _pytest.config import default_plugins
    from triton.runtime import cache

    import backends
    from harness.core import identity

    triton_key = getattr(cache, "triton_key", None)  # Triton's own, lru-cached; a fork may not have it
    if triton_key is not None:
        triton_key()
    identity.compiler_identity()
    # The correctness check of every built-in op: torch's assert_close imports its DTensor support at its
    # first call (torch 2.13: torch.distributed.tensor, sympy, torch.fx; 2.6 s of a 4.3 s forked step on
    # a loaded 2-core host). On CPU tensors: the device stays untouched.
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
    warm_fork = backends.get(backend).warm_fork
    if warm_fork is not None:
        warm_fork()
    for name in (*STEP_MODULES, *(f"_pytest.{plugin}" for plugin in default_plugins)):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def main() -> int:
    started_by = os.getppid()  # the A/B, or the batch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the A/B forwards a Ctrl-C to the step, not here
    sock = socket.socket(fileno=int(sys.argv[1]))
    from harness.core import deps, forkserver, launch

    # SIGTERM once the thread that started this worker is gone, however its process died (serve then
    # stops the running step); armed here, not by a preexec_fn, which a batch's threads make unsafe.
    launch.end_with_starter()
    launch.adopt_orphans()  # a step's orphans come here, and end as each step ends
    # torch's fork-safe device check (NVML, no CUDA init): a step that resolves its device through
    # torch (no vendor CLI) would otherwise initialize CUDA in the process that forks its measuring child.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    deps.use_deps_dir()
    # What each step would import again: the reason for this worker. The device stays untouched.
    import pytest  # noqa: F401
    import torch
    import triton  # noqa: F401

    import harness.child.runner  # noqa: F401
    import harness.cli  # noqa: F401
    import harness.sessions.run  # noqa: F401

    _warm(sys.argv[2])
    if torch.cuda.is_initialized():  # a flag, not a device call: every forked step would fail to init its device
        print("error: importing the harness initialized CUDA in the warm worker: it cannot fork steps",
              file=sys.stderr)
        return 1
    code = forkserver.serve(sock, _step)
    if code and len(sys.argv) > 3 and os.getppid() != started_by:
        # Stopped as its A/B died (kill -9: it was reparented before the death signal came), its own
        # step ended: the A/B's cache root goes whole, both sides'. Every worker of the A/B removes it
        # once its step ended, so the last one to end leaves nothing, whatever the order.
        shutil.rmtree(sys.argv[3], ignore_errors=True)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown of torch and triton (tenths of a second, while the A/B waits
    # for its workers to end): the worker holds nothing that needs it.
    os._exit(code)
