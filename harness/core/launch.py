"""The one launcher of harness subprocesses (record/replay children of an A/B, a batch or a sweep,
and the pytest child of a run): process group, environment, output, timeout, signal forwarding,
group kill and parent death, plus the process facts every caller reports with.

`start` starts a child and returns a `Child` (wait with a timeout, signal, stop its group): an exec of
argv, or, given `call`, a fork of this process that runs `call` (a warm worker's step, whose modules
are imported already: harness.core.forkserver);
`run` starts one from the main thread and waits for it, forwarding a Ctrl-C or SIGTERM.
A process that owns a run becomes the subreaper of its tree (adopt_orphans): whatever its children
leave running (a grandchild, even one that left the group with setsid) is reparented to it, and
`end_orphans` ends it. `end_with` ties this process to the one that started it (nox).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING

from harness.core.paths import REPO_ROOT, bytecode_cache, harness_pythonpath, keeps_no_bytecode

if TYPE_CHECKING:
    import backends

FORWARDED = (signal.SIGINT, signal.SIGTERM)
PUMP_JOIN_S = 5  # for a child's last lines once it exited (a grandchild may hold its pipe open)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
try:
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
except OSError:
    _LIBC = None
# Children `start` started and nobody reaped yet: what `end_orphans` leaves alone.
_STARTED: set[int] = set()
_STARTED_LOCK = threading.Lock()
PARENT_POLL_S = 0.5
FORK_POLL_S = 0.01  # how often a forked child's wait looks whether it ended
# Set by the noxfile to its own pid for `python -m harness` (see end_with).
END_WITH_ENV = "ZL_BENCH_END_WITH_PID"


def _prctl(option: int, arg: int) -> bool:
    """Whether the kernel took it (not Linux: no prctl, False)."""
    prctl = getattr(_LIBC, "prctl", None)
    return prctl is not None and prctl(option, arg, 0, 0, 0) == 0


def end_with(parent: int) -> None:
    """SIGTERM to this process once `parent`, the process that started it, is gone, however it
    died (a SIGTERM or SIGKILL to nox alone): this process then stops as on a Ctrl-C, writing what
    it has, instead of running on under init. At once when `parent` is gone already."""
    if not _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM):
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def end_with_starter() -> None:
    """end_with the process END_WITH_ENV names (nox for `python -m harness`, an A/B or a batch for its warm
    workers), taken out of our environment: the tie is ours alone, a process we start has its own."""
    starter = os.environ.pop(END_WITH_ENV, None)
    if starter:
        end_with(int(starter))


_adopting = False


def adopt_orphans() -> None:
    """Become the subreaper of what this process starts (Linux; elsewhere orphans go to init).
    For the processes that own a run (`python -m harness`, the pytest child, a batch op's guard):
    end_orphans does nothing elsewhere (a caller importing the harness keeps its own children)."""
    global _adopting
    _adopting = _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def children() -> list[int]:
    """This process's children (Linux: /proc)."""
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                found.append(int(entry.name))
    return found


def end_orphans() -> int:
    """SIGKILL and reap every child of this process that `start` did not start, or whose Child
    was waited for: what a run's tree left behind and was reparented here (see adopt_orphans),
    and their own children in turn, which come here as they are killed. Call it where no other
    thread starts a process but through `start`. How many were ended."""
    if not _adopting:
        return 0
    ended = 0
    while True:
        with _STARTED_LOCK:
            left = [pid for pid in children() if pid not in _STARTED]
        if not left:
            return ended
        ended += kill_and_reap(left)


def kill_and_reap(pids: list[int]) -> int:
    """SIGKILL each of these children of this process and wait for it; how many were still there."""
    ended = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            continue
        ended += 1
    return ended


def die_with_parent(signum: int = signal.SIGTERM):
    """A `preexec_fn`: the child gets `signum` when the thread that started it dies, even by
    SIGKILL, so no measurement outlives the run that owns its device. Call Popen from a thread
    that lives as long as the child (the main thread, or the worker that waits on it).

    The child also starts with no signal blocked: a parent holding SIGINT off around Popen would
    otherwise hand that mask through exec, and the child would never see a forwarded Ctrl-C."""

    parent = os.getpid()

    def arm() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if _prctl(_PR_SET_PDEATHSIG, int(signum)) and os.getppid() != parent:  # it died before the arming
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


def signal_group(pgid: int, signum: int) -> bool:
    """`signum` to process group `pgid`; whether the group had a process to signal."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


@dataclasses.dataclass
class Child:
    """A started child. With `own_group` it leads its own process group, and signals and kills
    reach its whole tree; without, only the child itself."""

    proc: subprocess.Popen
    own_group: bool
    pumps: tuple[threading.Thread, ...] = ()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, signum: int) -> None:
        """`signum` to the child (its group); a child already gone is no error."""
        if not self.own_group:
            self.proc.send_signal(signum)  # nothing once it was reaped: its pid may be another's
            return
        signal_group(self.proc.pid, signum)

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code (-N: killed by signal N), or None when `timeout` ran out first. Once it
        returned a code, every line the child wrote was passed on."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        with _STARTED_LOCK:
            _STARTED.discard(self.proc.pid)
        for thread in self.pumps:
            thread.join(timeout=PUMP_JOIN_S)
        return code

    def kill(self) -> None:
        self.send(signal.SIGKILL)

    def stop(self, grace_s: float, signum: int = signal.SIGTERM) -> int:
        """`signum` (its handler can write what it has), then SIGKILL to whatever is left after
        `grace_s`; its exit code."""
        self.send(signum)
        if self.wait(grace_s) is None or self.own_group:
            self.kill()  # a group outlives its leader while members remain
        return self.wait()


class Forked:
    """A child `start` forked to run a `call`, with the part of Popen's interface `Child` uses."""

    def __init__(self, pid: int, stdout: IO[str] | None, stderr: IO[str] | None):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._reaped = False

    def poll(self) -> int | None:
        # Its exit is read without reaping it (WNOWAIT), then reaped: a signal handler that raises (launch.run's)
        # between the two leaves the child to be read or reaped by the next poll, never its status lost to a
        # reap that no one saw.
        if self.returncode is None:
            exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if exited is not None and exited.si_pid:
                self.returncode = exited.si_status if exited.si_code == os.CLD_EXITED else -exited.si_status
        if self.returncode is not None and not self._reaped:
            with contextlib.suppress(ChildProcessError):  # reaped by the poll a handler broke into
                os.waitpid(self.pid, 0)
            self._reaped = True
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        # Polled, not a blocking waitpid: a signal handler that raises (launch.run's) must get in.
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(FORK_POLL_S)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # once reaped, its pid may be another's
            os.kill(self.pid, signum)


def in_fork(call: Callable[[], int], environ: Mapping[str, str], cwd: str | os.PathLike,
            arm: Callable[[], None] | None, own_group: bool, stdout: int | None, stderr: int | None):
    """In a child just forked: become what an exec'd child would start as (its own session, its
    death signal, its environment, output and directory, Python's signal defaults), run `call` and
    exit with its code. Never returns."""
    code = 1
    try:
        if own_group:
            os.setsid()
        if arm is not None:
            arm()
        for fd, target in ((stdout, 1), (stderr, 2)):
            if fd is not None:
                os.dup2(fd, target)
        for fd in {stdout, stderr} - {None, 0, 1, 2}:
            os.close(fd)  # a pipe's write end held only by fds 1 and 2: it closes when the child ends
        # What the parent had in place (launch.run's handler, a worker's) is not the child's.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        global _STARTED_LOCK
        _STARTED_LOCK = threading.Lock()  # the parent's is held by the forking thread, for good here
        _STARTED.clear()  # the parent's children, none of them ours
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)  # its lines arrive as written, as PYTHONUNBUFFERED does
        code = call()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt as exc:
        code = 128 + stopped_by(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _fork(call: Callable[[], int], environ: Mapping[str, str], cwd, streams: dict, own_group: bool,
          arm: Callable[[], None] | None) -> Forked:
    """`call` in a forked child, its stdout and stderr as `streams` says (Popen's keywords)."""
    ends, ours = {}, {}
    for name in ("stdout", "stderr"):
        target = streams.get(name)
        if target is subprocess.PIPE:
            read, ends[name] = os.pipe()
            ours[name] = os.fdopen(read, "r", encoding="utf-8", errors="replace")
        elif target is not None:
            ends[name] = target.fileno()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for stream in ours.values():
            stream.close()
        in_fork(call, environ, cwd, arm, own_group, ends.get("stdout"), ends.get("stderr"))
    for name, fd in ends.items():
        if name in ours:
            os.close(fd)
    return Forked(pid, ours.get("stdout"), ours.get("stderr"))


def child_environ(env: Mapping[str, str] | None = None, visible: tuple[backends.Backend, int] | None = None,
                  pythonpath: str | None = None) -> dict[str, str]:
    """The environment `start` gives a child (see there): ours, narrowed to one device when `visible`
    is (backend, device), plus `env`, with the checkout's PYTHONPATH unless `pythonpath`."""
    environ = dict(os.environ)
    if visible is not None:
        backend, device = visible
        environ = backend.visibility_env(device, environ)
    environ.update(env or {})
    environ["PYTHONPATH"] = pythonpath or harness_pythonpath(environ.get("PYTHONPATH"))
    environ["PYTHONUNBUFFERED"] = "1"  # its lines arrive as written, in order, in a log or a pipe
    if keeps_no_bytecode(environ):  # bytecode cached apart from the sources, which the variable keeps clean
        del environ["PYTHONDONTWRITEBYTECODE"]
        environ["PYTHONPYCACHEPREFIX"] = str(bytecode_cache())
    return environ


def start(argv: list[str], *, log: IO[str] | None = None, on_stdout: Callable[[str], None] | None = None,
          on_stderr: Callable[[str], None] | None = None, env: Mapping[str, str] | None = None,
          visible: tuple[backends.Backend, int] | None = None, pythonpath: str | None = None,
          own_group: bool = True, with_parent: bool = True, cwd: str | os.PathLike | None = None,
          call: Callable[[], int] | None = None, pass_fds: tuple[int, ...] = ()) -> Child:
    """Start `argv` in `cwd`, by default the checkout; given `call`, fork instead and run `call` in the
    child as `argv` would run (argv is then what the log shows): everything below holds alike.

    Output: `log` gets a `$ VAR=value ... command` line, then the child's stdout and stderr, each
    stdout line passed on to `on_stdout` as well if given (a step's progress); else `on_stdout` and
    `on_stderr` get its lines (text) from threads of their own; else it inherits ours.
    Environment: ours, narrowed to one device when `visible` is (backend, device), plus `env`;
    PYTHONPATH is `pythonpath`, by default the checkout's (harness_pythonpath). Where ours forbids
    writing bytecode that torch's install lacks (paths.keeps_no_bytecode), the child caches it in
    paths.bytecode_cache().
    `own_group`: a new session, so a terminal's Ctrl-C reaches the child only through us and a stop
    reaches its whole tree. False keeps it in our group: a group kill from outside takes it too.
    `pass_fds`: descriptors the exec'd child keeps (a worker's socket).
    `with_parent`: it gets SIGTERM when the calling thread dies (die_with_parent). Leave it off
    where other threads run: a `preexec_fn` is unsafe then, so such a child needs its own watch
    (harness.core.opguard)."""
    environ = child_environ(env, visible, pythonpath)
    if log is not None:
        log.write(f"\n$ {' '.join([*(f'{k}={v}' for k, v in (env or {}).items()), *argv])}\n")
        log.flush()
        streams = {"stdout": log, "stderr": log}
        if on_stdout is not None:
            streams.update(stdout=subprocess.PIPE, text=True, errors="replace", bufsize=1)
            on_stdout = teed(log, on_stdout)
    elif on_stdout is not None or on_stderr is not None:
        streams = {"stdout": subprocess.PIPE if on_stdout else None, "stderr": subprocess.PIPE if on_stderr else None,
                   "text": True, "errors": "replace", "bufsize": 1}
    else:
        streams = {}
    held = set(FORWARDED) if with_parent else set()
    # Held off around Popen, so that a signal cannot strike between the fork and the handle that
    # lets the caller stop the child. Only with die_with_parent, which clears the mask in the
    # child: an exec keeps the mask, and a child holding SIGINT off would never see a Ctrl-C.
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        with _STARTED_LOCK:  # known before end_orphans can see it
            if call is not None:
                proc = _fork(call, environ, cwd or REPO_ROOT, streams, own_group,
                             die_with_parent() if with_parent else None)
            else:
                proc = subprocess.Popen(argv, cwd=cwd or REPO_ROOT, env=environ, start_new_session=own_group,
                                        preexec_fn=die_with_parent() if with_parent else None, pass_fds=pass_fds,
                                        **streams)
            _STARTED.add(proc.pid)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        raise
    pumps = tuple(threading.Thread(target=pump, args=(stream, write), daemon=True)
                  for stream, write in ((proc.stdout, on_stdout), (proc.stderr, on_stderr))
                  if stream is not None and write is not None)
    child = Child(proc, own_group, pumps)
    try:
        # A signal held off during the start is handled here, as the mask lifts: where its handler
        # raises (a Ctrl-C), the child is still ours to end, not left running unseen.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        for thread in pumps:
            thread.start()
    except BaseException:  # that, or a Ctrl-C a line's callback raised, before the caller has the child to stop
        child.kill()
        proc.wait()
        for thread in pumps:
            if thread.ident is not None:  # started: it ends with the child's output, closing its stream
                thread.join(timeout=PUMP_JOIN_S)
        if not any(thread.is_alive() for thread in pumps):
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        with _STARTED_LOCK:
            _STARTED.discard(proc.pid)
        raise
    return child


def teed(log: IO[str], on_line: Callable[[str], None]) -> Callable[[str], None]:
    def write(line: str) -> None:
        log.write(line)
        log.flush()  # in order with what the child writes to the log itself (its stderr)
        on_line(line)

    return write


# A child's output is passed on in pieces of at most this many characters: a line without end (a
# program printing gigabytes with no newline) is never held whole.
PIECE_CHARS = 64 * 1024


def pump(stream, write: Callable[[str], None]) -> None:
    with stream:
        for piece in iter(lambda: stream.readline(PIECE_CHARS), ""):
            write(piece)


class Stopped(KeyboardInterrupt):
    """A stop by signal, raised as Ctrl-C is: `signum` says which (SIGTERM from a job scheduler,
    `timeout`, a batch's --op-timeout or a corpus A/B's stop)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum


def stopped_by(exc: KeyboardInterrupt) -> int:
    """The signal behind a KeyboardInterrupt: a Ctrl-C's SIGINT unless it is a Stopped."""
    return getattr(exc, "signum", signal.SIGINT)


@contextlib.contextmanager
def stops_on_signals():
    """Within it, a Ctrl-C raises KeyboardInterrupt and a SIGTERM Stopped(SIGTERM) in the main thread,
    so the caller's KeyboardInterrupt path (kill what runs, report what completed) covers both. SIGINT
    is set too because Python leaves it ignored where it started ignored: a command a shell script
    ran in the background (`cmd &`) would not stop on a SIGINT to its group. Other threads learn of such
    a signal the moment it arrives, before the main thread's handler runs (`stop_signal_arrived`)."""
    def stop(signum, frame):
        raise Stopped(signum)

    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    with _arrived_lock:
        outer = dict(_arrived)  # a stops_on_signals inside another: the outer's, back as it ends
        _arrived.update(fd=read, seen=False)
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, stop)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        with _arrived_lock:
            _arrived.update(outer)
            os.close(read)
        os.close(write)


# Within stops_on_signals: the read end of the pipe Python's C-level signal handler writes each arriving
# signal's number into (signal.set_wakeup_fd), and whether a stop signal was among them.
_arrived: dict = {"fd": None, "seen": False}
_arrived_lock = threading.Lock()


def stop_signal_arrived() -> bool:
    """Whether a SIGINT or SIGTERM reached this process inside stops_on_signals, from any thread: true as
    soon as it arrived, while the main thread may not have run its handler yet (a device thread deciding,
    under the GIL's switching, whether to let an op start must not start one past a Ctrl-C)."""
    with _arrived_lock:
        fd = _arrived["fd"]
        while fd is not None and not _arrived["seen"]:
            try:
                got = os.read(fd, 64)
            except BlockingIOError:
                break
            if not got:
                break
            _arrived["seen"] = any(b in (signal.SIGINT, signal.SIGTERM) for b in got)
        return _arrived["seen"]


@contextlib.contextmanager
def stops_deferred():
    """Within it, a Ctrl-C or SIGTERM waits: the cleanup after a first stop (processes stopped and
    reaped, caches removed, logs closed) runs whole when a second comes while it runs (an impatient
    Ctrl-C, a scheduler's SIGTERM after its grace), and the first such signal is handled as it ends,
    by the handlers it found. The main thread only (where Python runs handlers); elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in FORWARDED}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])


class _Wake(Exception):
    """Raised by the signal handler of `run` to end its wait for the child."""


# What a start gate's reader (opguard.passed_gate) waits for before its step runs anything.
GATE_GO = b"1"


def _start_gated(starter: Callable[..., Child], argv: list[str], stopped: Callable[[], bool],
                 on_stop: Callable[[], None] = lambda: None, **start_kw) -> Child | None:
    """`starter(argv, gate=..., **start_kw)`, its child waiting at the gate (a pipe's read end) until it is
    told to go: None where `stopped()` says a stop came while it started (`on_stop()` says so at once; the
    child reads the gate closed and exits, having run nothing, and is waited for)."""
    gate, opener = os.pipe()
    try:
        child = starter(argv, gate=gate, **start_kw)
    except BaseException:
        os.close(opener)
        raise
    finally:
        os.close(gate)
    if stopped():
        os.close(opener)
        on_stop()  # before the wait: a warm worker may still be importing before it forks the child
        child.wait()
        return None
    with contextlib.suppress(BrokenPipeError):  # gone already: its wait says how
        os.write(opener, GATE_GO)
    os.close(opener)
    return child


def run_beside(argv: list[str], *, stop: threading.Event, grace_s: float, starter: Callable[..., Child],
               on_stop: Callable[[], None] | None = None, **start_kw) -> tuple[int, bool]:
    """`run` for a thread other than the main one (which alone can take signals): `starter(argv, gate=...,
    **start_kw)` started at its gate, as `run(gated=True)` starts it, and waited for; `stop` set (the main
    thread was stopped) sends it SIGINT, and after `grace_s` a kill; `on_stop()` says so. A stop set before
    the start starts nothing. (its exit code, whether it was stopped)"""
    if stop.is_set():
        return -signal.SIGINT, True
    child = _start_gated(starter, argv, stop.is_set, **start_kw)
    if child is None:
        return -signal.SIGINT, True
    try:
        while True:
            code = child.wait(0.2)
            if code is not None:
                return code, False
            if stop.is_set():
                break
        if on_stop is not None:
            on_stop()
        child.send(signal.SIGINT)
        code = child.wait(grace_s)
        if code is None:
            child.kill()
            code = child.wait()
        return code, True
    except BaseException:
        child.kill()
        child.wait()
        raise


def run(argv: list[str], *, grace_s: float, forward: Iterable[int] = FORWARDED,
        on_stop: Callable[[int], None] | None = None, on_kill: Callable[[], None] | None = None,
        starter: Callable[..., Child] | None = None, gated: bool = False, **start_kw) -> tuple[int, int | None]:
    """`starter(argv, **start_kw)` (`start`, or a warm worker's: forkserver.Worker.start) and wait for
    it; call from the main thread. The first signal of
    `forward` that reaches this process goes on to the child (its group), which then has `grace_s`
    to finish, say to write its results, before it is killed; `on_kill()` says so. `on_stop(signum)`
    says that the stop was taken, whenever it came: before the start (nothing is started), during a
    gated start (the child reads its gate closed) or during the wait (the child was sent it); a caller
    that tells its user from there tells them every time. Later signals change nothing. Whatever of
    its tree outlives it is ended (end_orphans).
    `gated`: the starter takes a `gate` (a pipe's read end) its child waits at before it runs anything
    (a warm worker's start, which may wait seconds for the worker's imports first): a stop that came
    while it started is final, the child reads the closed gate and exits having run nothing.
    (its exit code, the signal forwarded or None)"""
    got: list[int] = []
    waiting = False
    told = False  # whether what run returns or raises says that a signal came
    stopped = on_stop or (lambda signum: None)

    def handler(signum, frame):
        got.append(signum)
        if waiting and len(got) == 1:
            raise _Wake

    previous = {s: signal.signal(s, handler) for s in forward}
    try:
        if got:  # a stop that came as the handlers went in: final, nothing is started after it
            stopped(got[0])
            told = True
            return -got[0], got[0]
        if not gated:
            child = (starter or start)(argv, **start_kw)
        else:
            child = _start_gated(starter or start, argv, lambda: bool(got), lambda: stopped(got[0]), **start_kw)
            if child is None:  # it came while the child was being started
                told = True
                return -got[0], got[0]
        try:
            deadline = None
            while True:
                try:
                    waiting = True
                    if got and deadline is None:  # it came before the wait began
                        raise _Wake
                    code = child.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except _Wake:
                    waiting = False
                    deadline = time.monotonic() + grace_s
                    child.send(got[0])
                    stopped(got[0])
                    continue
                waiting = False
                if code is not None:
                    told = bool(got)
                    return code, got[0] if got else None
                if on_kill is not None:
                    on_kill()
                child.kill()
                told = True
                return child.wait(), got[0]
        except BaseException:  # a signal not forwarded, say: the child does not outlive this wait
            waiting = False
            told = True  # the exception goes on: what it stops stops anyway
            child.kill()
            child.wait()
            raise
    finally:
        end_orphans()
        for s, h in previous.items():
            signal.signal(s, h)
        if got and not told:
            # It came once the child's end was seen, before the handlers went back (ending the orphans
            # takes a while on a loaded machine): raised again for them, as if it came just after run
            # returned. Dropped, the caller went on to its next step as if nothing had come.
            signal.raise_signal(got[0])
