"""`python -m harness.worker FD BACKEND [CACHE_ROOT] [--device N] [--flagtune V] [--facts-file F]
[--preload CHECKOUT ...]`: an A/B side's warm worker (harness.core.forkserver), started by the A/B with the
side's interpreter and environment (or a batch's, one per device thread). FD is its end of the socket to the
A/B, BACKEND the run's backend (its CPU-side set-up is done here once), CACHE_ROOT the dir of the A/B's side
Triton caches (removed here if the A/B died first). Each --preload checkout's package (FlagGems: 4-7 s an
import on an H200 host) is imported here once, under its FlagTune switch, with the device facts of the steps'
device (--device N, else the first visible) stood in for the device, which stays untouched
(harness.providers.flaggems.preload); the facts are read once per --facts-file (kept there by the side's
first worker for the others).
It imports what every step imports, once, touching no device, then forks each step as
`python -m harness ARGS` would run it (its own pytest child forked in turn: harness.sessions.run).

`python -m harness.worker facts BACKEND`: the backend's device facts (Backend.device_facts) as JSON, read
by a worker that preloads, in this process of its own started with only the steps' device visible."""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _step(argv: list[str]) -> int:
    """A forked step: `python -m harness ARGV` in this process (harness.__main__ without its start-up,
    done once by the worker)."""
    from harness import cli
    from harness.child import host
    from harness.core import launch

    if argv[:1] == [host.ARGV0]:  # a measuring host for the A/B's timed steps, not a harness command
        return host.serve(argv[1])
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


def import_once(backend: str) -> None:
    """What each step would import again, and the set-up of `_warm`: the reason for this worker (and for
    tests/gpu/profile_step.py, which becomes one). The device stays untouched."""
    import pytest  # noqa: F401
    import triton  # noqa: F401

    import harness.child.runner  # noqa: F401
    import harness.cli  # noqa: F401
    import harness.sessions.run  # noqa: F401

    _warm(backend)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.worker")
    parser.add_argument("fd", type=int)
    parser.add_argument("backend")
    parser.add_argument("cache_root", nargs="?")
    parser.add_argument("--device", type=int)
    parser.add_argument("--flagtune", default="0")
    parser.add_argument("--preload", action="append", default=[])
    parser.add_argument("--facts-file")
    return parser.parse_args(argv)


def _start_facts(backend: str, device: int | None) -> subprocess.Popen:
    """`python -m harness.worker facts BACKEND` with only the steps' device visible, begun beside this
    worker's imports (it initializes that device, in a process of its own)."""
    import backends
    from harness.core import launch

    chosen = backends.get(backend)
    if device is None and chosen.visibility_key is not None:
        device = chosen.check_available()[0]  # as a step resolves no --device: the first visible
    env = chosen.visibility_env(device, os.environ) if device is not None else dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    # Tied to this worker: one stopped while it imports leaves no reader of the device behind.
    return subprocess.Popen([sys.executable, "-m", "harness.worker", "facts", backend], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=launch.die_with_parent(signal.SIGKILL))


def _facts(backend: str) -> int:
    import backends

    print(json.dumps(backends.get(backend).device_facts()))
    return 0


def _kept_facts(facts_file: str | None) -> dict | None:
    """The device facts an earlier worker of the same side kept in --facts-file, if any."""
    from harness.core import bounded

    try:
        return bounded.read_json(facts_file, "device facts") if facts_file else None
    except (OSError, ValueError):  # none kept yet (written whole or not at all: rundir.atomic_write_json)
        return None


def _read_facts(facts_file: str | None, facts: subprocess.Popen) -> dict | None:
    """What the facts reader said, kept in --facts-file for the side's next worker; None (said) if it failed."""
    from harness.core import rundir

    out, err = facts.communicate()
    if facts.returncode != 0:
        print(f"worker {os.getpid()}: nothing preloaded: the device facts could not be read (exit {facts.returncode}): "
              f"{err.strip().splitlines()[-1:] or ''}; each step imports its operator library itself", file=sys.stderr)
        return None
    read = json.loads(out.strip().splitlines()[-1])
    if facts_file:
        try:
            rundir.atomic_write_json(Path(facts_file), read)
        except OSError:  # the next worker reads them itself
            pass
    return read


def _preload(backend_name: str, checkouts: list[str], flagtune: str, read: dict, scratch: Path) -> None:
    """Each --preload checkout's package imported here, as its steps' children would import it (under
    --flagtune), with the device facts `read` stood in for the device; one that cannot be is said on
    stderr (the worker's log), and its steps import it themselves."""
    import backends
    from harness.providers import flaggems

    backend = backends.get(backend_name)
    for checkout in checkouts:
        start = time.monotonic()
        try:
            done = flaggems.preload(Path(checkout), flagtune, backend.flaggems_vendor,
                                    backend.facts_standing_in(read), scratch)
        except Exception as exc:  # an import that fails, or that asked the device for more than its facts
            print(f"worker {os.getpid()}: {checkout} not preloaded ({type(exc).__name__}: {str(exc)[:300]}); "
                  "its steps import it themselves", file=sys.stderr)
            continue
        print(f"worker {os.getpid()}: {done.package} preloaded from {done.src} (USE_FLAGTUNE={done.flagtune}) in "
              f"{time.monotonic() - start:.1f} s, the device's facts stood in", file=sys.stderr)
    if flaggems.PRELOADED:
        _warm_type_promotion()


def _warm_type_promotion() -> None:
    """FlagGems' pointwise ops promote dtypes through torch._prims_common, whose first call imports sympy
    (3.6 s of a forked FlagGems step's child on an H200 host, torch 2.11): that first call, on CPU tensors."""
    import torch

    try:
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
    except ImportError:  # another torch: the step meets whatever it has
        return
    elementwise_dtypes(torch.zeros(1), type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)


def main() -> int:
    if sys.argv[1] == "facts":
        return _facts(sys.argv[2])
    args = _parse(sys.argv[1:])
    started_by = os.getppid()  # the A/B, or the batch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the A/B forwards a Ctrl-C to the step, not here
    sock = socket.socket(fileno=args.fd)
    from harness.core import deps

    deps.use_deps_dir()  # before the modules below, which import the light packages (pyyaml)
    from harness.core import forkserver, launch, paths

    # SIGTERM once the thread that started this worker is gone, however its process died (serve then
    # stops the running step); armed here, not by a preexec_fn, which a batch's threads make unsafe.
    launch.end_with_starter()
    launch.adopt_orphans()  # a step's orphans come here, and end as each step ends
    # torch's fork-safe device check (NVML, no CUDA init): a step that resolves its device through
    # torch (no vendor CLI) would otherwise initialize CUDA in the process that forks its measuring child.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    facts, reader = None, None  # the device facts an earlier worker kept, else their reader, begun now
    if args.preload:
        try:
            facts = _kept_facts(args.facts_file)
            reader = _start_facts(args.backend, args.device) if facts is None else None
        except Exception as exc:  # no device found, no interpreter to start: the steps import it, as before
            print(f"worker {os.getpid()}: nothing preloaded: the device facts could not be read ({exc})",
                  file=sys.stderr)
    import_once(args.backend)
    import torch

    scratch = paths.make_private_dir("worker")  # the preloaded LibTuner cache's, until each step rebinds it
    try:
        if reader is not None:
            facts = _read_facts(args.facts_file, reader)
        if facts is not None:
            _preload(args.backend, args.preload, args.flagtune, facts, scratch)
        if torch.cuda.is_initialized():  # a flag, not a device call: every forked step would fail to init its device
            print("error: importing the harness initialized CUDA in the warm worker: it cannot fork steps",
                  file=sys.stderr)
            return 1
        code = forkserver.serve(sock, _step)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if code and args.cache_root and os.getppid() != started_by:
        # Stopped as its A/B died (kill -9: it was reparented before the death signal came), its own
        # step ended: the A/B's cache root goes whole, both sides'. Every worker of the A/B removes it
        # once its step ended, so the last one to end leaves nothing, whatever the order.
        shutil.rmtree(args.cache_root, ignore_errors=True)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown of torch and triton (tenths of a second, while the A/B waits
    # for its workers to end): the worker holds nothing that needs it.
    os._exit(code)
