"""A measuring host: one process that runs the pytest child of several timed steps one after another,
in one device context, where each would otherwise start a process of its own (an A/B that chunks its
ops: Plan.chunk). Per repeat and side, the A/B forks one host from a warm worker of that side (its
imports done, the device untouched), and each op's timed replay of that repeat hands its child to it.

Each op's step is still a step process of its own (it claims its run dir, writes its inputs, finishes
its outcome: harness.sessions.run); only its child runs here: the step connects to the host's socket
and sends the run dir, the child's environment and its stdout and stderr; the host answers its pid,
runs the child (harness.child.runner.entry) in-process with those descriptors as fds 1 and 2, then
answers the exit code. A step's stop (SIGINT, SIGTERM) goes to the host's pid, where the run's own
handlers stop that run. A run that ends the host (a crash, os._exit) closes the connection: its step
says its child died, as for a forked child, and the A/B starts another host for the chunk's later ops.

What a run may change for the process is put back before the next one: the environment, sys.path,
the working dir, the signal handlers, torch's process-wide settings (child.plugins.torch_state), its
garbage left in reference cycles, the device's cached memory; what had to be put back is written into
that run's run.json (`observed.measuring_host`), with the host's pid and the runs it served before.
A run that changed what cannot be put back (Triton's allocator) is the host's last (`ended_after`); a run
the host would run otherwise than a process of its own (another checkout's package under a preloaded
name, the profiler's timer) it declines, and its step runs the child itself.

`python -m harness.worker` forks `serve` for a step argv of [ARGV0, SOCKET]."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from harness.core import forkserver, launch, rundir

ARGV0 = "--measuring-host"  # a warm worker's step argv [ARGV0, SOCKET] is a host, not a harness command
READY_TIMEOUT_S = 600  # for a host's worker to finish its imports and the host to listen
POLL_S = 0.02
HOST_ENDED = "the measuring host ended during this run"


# --- the host's side -----------------------------------------------------------------------------
class _Stop(Exception):
    """Raised by the host's SIGTERM/SIGINT handler to end its wait for the next run."""


def serve(path: str) -> int:
    """Listen at `path` (bound under another name, then renamed: a step that finds the path finds a
    listening host) and run each connection's child until a SIGTERM or SIGINT finds the host idle."""
    from harness.child import runner
    from harness.child.plugins import heap

    # What the worker imported, out of every collection's walk for the host's life; each run's own objects
    # stay collectable as it ends.
    heap.freeze_imports()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound = f"{path}.{os.getpid()}"
    listener.bind(bound)
    listener.listen()
    os.rename(bound, path)
    idle = [True]
    stopping: list[int] = []

    def stop(signum, frame):
        stopping.append(signum)
        if idle[0]:
            raise _Stop

    handlers = {signum: stop for signum in (signal.SIGINT, signal.SIGTERM)}
    served = 0
    try:
        while not stopping:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            try:
                idle[0] = True
                if stopping:  # it came between the loop's test and here: accept would wait for no one
                    break
                conn, _ = listener.accept()
            except _Stop:
                break
            finally:
                idle[0] = False
            retire = False
            with conn:
                request, fds = forkserver.recv(conn, 2)
                if request is None or len(fds) != 2:
                    for fd in fds:
                        os.close(fd)
                    continue
                run_spec, unreadable = _spec(Path(request["run_dir"]))
                declined = _declined(run_spec) if run_spec is not None else None
                try:
                    forkserver.send(conn, {"declined": declined} if declined else {"pid": os.getpid()})
                except OSError:  # the step is gone already: nothing of its run starts
                    declined = "gone"
                if declined:  # its step runs the child in a process of its own (said there)
                    for fd in fds:
                        os.close(fd)
                    continue
                refused = unreadable or _refusal(Path(request["run_dir"]), run_spec)
                if refused is not None:  # its step says it, exit 2, and nothing of the run starts here
                    with contextlib.suppress(OSError):
                        os.write(fds[0], f"error: {refused}\n".encode())
                    for fd in fds:
                        os.close(fd)
                    with contextlib.suppress(OSError):
                        forkserver.send(conn, {"exit": rundir.EXIT_BAD_INPUT})
                    continue
                code, retire = _run(runner.entry, request, fds, served)
                served += 1
                with contextlib.suppress(OSError):
                    forkserver.send(conn, {"exit": code})
            if retire:  # the A/B starts another host for the chunk's next op (exit 0: not a crash)
                break
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
    return 0


def _spec(run_dir: Path):
    """(the run's spec, None) or (None, why the host cannot read it)."""
    from harness.core import spec as spec_mod

    try:
        return spec_mod.read(run_dir), None
    except (OSError, spec_mod.SpecError) as exc:
        return None, f"the measuring host could not read {run_dir}'s spec ({exc})"


def _declined(run_spec) -> str | None:
    """Why this host leaves a run's child to a process of its own, or None: what the worker preloaded, or an
    earlier run imported here, is not what the run's child would import (another checkout's package under
    the same name, another FlagTune switch); or its timer is the profiler's (whose slowdown stays in a
    process)."""
    from harness.providers import flaggems

    if run_spec.timer == "profiler":
        return "its timer is the profiler's, whose slowdown would stay in the host for the next op"
    misfit = flaggems.preload_misfit(run_spec.flaggems)
    if misfit is not None:
        return misfit
    if run_spec.flaggems is not None:
        found = flaggems.package_dir(Path(run_spec.flaggems.root))
        if found is not None and found[0] in sys.modules and found[0] not in flaggems.PRELOADED:
            return f"{found[0]} was imported by an earlier run in this host, not preloaded by its worker"
    return None


def _refusal(run_dir: Path, run_spec) -> str | None:
    """Why a host does not run this run's child, or None: only timing replays (a record's autotune, IR
    collection and the profiler leave caches, hooks and a slowdown in their process, for the next op)."""
    if run_spec.mode != "replay" or run_spec.passes:
        return (f"the measuring host runs timing-only replays, not {run_dir.name} "
                f"({run_spec.mode}{', with IR and profiling' if run_spec.passes else ''})")
    return None


def _run(entry: Callable[[list[str]], int], request: dict, fds: list[int], served: int) -> tuple[int, bool]:
    """One step's child, here, with `fds` as its stdout and stderr; the process put back after it. (its exit
    code, whether the host ends after it: it changed what cannot be put back)."""
    run_dir = request["run_dir"]
    before = _ProcessState()  # taken before the run, put back after it
    sys.stdout.flush()
    sys.stderr.flush()
    kept = (os.dup(1), os.dup(2))
    for fd, target in zip(fds, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [str(Path(__file__).with_name("__main__.py")), run_dir]  # as an exec'd child sees it
    started = time.monotonic()
    try:
        code = entry([run_dir])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt as exc:
        code = 128 + launch.stopped_by(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, target in zip(kept, (1, 2), strict=True):  # the step's pipes closed here: its readers end
            os.dup2(fd, target)
            os.close(fd)
    put_back = before.restore()
    # What outlived the run and its collection (its imports, the libraries' caches) frozen with the rest: the
    # next run's collections walk only what it makes.
    gc.freeze()
    retire = before.unrestorable()
    with contextlib.suppress(OSError, ValueError):
        rundir.merge_json(Path(run_dir) / rundir.RUN_JSON, {"observed": {"measuring_host": {
            "pid": os.getpid(), "runs_before": served, "seconds": round(time.monotonic() - started, 3),
            "put_back_after": put_back, **({"ended_after": retire} if retire else {})}}})
    return code, bool(retire)


class _ProcessState:
    """What one run may leave changed for the next in the same process, taken before it and put back after."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.path = list(sys.path)
        self.cwd = os.getcwd()
        self.handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
        self.torch = _torch_settings()
        self.triton_allocator = _triton_allocator()

    def restore(self) -> list[str]:
        """Put everything back; the names of what had changed beyond the run's own environment (the
        environment is the step's, sent with each run, so it is put back without a word)."""
        changed = []
        os.environ.clear()
        os.environ.update(self.environ)
        if sys.path != self.path:
            sys.path[:] = self.path
            changed.append("sys.path")
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
            changed.append("working dir")
        for signum, handler in self.handlers.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)  # the run's own stop handlers, expected: not counted
        signal.alarm(0)
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):  # a failed case's frames
            if hasattr(sys, name):
                delattr(sys, name)
        changed += _restore_torch(self.torch)
        # The run's garbage in cycles (its tensors among it) freed now, not by a collection inside the next
        # run's timed loop; a walk of what the run made alone (the imports are frozen: child.plugins.heap).
        gc.collect()
        _release_device_memory()
        return changed


    def unrestorable(self) -> str | None:
        """What the run changed that is not put back, and ends the host: Triton's allocator (FlagGems sets it
        on first need and remembers it did, in module flags of its own; put back, its next run would wait
        on it forever)."""
        if _triton_allocator() != self.triton_allocator:
            return "the run set Triton's allocator (triton.set_allocator)"
        return None


def _triton_allocator():
    """Triton's allocators as set for the process (None: a Triton without set_allocator)."""
    try:
        from triton.runtime import _allocation
    except ImportError:
        return None
    return tuple(getattr(_allocation, name).get() for name in ("_allocator", "_profile_allocator")
                 if hasattr(getattr(_allocation, name, None), "get"))


def _torch_settings() -> dict:
    from harness.child.plugins import torch_state

    return torch_state.snapshot()


def _restore_torch(expected: dict) -> list[str]:
    from harness.child.plugins import torch_state

    found = torch_state.snapshot()
    changed = {name: (value, found[name]) for name, value in expected.items() if found.get(name) != value}
    torch_state.restore(changed)
    return [f"torch {name}" for name in changed]


def _release_device_memory() -> None:
    """The device's cached blocks back to the driver: the next run starts from the caching allocator's
    empty state, as a process of its own would."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --- the step's side -----------------------------------------------------------------------------
class _HostRun:
    """A run handed to a host, with the part of Popen's interface launch.Child uses: its pid is the
    host's, where the step's stop goes (not as a group: the host's other work is not the step's)."""

    def __init__(self, conn: socket.socket, pid: int, on_stderr: Callable[[str], None]):
        self.conn = conn
        self.pid = pid
        self.on_stderr = on_stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # in slices: a signal handler that raises (launch.run's) must get in
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)  # as Popen's, which launch.Child expects
            self.conn.settimeout(POLL_S * 10 if left is None else max(0.001, min(left, POLL_S * 10)))
            try:
                answer, _ = forkserver.recv(self.conn)
            except TimeoutError:
                continue
            except OSError:
                answer = None
            break
        self.conn.close()
        if answer is None:
            self.on_stderr(f"{HOST_ENDED} (pid {self.pid})\n")
            self.returncode = -signal.SIGKILL
        else:
            self.returncode = answer["exit"]
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0.001)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class HostGone(OSError):
    """No host listens at the socket: it ended (a crash in an earlier run) or never started."""


class HostDeclined(Exception):
    """The host leaves this run's child to a process of its own (its reason: _declined)."""


def starter(path: str, environ: dict[str, str], run_dir: Path) -> Callable[..., launch.Child]:
    """A launch.run starter that hands the child of `run_dir` to the host at `path`, with `environ`
    (launch.child_environ: what a child of its own would get), its lines to on_stdout and on_stderr."""

    def start(argv: list[str], *, on_stdout: Callable[[str], None], on_stderr: Callable[[str], None],
              **_ignored) -> launch.Child:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(path)
        except OSError as exc:
            conn.close()
            raise HostGone(f"no measuring host at {path} ({exc})") from exc
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            forkserver.send(conn, {"run_dir": str(run_dir), "env": environ}, (out_write, err_write))
        except OSError as exc:
            for fd in (out_read, err_read):
                os.close(fd)
            conn.close()
            raise HostGone(f"the measuring host at {path} is gone ({exc})") from exc
        finally:
            os.close(out_write)
            os.close(err_write)
        answer, _ = forkserver.recv(conn)
        if answer is not None and answer.get("declined"):
            for fd in (out_read, err_read):
                os.close(fd)
            conn.close()
            raise HostDeclined(answer["declined"])
        streams = [os.fdopen(fd, "r", encoding="utf-8", errors="replace") for fd in (out_read, err_read)]
        if answer is None:
            for stream in streams:
                stream.close()
            conn.close()
            raise HostGone(f"the measuring host at {path} ended before it took the run")
        pumps = tuple(threading.Thread(target=launch.pump, args=(stream, write), daemon=True)
                      for stream, write in zip(streams, (on_stdout, on_stderr), strict=True))
        for thread in pumps:
            thread.start()
        return launch.Child(_HostRun(conn, answer["pid"], on_stderr), own_group=False, pumps=pumps)

    return start


# --- the A/B's side ------------------------------------------------------------------------------
class Host:
    """A side's measuring host for one repeat of a chunk, forked by a warm worker of its own (as a
    prewarmed step is: hosts of different repeats share no interpreter), listening once made. HostGone
    if it never listens."""

    def __init__(self, worker: forkserver.Worker, path: Path, log):
        self.worker = worker
        self.path = path
        self.child = worker.start([ARGV0, str(path)], log, on_stdout=lambda line: None)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not path.exists():
            if self.child.wait(POLL_S) is not None or time.monotonic() > deadline:
                self.close()
                raise HostGone(f"the measuring host did not start listening at {path}; see ab.log")

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.wait(0.001) is None

    def close(self) -> int | None:
        """Stop it (idle: it exits at once) and release its worker; its exit code."""
        code = self.child.stop(forkserver.STEP_GRACE_S)
        self.worker.release()
        with contextlib.suppress(OSError):
            self.path.unlink()
        return code
