"""How a batch runs its ops' processes here: the local executor (a thread per device, serial within a
device, each op on the device a stable hash of its id picks), and each attempt's process, watched for
--op-timeout and the batch's stop (harness.sessions.ray_executor and slurm_executor run an op's job
elsewhere, through the same attempts).

Each op's record or replay is forked by its device thread's warm worker (harness.core.forkserver:
torch, triton and pytest imported once a device, not once an op; `--op-start fresh` starts a new
interpreter per op instead). The forked op leads its own group and holds its op dir's `.running` lock
as a guard would; its worker ends it when the batch dies (the worker's death signal, then the step's),
a crash ends only the op, and a worker that died is started again for the op's retry. An op started
fresh (and every corpus A/B op, and triage's upstream node) runs under harness.core.opguard, the
leader of its group, which ends it when the batch dies, however it died. `--resume` stops what a dead
batch left running (`stop_leftovers`) before it uses that device.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import backends
from harness.core import batchdir, forkserver, launch, opguard, paths, rundir
from harness.providers import flaggems
from harness.providers.catalog import Entry
from harness.sessions.batch.options import Options

KILL_GRACE_S = 10
OVERDUE_POLL_S = 2  # how often a chunk's ops are looked at for one past --op-timeout


def shard(key: str, n: int) -> int:
    """Stable across processes and Python versions (unlike hash())."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % n


class LocalExecutor:
    """The processes of a batch's ops: each attempt's, started and watched (`_run_attempt`, `_attempt`,
    `_watched`), the device threads that run the ops here (`run`) with their warm workers, and `stop`.
    What an op's job is (its attempts, retries, triage: `run_op`) is harness.sessions.batch.job.Batch's."""

    # The guard's file in an op dir while it runs; `--resume` stops what a dead batch left running by it.
    running_name = opguard.RUNNING
    FORKS = True  # whether its ops may be forked by a warm worker (--op-start)

    def __init__(self, batch_dir: Path, opts: Options):
        self.dir = batch_dir
        self.opts = opts
        self.lock = threading.Lock()
        self.children: dict[int, launch.Child] = {}
        self.stopping = threading.Event()
        self.events: queue.Queue = queue.Queue()  # each op's status row, as its device thread finishes it
        # Device -> the warm worker that forks its ops (the local executor's device threads, --op-start fork).
        self.workers: dict[int, forkserver.Worker] = {}
        self.worker_notes: dict[int, str] = {}  # device -> why its ops start fresh from here, for its next row

    def run_op(self, entry: Entry, device: int) -> batchdir.StatusRow:
        """The op's whole job, its status row recorded (the job's class says what it is)."""
        raise NotImplementedError

    def run_shard(self, entries: list[Entry], device: int):
        """A device thread's ops, in order: each one's recorded status row as its job ends."""
        for entry in entries:
            if self.stopping.is_set():
                return
            yield self.run_op(entry, device)

    def _run_attempt(self, argv: list[str], log_path: Path, device: int, timeout: float | None = None,
                     overdue: Callable[[], bool] | None = None) -> tuple[int | None, float]:
        """`python -m harness ARGV` for one attempt: forked by the device's warm worker where it has
        one, else fresh under the guard. A worker that cannot fork it (it never came up) is said in the
        op's log and its next row's notes, and the device's ops start fresh from here on."""
        worker = self.workers.get(device)
        if worker is not None:
            try:
                code, seconds = self._watched(
                    lambda log, running, gate: worker.start(argv, log, _dropped, guard=running, gate=gate), log_path,
                    timeout, overdue)
            except forkserver.WorkerDied as exc:
                worker.close()
                del self.workers[device]
                self._say(device, log_path, f"its warm worker could not fork it ({exc}): device {device}'s ops "
                                            "start fresh from here")
            else:
                if worker.died:  # restarted by its next start: the retry is forked again
                    self._say(device, log_path, "its warm worker died during the attempt, which was killed with it")
                return code, seconds
        return self._attempt([sys.executable, "-m", "harness", *argv], log_path, timeout=timeout, overdue=overdue)

    def _say(self, device: int, log_path: Path, why: str) -> None:
        """In the op's log, and in the notes of the row its device finishes next."""
        self.worker_notes[device] = why
        with rundir.open_write(log_path) as log:
            log.write(f"\n{why}\n")

    def _attempt(self, cmd: list[str], log_path: Path, timeout: float | None = None,
                 overdue: Callable[[], bool] | None = None, **start_kw) -> tuple[int | None, float]:
        """(exit code or None on timeout, seconds) of CMD started fresh (`timeout`: instead of --op-timeout).

        The op runs under harness.core.opguard, the leader of its process group, which ends the group
        when this process dies (by SIGKILL too) and marks it in the op dir's `.running` meanwhile."""
        # The guard, not a parent-death signal, ties the op to this batch: these are worker threads.
        return self._watched(lambda log, running, gate: launch.start(opguard.command(running, cmd, gate), log=log,
                                                                     with_parent=False, pass_fds=(gate,), **start_kw),
                             log_path, timeout, overdue)

    def _watched(self, start_child, log_path: Path, timeout: float | None = None,
                 overdue: Callable[[], bool] | None = None) -> tuple[int | None, float]:
        """(exit code or None on timeout, seconds) of the child `start_child(log, running, gate)` starts, which
        `stop` reaches while it runs and --op-timeout (or `timeout`) ends, or `overdue` (asked every
        OVERDUE_POLL_S) where it says so; its `.running` (the op dir's) is gone after it.

        A stop is final: the child waits at `gate` (a pipe's read end) until it is known here, and that
        is decided under the lock `stop` takes to collect the children it kills. A stop set before that
        closes the gate (the child exits having run nothing: NotStarted); one set after finds the child
        among those it kills. However a signal lands (before the check, between the check and the
        start, during the start), no op runs past a stop."""
        start = time.monotonic()
        running = log_path.parent / self.running_name
        gate, opener = os.pipe()
        try:
            with rundir.open_write(log_path) as log:
                try:
                    child = start_child(log, running, gate)
                finally:
                    os.close(gate)
                with self.lock:
                    self.children[child.pid] = child
                    # A stop signal that arrived while its handler waits for the main thread counts as the stop.
                    go = not self.stopping.is_set() and not launch.stop_signal_arrived()
                if go:
                    with contextlib.suppress(BrokenPipeError):  # it is gone already: its wait says how
                        os.write(opener, opguard.GO)
                os.close(opener)
                opener = None
                try:
                    if not go:
                        child.wait()  # it reads the closed gate and exits
                        raise NotStarted
                    code = self._wait(child, self.opts.op_timeout if timeout is None else timeout, overdue)
                    if code is None:
                        child.stop(KILL_GRACE_S)
                finally:
                    with self.lock:
                        self.children.pop(child.pid, None)
                    running.unlink(missing_ok=True)  # the guard's own removal is skipped when SIGKILL ends it
        finally:
            if opener is not None:
                os.close(opener)
        return code, time.monotonic() - start

    @staticmethod
    def _wait(child, timeout: float, overdue: Callable[[], bool] | None) -> int | None:
        if overdue is None:
            return child.wait(timeout)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            code = child.wait(min(left, OVERDUE_POLL_S))
            if code is not None or overdue():
                return code
        return None

    # --- all ops ---------------------------------------------------------------------------------
    def device_of(self, entry: Entry) -> int:
        """The op's device: a stable hash over --devices, so a resumed batch puts it on the same one."""
        return self.opts.devices[shard(entry.id, len(self.opts.devices))]

    def run(self, todo: list[Entry], on_done) -> None:
        devices = self.opts.devices
        shards: dict[int, list[Entry]] = {d: [] for d in devices}
        for e in todo:
            shards[self.device_of(e)].append(e)

        forks = self.FORKS and self.opts.op_start == "fork"
        workers_log = rundir.open_write(self.dir / batchdir.WORKERS_LOG) if forks and todo else None

        def device_thread(device: int) -> None:
            try:
                if forks and shards[device]:
                    self._begin_worker(device, workers_log, shards[device])
                for row in self.run_shard(shards[device], device):
                    self.events.put(row)
            except BaseException as exc:  # a fault of ours: raised by the batch, not left to hang it
                self.events.put(exc)
            finally:
                worker = self.workers.pop(device, None)
                if worker is not None:
                    worker.close()

        threads = [threading.Thread(target=device_thread, args=(d,), daemon=True) for d in devices]
        remaining = len(todo)
        try:
            for t in threads:
                t.start()  # in the try: a stop that lands as they start stops them too
            while remaining:
                try:
                    row = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if isinstance(row, OSError) and row.filename is not None:
                    raise row  # a file of the batch it could not write (a refused link, a full disk): one line
                if isinstance(row, BaseException):
                    raise RuntimeError("a device thread of the batch failed (its running ops were stopped; "
                                       "resume with --resume --batch-dir)") from row
                remaining -= 1
                on_done(row)
        except BaseException:  # Ctrl-C, SIGTERM, a device thread's fault: no op runs on
            with launch.stops_deferred():  # a second Ctrl-C leaves no op running
                self.stop()
            raise
        finally:
            with launch.stops_deferred():
                for t in threads:
                    t.join(timeout=KILL_GRACE_S + 5)
                launch.end_orphans()  # what an op's guard, killed outright, left behind
                paths.remove_abandoned()  # the private cache of an op killed outright (a stopped one, on timeout)
                if workers_log is not None:
                    workers_log.close()

    def _begin_worker(self, device: int, log, entries: list[Entry]) -> None:
        """The device's warm worker, begun by its device thread, which it outlives by nothing (its death
        signal follows the thread); where it cannot be started, the device's ops start fresh, as the
        first one's notes say. It preloads the FlagGems checkouts of the device's `entries`."""
        worker = self._new_worker(log, flaggems.preload_for(
            [e.key for e in entries], self.opts.run.flaggems_dirs, self.opts.run.flagtune, device))
        try:
            worker.begin()
        except OSError as exc:
            self.worker_notes[device] = (f"its device's warm worker could not start ({exc}): device {device}'s ops "
                                         "start fresh")
            return
        self.workers[device] = worker

    def _new_worker(self, log, preload: forkserver.Preload | None = None) -> forkserver.Worker:
        """A warm worker with this interpreter, the batch's environment and the backend's child environment
        (which can change what importing triton does: the interpreter); each op's --device picks its device."""
        backend = backends.get(self.opts.backend)
        return forkserver.Worker(sys.executable, log, backend.child_env, None, None, backend.name, preload)

    def stop(self) -> None:
        """Stop scheduling and kill every running op's process group."""
        self.stopping.set()
        with self.lock:
            children = list(self.children.values())
        for child in children:
            child.stop(KILL_GRACE_S)


class NotStarted(Exception):
    """An attempt the batch's stop came before: its child exited at the start gate having run nothing."""


def _dropped(line: str) -> None:
    """A forked op's stdout line: in its log only, as a fresh op's is."""


# --- a dead batch's leftovers --------------------------------------------------------------------
def stop_leftovers(batch_dir: Path) -> list[str]:
    """Stop the ops of a dead batch that still run (their guard could not end them: stopped, or
    killed alone), before this batch uses their devices. One line for each one stopped."""
    lines = []
    for running in sorted([*batch_dir.glob(f"ops/*/{opguard.RUNNING}"),
                           *batch_dir.glob(f"{batchdir.CHUNKS}/*/{opguard.RUNNING}")]):
        facts = opguard.stop_leftover(running, KILL_GRACE_S)
        if facts is not None:
            lines.append(f"resume: stopped {running.parent.relative_to(batch_dir)}, still running from the dead "
                         f"batch pid {facts['batch_pid']} (process group {facts['pgid']}), before reusing its device")
    return lines
