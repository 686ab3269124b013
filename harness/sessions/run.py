"""Run a resolved spec: claim the run dir, write the spec and shapes into it, run the pytest child
on one device with a private Triton cache, and tee its output into run.log."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path

import backends
from harness.core import bounded, launch, rundir
from harness.core import spec as spec_mod
from harness.core.errors import clip_text
from harness.core.outcome import INCOMPLETE, Outcome
from harness.core.paths import private_dir, runs_root
from harness.core.results import ResultsError, read_results
from harness.core.rundir import EXIT_INCOMPLETE
from harness.providers import flaggems, shapes
from harness.sessions import sweep
from reports import table

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# How long an interrupted child gets to write its results and outcome before it is killed.
CHILD_GRACE_S = 30
CRASH_TAIL_LINES = 15
CRASH_LINE_CHARS = 2000  # of each of those lines, as the terminal is shown them
# run.log keeps the first RUN_LOG_HEAD and the last RUN_LOG_TAIL characters of a run's output, and a
# line saying how much it cut between them: an operator that prints without end fills no disk.
RUN_LOG_HEAD = 64 * 1024 * 1024
RUN_LOG_TAIL = 1024 * 1024
# Exit codes (rundir's EXIT_*): 0 every row passed, 1 some row failed, 2 bad input, 3 the run
# stopped before its last case, 65 a requested dtype the op does not take (DtypeRejected), 75 the
# disk filled, 128+N a signal N stopped it. A run exits with the code its outcome records.


class _Tee:
    """The terminal and run.log at once (run.log gets plain text), plus lines for run.log only.
    A run.log that can no longer be written (a full disk) stops being written; the terminal
    goes on, and the run says so at its end. Past `head` characters, run.log keeps only the last
    `tail` (in memory until close), after a line saying how many were cut."""

    def __init__(self, log_path: Path, head: int = RUN_LOG_HEAD, tail: int = RUN_LOG_TAIL):
        self.log_path = log_path
        self.log = rundir.open_write(log_path)
        self.lock = threading.Lock()
        self.log_error: rundir.DiskFull | OSError | None = None
        self.log_tail: collections.deque[str] = collections.deque(maxlen=CRASH_TAIL_LINES)
        self.head_size, self.head_left, self.tail_size = head, head, tail
        self.held: collections.deque[str] = collections.deque()  # run.log's last `tail` characters
        self.held_chars = self.cut_chars = 0

    def write(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text)
            sys.stdout.flush()
            self._log(text)

    def log_only(self, text: str) -> None:
        with self.lock:
            self.log_tail.append(text if len(text) <= CRASH_LINE_CHARS else clip_text(text, CRASH_LINE_CHARS) + "\n")
            self._log(text)

    def _log(self, text: str) -> None:
        if self.log is None:
            return
        text = ANSI.sub("", text)
        if self.head_left < len(text):  # past the head: held, the oldest dropped (counted as cut)
            self._hold(text[self.head_left:])
            text = text[:self.head_left]
        self.head_left -= len(text)
        self._write(text)

    def _hold(self, text: str) -> None:
        self.held.append(text)
        self.held_chars += len(text)
        while self.held_chars - len(self.held[0]) >= self.tail_size:
            self.held_chars -= len(dropped := self.held.popleft())
            self.cut_chars += len(dropped)

    def _write(self, text: str) -> None:
        try:
            self.log.write(text)
            self.log.flush()
        except OSError as exc:
            self.log_error = rundir.disk_full(exc, self.log_path) or exc
            self.close()

    def close(self) -> None:
        if self.log is not None and self.held:
            held = "".join(self.held)
            cut = self.cut_chars + max(0, len(held) - self.tail_size)
            self.held.clear()
            note = (f"\n[run.log: {cut} characters of output cut here; it keeps the first {self.head_size} and the "
                    f"last {self.tail_size} of a run's output]\n") if cut else ""
            self._write(note + held[-self.tail_size:])
        if self.log is not None:
            try:
                self.log.close()
            except OSError:
                pass  # its buffer could not be flushed: the error was already recorded
            self.log = None


def run_child(run_dir: Path, run_spec: spec_mod.RunSpec, tee: _Tee, cache_dir: str,
              host: Path | None = None) -> tuple[int, str | None]:
    """(the child's exit code, the signal that interrupted this parent or None). The child's
    stdout carries the user's lines (terminal and run.log), its stderr pytest's own output and
    anything else (run.log only); see harness.child.console. A SIGINT or SIGTERM (a terminal's
    Ctrl-C, a batch's timeout) goes on to the child, which gets CHILD_GRACE_S to write its results
    and outcome; this parent writes the outcome itself when the child did not."""

    def stopping(signum: int) -> None:
        tee.write(f"\n{signal.Signals(signum).name}: stopping the run (a child already started has up to "
                  f"{CHILD_GRACE_S} s to write its results)\n")

    argv = [sys.executable, "-m", "harness.child", str(run_dir)]
    visible = (backends.get(run_spec.backend), run_spec.device)
    if host is not None:  # an A/B's chunk: the side's measuring host runs it, in its device context
        from harness.child import host as measuring

        environ = launch.child_environ({"TRITON_CACHE_DIR": cache_dir}, visible)
        tee.write(f"the child is handed to the measuring host at {host}\n")
        try:
            code, signum = launch.run(argv, grace_s=CHILD_GRACE_S, on_stop=stopping,
                                      on_kill=lambda: tee.write("the child did not stop in time: its host killed\n"),
                                      starter=measuring.starter(str(host), environ, run_dir),
                                      on_stdout=tee.write, on_stderr=tee.log_only)
        except measuring.HostGone as exc:
            tee.write(f"error: {exc}\n")
            return EXIT_INCOMPLETE, None
        except measuring.HostDeclined as exc:
            tee.write(f"the child runs in a process of its own, not the measuring host: {exc}\n")
        else:
            return code, None if signum is None else signal.Signals(signum).name
    code, signum = launch.run(
        argv, grace_s=CHILD_GRACE_S, on_stop=stopping,
        call=_forked_child(run_dir, run_spec, tee),
        on_kill=lambda: tee.write("the child did not stop in time: killed\n"),
        on_stdout=tee.write, on_stderr=tee.log_only, visible=visible,
        env={"TRITON_CACHE_DIR": cache_dir},  # see execute
        # In our group: a group kill (a batch's guard) reaches the child too, not only through us.
        own_group=False)
    return code, None if signum is None else signal.Signals(signum).name


def _forked_child(run_dir: Path, run_spec: spec_mod.RunSpec, tee: _Tee):
    """The child as a fork of this process where its modules are loaded here already (a step a warm
    worker forked: harness.core.forkserver), which saves it their import; None (exec it) elsewhere,
    where this process imported none of torch and pytest and the child pays for them either way, and
    where the worker preloaded the run's operator library otherwise than the run needs it (said)."""
    if "harness.child.runner" not in sys.modules:
        return None
    misfit = flaggems.preload_misfit(run_spec.flaggems)
    if misfit is not None:
        tee.write(f"the child starts fresh: {misfit}\n")
        return None
    from harness.child import runner

    def child() -> int:
        # What an exec'd `python -m harness.child RUN_DIR` sees: an operator may read its run dir there.
        sys.argv = [str(Path(runner.__file__).with_name("__main__.py")), str(run_dir)]
        return runner.entry([str(run_dir)])

    return child


def _rows_done(run_dir: Path) -> int:
    try:
        return len(read_results(run_dir))
    except ResultsError:
        return 0


def _rows_skipped(run_dir: Path) -> int:
    """The SKIPPED rows of the run's results.json (0 where it does not read: the run's end says why)."""
    try:
        return sum(1 for row in read_results(run_dir) if row.status == "SKIPPED")
    except ResultsError:
        return 0


def finish(run_dir: Path, code: int, interrupted: str | None, planned: int | None, tee: _Tee) -> Outcome:
    """The run's outcome: the child's own, or, when it ended without recording one, the parent's
    account of it (what killed it, rows done of planned, the case it was in), written into
    run.json. A child's raw exit number means nothing of ours (an operator may call os._exit(75)):
    without a recorded outcome it is only a child that ended unexpectedly."""
    try:
        observed = rundir.read_json(run_dir / rundir.RUN_JSON).get("observed", {})
    except (OSError, ValueError):
        observed = {}
    try:
        recorded = Outcome.from_json(observed.get("outcome"))
    except ValueError:
        recorded = None
    if recorded is not None and type(recorded.exit_code) is int:  # one without its exit code says nothing
        return recorded
    if interrupted:
        reason, exit_code = f"interrupted ({interrupted})", 128 + getattr(signal, interrupted)
    elif not run_dir.is_dir():
        reason, exit_code = "its run dir was removed while it was going (nothing of it is kept)", EXIT_INCOMPLETE
    elif code < 0:
        reason, exit_code = f"child {launch.describe_exit(code)}", launch.shell_code(code)
    else:
        reason, exit_code = f"child {launch.describe_exit(code)} unexpectedly (no outcome recorded)", EXIT_INCOMPLETE
        if tee.log_tail:
            tee.write(f"the child {launch.describe_exit(code)}; its last output (all of it in run.log):\n")
            tee.write("".join(f"  | {line}" for line in tee.log_tail))
    outcome = Outcome(INCOMPLETE, rows_done=_rows_done(run_dir), rows_planned=planned, reason=reason,
                      running_case=observed.get("running_case"), exit_code=exit_code)
    try:
        rundir.record_outcome(run_dir, outcome, exit_status=code)
    except FileNotFoundError:
        pass  # a run dir deleted under the run: its last line says so (a write that fails: _ended_by)
    return outcome


def _unclaimed(exc: OSError) -> int:
    """A run whose first writes failed (a full disk, a file-size limit, EIO): no run dir is left, the
    error is one line, and the run exits EXIT_DISK_FULL. Any other OSError is raised as it is."""
    fault = rundir.write_fault(exc)
    if fault is None:
        raise exc
    print(f"error: {fault} (nothing was run; no run dir is left)", file=sys.stderr)
    return rundir.EXIT_DISK_FULL


def _ended_by(fault: rundir.WriteFault, run_dir: Path, mode: str, planned: int | None, tee: _Tee) -> int:
    """A write of this process's that failed for good once the run dir held its spec: the outcome
    (INCOMPLETE, exit EXIT_DISK_FULL) recorded in the space kept for it; where even that cannot be
    written, the run dir removed, so no run is left without an outcome (a replay would call it killed)."""
    rundir.release_space(run_dir)
    outcome = Outcome(INCOMPLETE, rows_done=_rows_done(run_dir), rows_planned=planned,
                      reason=fault.reason,
                      exit_code=rundir.EXIT_DISK_FULL)
    try:
        rundir.record_outcome(run_dir, outcome)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"error: {fault}; its outcome could not be recorded either ({exc}): run dir {run_dir} removed",
              file=sys.stderr)
        return rundir.EXIT_DISK_FULL
    print(f"error: {fault}", file=sys.stderr)
    tee.write(f"\n{summary_line(mode, outcome, planned)}; run dir: {run_dir}\n")
    return rundir.EXIT_DISK_FULL


def summary_line(mode: str, outcome: Outcome, planned: int | None = None, skipped: int = 0) -> str:
    """`record ok: 2/4 rows, 2 skipped`: the rows that ran of those planned, the skipped ones (which
    measured nothing) counted apart."""
    code = outcome.exit_code
    if skipped and outcome.rows_done is not None:
        ran = dataclasses.replace(outcome, rows_done=outcome.rows_done - skipped)
        rows = f"{ran.rows(planned)} rows, {skipped} skipped"
    else:
        rows = f"{outcome.rows(planned)} rows"
    if outcome.complete:
        return f"{mode} {'ok' if code == 0 else f'finished with failures (exit {code})'}: {rows}"
    return f"{mode} INCOMPLETE: {rows}, {outcome.reason}{outcome.during()}"


def flaggems_shapes_yaml(run_spec: spec_mod.RunSpec) -> str:
    """A FlagGems run's shapes.yaml: the whole shape file (its keys resolve at run time against the
    benchmark's class chain), or a note that the checkout's own shapes were used."""
    source = run_spec.flaggems.shapes_file
    if source is None:
        return (f"# upstream shapes: the checkout's own at level {run_spec.flaggems.level}\n"
                "# (the shapes measured are in results.json)\n{}\n")
    return f"# shape file used by this run (from {source})\n" + bounded.read_text(source, "shape file")


def execute(run_spec: spec_mod.RunSpec, shape_list: list, out: Path | None, cache_dir: Path | None = None,
            named_dir: Path | None = None, host: Path | None = None) -> int:
    """Run it in `named_dir` exactly (--run-dir: the session that started this run reads it back
    from there), else in a new run dir under `out`; `cache_dir`: compile into that Triton cache and
    keep it (the session that gives it shares it only among runs of one compiler), else into a
    private one removed after the run; `host`: the child runs in the measuring host listening there
    (harness.child.host), else in a process of its own."""
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return _execute(run_spec, shape_list, out, named_dir, cache_dir, f"shared: {cache_dir}", host)
    # Private to this run (its parallel sweep's shards included): the IR collected is exactly
    # this run's, and nothing compiled by another compiler build is picked up.
    with private_dir("triton_cache") as private:
        return _execute(run_spec, shape_list, out, named_dir, private,
                        f"private: {private}, removed as the run ends (if this process died first: by the next run)",
                        host)


def _execute(run_spec: spec_mod.RunSpec, shape_list: list, out: Path | None, named_dir: Path | None, cache_dir: Path,
             cache_note: str, host: Path | None = None) -> int:
    try:
        if named_dir is not None:
            run_dir = rundir.claim_named_dir(named_dir, rundir.RUN_LOG)
        else:
            run_dir = rundir.claim_run_dir(runs_root(out), run_spec.op)
    except OSError as exc:
        return _unclaimed(exc)
    try:
        run_spec, shape_count, planned = _write_inputs(run_dir, run_spec, shape_list)
        tee = _Tee(run_dir / rundir.RUN_LOG)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing was measured: leave no run dir without an outcome
        return _unclaimed(exc)
    try:
        backend = backends.get(run_spec.backend)
        what = f"replay of {run_spec.replay_from}" if run_spec.mode == "replay" else "record"
        fg = run_spec.flaggems
        target = f"{fg.repo}:{run_spec.op} ({fg.node})" if fg else run_spec.op
        tee.write(f"zl_bench {what}: op={target} backend={run_spec.backend} device={run_spec.device} "
                  f"dtypes={','.join(run_spec.dtypes) or 'upstream'} shapes={shape_count} timer={run_spec.timer} "
                  f"l2={run_spec.l2}\n"
                  f"run dir: {run_dir}\n")
        if not backend.measures_performance:
            tee.write(table.not_performance_note(backend.name) + "\n")
        if run_spec.sweep_devices:
            try:
                with launch.stops_on_signals():  # a batch's timeout stops the sweep as Ctrl-C does
                    swept = sweep.run(run_spec, shape_list, run_spec.sweep_devices, run_dir, tee.write, cache_dir)
            except KeyboardInterrupt as exc:  # the shards were killed; nothing was measured
                signum = launch.stopped_by(exc)
                stopped = Outcome(INCOMPLETE, rows_done=0, rows_planned=planned,
                                  reason=f"interrupted ({signal.Signals(signum).name}) during the parallel sweep",
                                  exit_code=128 + signum)
                rundir.record_outcome(run_dir, stopped)
                tee.write(f"\n{summary_line(run_spec.mode, stopped)}; run dir: {run_dir}\n")
                return 128 + signum
            rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"sweep": swept.facts}})
            if swept.merged is not None:
                run_spec = dataclasses.replace(run_spec, preset_records=str(swept.merged))
                spec_mod.write(run_dir, run_spec)
        rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"triton_cache": cache_note}})
        cached = _cache_entries(cache_dir)
        code, interrupted = run_child(run_dir, run_spec, tee, str(cache_dir), host)
        rundir.release_space(run_dir)  # the child is gone: room for this process's own account
        # Whether the run compiled (a kernel or launcher not found in a shared cache: a replay's should all be
        # there); runs beside it writing the same cache count too.
        written = len(_cache_entries(cache_dir) - cached)
        try:
            rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"triton_cache_written": written}})
        except FileNotFoundError:
            pass  # a run dir deleted under the run: finish says so
        outcome = finish(run_dir, code, interrupted, planned, tee)
        tee.write(f"\n{summary_line(run_spec.mode, outcome, planned, _rows_skipped(run_dir))}; run dir: {run_dir}\n")
        if tee.log_error is not None:
            tee.write(f"error: {tee.log_error}; run.log stops there\n")
    except OSError as exc:
        fault = rundir.write_fault(exc)
        if fault is None:
            raise
        return _ended_by(fault, run_dir, run_spec.mode, planned, tee)
    finally:
        tee.close()
        rundir.release_space(run_dir)  # however the run ended (a stopped sweep, say)
    # This process was stopped: that is the account, whatever the child recorded before it stopped.
    return 128 + getattr(signal, interrupted) if interrupted else outcome.exit_code


def _cache_entries(cache_dir: Path) -> set[str]:
    """The Triton cache's entries (one a compiled kernel or launcher, named by its key)."""
    try:
        return set(os.listdir(cache_dir))
    except OSError:
        return set()


def _write_inputs(run_dir: Path, run_spec: spec_mod.RunSpec,
                  shape_list: list) -> tuple[spec_mod.RunSpec, str, int | None]:
    """shapes.yaml and the spec into the new run dir; (the spec as written, shape count as shown,
    rows planned). A FlagGems shape file is read from its copy in the run dir from then on."""
    if run_spec.flaggems is not None:
        shapes_text = flaggems_shapes_yaml(run_spec)
        if run_spec.flaggems.shapes_file:
            run_spec = dataclasses.replace(run_spec, flaggems=dataclasses.replace(
                run_spec.flaggems, shapes_file=str(run_dir / rundir.SHAPES_YAML)))
        rundir.atomic_write_text(run_dir / rundir.SHAPES_YAML, shapes_text)
        shape_count, planned = run_spec.shapes_source, None  # FlagGems builds its cases at run time
    else:
        shapes.write_used(run_dir / rundir.SHAPES_YAML, run_spec.op, shape_list, run_spec.dtypes,
                          run_spec.shapes_source)
        shape_count, planned = str(len(shape_list)), len(shape_list) * len(run_spec.dtypes)
    if run_spec.cases is not None:  # a replay of part of its record plans those cases only
        planned = len(run_spec.cases)
    spec_mod.write(run_dir, run_spec)
    rundir.reserve_space(run_dir)
    return run_spec, shape_count, planned
