"""A warm worker: one process per A/B side, started with that side's interpreter and environment,
that imports once what every step imports (torch, triton, pytest, the harness) and forks each step
from that clean state. The device is never touched in the worker (CUDA cannot be forked once
initialized): each forked step initializes it, compiles into its side's cache, measures, writes its
run dir and exits, as a fresh process would, and nothing of one step reaches the next.

A batch forks each op's record or replay the same way, from one worker per device thread.

The parent (`Worker`) and the worker (`serve`) talk over a socket pair: a step request carries the
step's argv and its stdout/stderr descriptors (and, for a batch op, the op dir's `.running` file, whose
lock the step holds while it runs: harness.core.opguard.hold, and its start gate, where the step waits
for the batch's go before it runs anything: opguard.passed_gate); the worker answers with the step's pid
(the leader of its own session, so the parent signals its group directly) and then its exit code. A
worker that dies mid-step leaves a closed socket: the parent kills the step's group and says so (`died`).

Lifetime: the worker stays in its parent's process group (a group kill from outside, a corpus op's
timeout, takes it too) and gets SIGTERM when the thread that started it ends, however its process
died (launch.end_with, armed by the worker itself: a batch starts workers from threads, where a
`preexec_fn` is unsafe); on SIGTERM it stops the running step as the parent would (SIGTERM, then
SIGKILL after `STEP_GRACE_S`) and exits. A step gets SIGTERM when the worker dies. Ctrl-C is the
parent's to forward: the worker ignores it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from harness.core import launch, opguard

STEP_GRACE_S = 30  # for a step stopped by its worker's SIGTERM to write its results
MAX_MESSAGE = 1 << 20
CLOSE_WAIT_S = 5  # for a worker whose socket closed to exit by itself
START_TIMEOUT_S = 600  # for the worker's imports (torch on a loaded host takes tens of seconds)


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def recv(sock: socket.socket, fds: int = 0) -> tuple[dict | None, list[int]]:
    """(the next message, the descriptors it carried); (None, []) once the other end is gone, closed or
    reset (a parent that ended with a request unread: its spare warm workers, once its steps failed)."""
    try:
        data, received, _, _ = socket.recv_fds(sock, MAX_MESSAGE, fds)
    except ConnectionResetError:
        return None, []
    return (json.loads(data) if data else None), received


# --- the worker's side ---------------------------------------------------------------------------
class _Stop(Exception):
    """Raised by the worker's SIGTERM handler to end its wait for the next request."""


def serve(sock: socket.socket, step: Callable[[list[str]], int]) -> int:
    """Fork `step(argv)` for each request until the parent closes the socket (0) or a SIGTERM
    stops the worker (128 + SIGTERM, once the running step ended)."""
    running: list[int] = []
    stopping: list[int] = []
    idle = [False]  # waiting for a request: the only place a stop breaks in

    def stop(signum, frame):
        stopping.append(signum)
        if idle[0]:
            raise _Stop
        if running:
            launch.signal_group(running[0], signal.SIGTERM)
            signal.alarm(STEP_GRACE_S)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, lambda signum, frame: running and launch.signal_group(running[0], signal.SIGKILL))
    try:
        send(sock, {"ready": os.getpid()})
    except OSError:  # released while it imported (an A/B that ended, or a spare never needed)
        return 0
    while not stopping:
        try:
            idle[0] = True
            request, fds = recv(sock, 3)
        except _Stop:
            break
        finally:
            idle[0] = False
        if request is None:
            return 0
        arm = launch.die_with_parent()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            def call(argv: list[str] = request["argv"], guard: str | None = request.get("guard"),
                     owner: int | None = request.get("owner"), gate: int | None = (fds[2:] or [None])[0]) -> int:
                sock.close()  # the parent must see this end close when the worker dies, not when the step does
                if gate is not None and not opguard.passed_gate(gate):
                    return 128 + signal.SIGTERM  # its starter stopped before the step's start: nothing of it runs
                # Held until this step and its forked child are gone: a resume tells a live op from a stale file.
                held = guard and opguard.hold(Path(guard), owner, [sys.executable, "-m", "harness", *argv])
                try:
                    return step(argv)
                finally:
                    if held:
                        held.close()

            launch.in_fork(call, dict(os.environ), os.getcwd(), arm, True, fds[0], fds[1])
        running.append(pid)
        if stopping:  # the stop came between the request and the fork
            launch.signal_group(pid, signal.SIGTERM)
            signal.alarm(STEP_GRACE_S)
        for fd in fds:
            os.close(fd)
        send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        signal.alarm(0)
        running.clear()
        launch.end_orphans()  # what the step left running and was reparented here
        try:
            send(sock, {"exit": os.waitstatus_to_exitcode(status)})
        except OSError:
            break  # the parent is gone: nobody asks for more
    return 128 + signal.SIGTERM


# --- the parent's side ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Preload:
    """The operator libraries a worker imports once for its steps (harness.providers.flaggems.preload):
    FlagGems checkouts, under the FlagTune switch its steps run with, with the facts of the device its
    steps run on (None: the first visible) stood in for the device."""

    checkouts: tuple[str, ...]
    flagtune: str = "0"
    device: int | None = None
    # Where the device facts are kept for the next worker of the same side once one has read them (an A/B's
    # prewarmed workers, one a step: one reading of the device instead of one each); None: each reads them.
    facts_file: str | None = None

    def to_argv(self) -> list[str]:
        """harness.worker's options for it."""
        if not self.checkouts:
            return []
        return [*(["--device", str(self.device)] if self.device is not None else []), "--flagtune", self.flagtune,
                *(["--facts-file", self.facts_file] if self.facts_file else []),
                *(arg for checkout in self.checkouts for arg in ("--preload", checkout))]


# How a worker ends when the thread that began it ends (launch.end_with's SIGTERM): before its handler is set,
# or through it.
_ENDED_BY_ITS_THREAD = (-signal.SIGTERM, 128 + signal.SIGTERM)


class WorkerDied(RuntimeError):
    """The worker is gone: it never came up, or it died."""


class _Step:
    """A step the worker forked, with the part of Popen's interface launch.Child uses for a child
    that leads its own group (signals go to the group: Child.send). Waited for from two threads at
    once in a batch (its device's, and a stop's): one reads the worker's answer, the other waits for it."""

    def __init__(self, worker: Worker, pid: int):
        self.worker = worker
        self.pid = pid
        self.returncode: int | None = None
        self._reading = threading.Lock()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._reading.acquire(timeout=-1 if deadline is None else timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        try:
            if self.returncode is None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.returncode = self.worker.exit_code(self.pid, left)
        finally:
            self._reading.release()
        return self.returncode


class Worker:
    """The parent's handle on one side's warm worker, started by `begin` or on first use, and again after it died."""

    def __init__(self, python: str, log: IO[str], env: Mapping[str, str], pythonpath: str | None,
                 cache_root: str | None, backend: str, preload: Preload | None = None):
        self.python = python
        self.preload = preload  # what it imports once beyond the harness (a FlagGems checkout's package)
        self.cache_root = cache_root  # the A/B's side caches: removed by the worker if the A/B dies first
        self.backend = backend  # whose CPU-side set-up the worker does once (backends.Backend.warm_fork)
        self.log = log
        self.env = dict(env)
        self.pythonpath = pythonpath
        self.child: launch.Child | None = None
        self.sock: socket.socket | None = None
        self.ready = False  # it said so: its imports are done
        self.died = False  # during the last step: the step was killed with it
        self.ended_unready: int | None = None  # the exit code of one that ended before it said it was ready
        self.served = 0  # steps it forked

    def begin(self) -> None:
        """Start the worker without waiting for its imports (the A/B starts both sides' at once,
        B's importing while A records); its first step waits for it."""
        if self.child is None:
            self._spawn()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = [self.python, "-m", "harness.worker", str(theirs.fileno()), self.backend,
                    *([self.cache_root] if self.cache_root else []), *(self.preload.to_argv() if self.preload else [])]
            # In our group: a group kill from outside (a corpus op's timeout) takes the worker too.
            self.child = launch.start(argv, log=self.log, env={**self.env, launch.END_WITH_ENV: str(os.getpid())},
                                      pythonpath=self.pythonpath, pass_fds=(theirs.fileno(),), own_group=False,
                                      with_parent=False)
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False

    def _begin_again(self) -> None:
        """A new worker in place of one ended by the end of the thread that began it (launch.end_with) before it
        served a step: a record job's spare, begun in another job's thread (ab.runner._Records). Begun again, by
        this thread, once."""
        self.log.write("worker: its starting thread ended before it served; begun again\n")
        self.close()
        self._spawn()

    def _ended_by_its_thread(self) -> bool:
        return not self.served and self.child.proc.poll() in _ENDED_BY_ITS_THREAD

    def wait_ready(self) -> None:
        """Wait for a begun worker's imports to be done; WorkerDied (and it is closed: its step starts
        a new one) if it never says so."""
        if self.child is not None and not self.ready:
            self._await_ready()

    def _await_ready(self) -> None:
        self.sock.settimeout(START_TIMEOUT_S)
        try:
            ready, _ = recv(self.sock)
        except OSError as exc:  # TimeoutError included
            ready = None
            self.log.write(f"worker: no word from it ({exc})\n")
        self.sock.settimeout(None)
        if ready is None:
            code = self.close()
            self.ended_unready = code
            raise WorkerDied(f"the warm worker of {self.python} did not start ({launch.describe_exit(code)}; "
                             "see the log)")
        self.ready = True

    def start(self, argv: list[str], log: IO[str], on_stdout: Callable[[str], None],
              guard: Path | None = None, gate: int | None = None) -> launch.Child:
        """Fork a step running `python -m harness ARGV`: its stdout to `on_stdout` and `log`, its
        stderr to `log`; holding `guard`'s lock (a batch op's `.running`) while it runs, in this
        process's name; first waiting at `gate` for its starter's go, when given (opguard.passed_gate).
        WorkerDied when there is no live worker to fork it."""
        # One that died while importing is not started again here: it says why below, once. One ended by the end
        # of the thread that began it is, whether found dead now or while this waits for its word (it can end
        # after saying it was ready).
        if self.child is None:
            self._spawn()
        elif (self.ready or self._ended_by_its_thread()) and self.child.proc.poll() is not None:
            if self.served:
                self.close()
                self._spawn()
            else:
                self._begin_again()
        if not self.ready:
            try:
                self._await_ready()
            except WorkerDied:
                if self.ended_unready not in _ENDED_BY_ITS_THREAD:
                    raise
                self._begin_again()
                self._await_ready()
        self.died = False
        log.write(f"\n$ (forked by worker {self.child.pid}) {' '.join(argv)}\n")
        log.flush()
        read, write = os.pipe()
        try:
            send(self.sock, {"argv": argv, **({"guard": str(guard), "owner": os.getpid()} if guard else {})},
                  (write, log.fileno(), *([gate] if gate is not None else [])))
        except OSError as exc:
            os.close(read)
            raise WorkerDied(f"the warm worker is gone ({exc})") from exc
        finally:
            os.close(write)
        answer, _ = recv(self.sock)
        stdout = os.fdopen(read, "r", encoding="utf-8", errors="replace")
        if answer is None:
            stdout.close()
            self.died = True
            raise WorkerDied("the warm worker died before it forked the step")
        self.served += 1
        pump = threading.Thread(target=launch.pump, args=(stdout, launch.teed(log, on_stdout)), daemon=True)
        pump.start()
        return launch.Child(_Step(self, answer["pid"]), own_group=True, pumps=(pump,))

    def exit_code(self, pid: int, timeout: float | None) -> int:
        """The step's exit code, as Popen.wait gives it (subprocess.TimeoutExpired after `timeout`). A
        worker that died meanwhile: the step's group is killed and this says -SIGKILL (`died`)."""
        self.sock.settimeout(timeout)
        try:
            answer, _ = recv(self.sock)
        except TimeoutError:
            raise subprocess.TimeoutExpired(str(pid), timeout) from None
        except OSError:
            answer = None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)
        if answer is None:
            self.died = True
            launch.signal_group(pid, signal.SIGKILL)
            self.close()
            return -signal.SIGKILL
        return answer["exit"]

    def close(self) -> int | None:
        """End the worker (its socket closed: it exits; SIGTERM, then SIGKILL, if it does not); its
        exit code."""
        self.release()
        return self.reap()

    def release(self) -> None:
        """Tell it to exit (its socket closed), without waiting: `reap` waits. Both sides' workers
        then end at once."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def ended(self) -> bool:
        """Whether it has exited (collected, so no zombie is left of it)."""
        return self.child is None or self.child.proc.poll() is not None

    def reap(self) -> int | None:
        """Wait for a released worker to end (SIGTERM, then SIGKILL, if it does not); its exit code."""
        child, self.child = self.child, None
        if child is None:
            return None
        code = child.wait(CLOSE_WAIT_S)
        return child.stop(STEP_GRACE_S) if code is None else code
