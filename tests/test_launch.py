"""The one launcher of harness subprocesses, with real processes and real signals: environment, output,
process groups, the group kill, parent death, and the forwarding of a Ctrl-C or SIGTERM."""

import os
import py_compile
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import REPO, alive, wait_for

import backends
from harness.core import launch, paths
from harness.core.paths import REPO_ROOT


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]



def test_a_log_gets_the_command_then_both_streams_and_the_checkout_on_pythonpath(tmp_path):
    log_path = tmp_path / "x.log"
    with open(log_path, "a") as log:
        log.write("before\n")
        child = launch.start(py("""
            import os, sys
            print("path", os.environ["PYTHONPATH"].split(os.pathsep)[0], "cwd", os.getcwd())
            print("var", os.environ["ZL_X"])
            print("on stderr", file=sys.stderr)
            """), log=log, env={"ZL_X": "a b"})
        assert child.wait() == 0
    lines = log_path.read_text().splitlines()
    assert lines[:3] == ["before", "", f"$ ZL_X=a b {sys.executable} -c "]  # the script's own lines follow
    assert f"path {REPO_ROOT} cwd {REPO_ROOT}" in lines and "var a b" in lines and "on stderr" in lines


def test_a_logged_childs_stdout_lines_reach_on_stdout_too_and_its_stderr_the_log_only(tmp_path):
    seen = []
    with open(tmp_path / "x.log", "a") as log:
        child = launch.start(py("""
            import sys
            print("[1/2] row", flush=True)
            print("on stderr", file=sys.stderr, flush=True)
            print("[2/2] row")
            """), log=log, on_stdout=seen.append)
        assert child.wait() == 0
    assert seen == ["[1/2] row\n", "[2/2] row\n"]
    assert {"[1/2] row", "on stderr", "[2/2] row"} <= set((tmp_path / "x.log").read_text().splitlines())


@pytest.mark.parametrize("dont_write, prefix, installed_with_bytecode, expect", [
    ("1", None, False, "0 {cache}"),  # nothing compiled and none may be written beside the sources: apart
    ("1", None, True, "1 None"),  # the install has its bytecode: as is
    ("1", "/chosen", False, "1 /chosen"),  # the user chose where: as is
    (None, None, False, "0 None"),  # bytecode beside the sources, as Python does
])
def test_a_child_caches_bytecode_apart_where_the_env_forbids_it_beside_uncompiled_sources(
        dont_write, prefix, installed_with_bytecode, expect, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(paths, "has_bytecode", lambda package: installed_with_bytecode)
    for name, value in (("PYTHONDONTWRITEBYTECODE", dont_write), ("PYTHONPYCACHEPREFIX", prefix)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    out = []
    child = launch.start(py("import os, sys; print(sys.flags.dont_write_bytecode, "
                            "os.environ.get('PYTHONPYCACHEPREFIX'))"), on_stdout=out.append)
    assert child.wait() == 0
    assert out == [expect.format(cache=tmp_path / "zl_bench" / "pycache") + "\n"]


def test_has_bytecode_looks_beside_the_source_without_importing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("zl_plain", "zl_compiled"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise RuntimeError('imported')\n")
    py_compile.compile(str(tmp_path / "zl_compiled" / "__init__.py"), doraise=True)
    assert not paths.has_bytecode("zl_plain") and paths.has_bytecode("zl_compiled")
    assert paths.has_bytecode("zl_not_installed")  # nothing there to compile


def test_visible_narrows_the_child_to_its_one_device(monkeypatch):
    backend = next(b for b in map(backends.get, backends.NAMES) if b.visibility_key)
    others = sorted(set(backends.base.ALL_VISIBILITY_KEYS) - {backend.visibility_key})
    monkeypatch.setenv(others[0], "0,1")
    monkeypatch.setenv(backend.visibility_key, "0,1,2,3")
    out = []
    child = launch.start(py(f"""
        import os
        print(os.environ.get({backend.visibility_key!r}), os.environ.get({others[0]!r}))
        """), on_stdout=out.append, visible=(backend, 3))
    assert child.wait() == 0
    assert out == ["3 None\n"]


def test_pipes_keep_stdout_and_stderr_apart():
    out, err = [], []
    child = launch.start(py("""
        import sys
        for i in range(3):
            print("out", i, flush=True)
            print("err", i, file=sys.stderr, flush=True)
        """), on_stdout=out.append, on_stderr=err.append)
    assert child.wait() == 0  # every line is in once it returns
    assert out == ["out 0\n", "out 1\n", "out 2\n"] and err == ["err 0\n", "err 1\n", "err 2\n"]


def test_own_group_or_ours():
    out = []
    child = launch.start(py("import os; print(os.getpgid(0))"), on_stdout=out.append)
    assert child.wait() == 0 and out == [f"{child.pid}\n"]
    out.clear()
    child = launch.start(py("import os; print(os.getpgid(0))"), on_stdout=out.append, own_group=False)
    assert child.wait() == 0 and out == [f"{os.getpgid(0)}\n"]


def test_stop_kills_what_is_left_of_the_group_once_its_leader_ended():
    out = []
    child = launch.start(py("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        ignores = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
                   "time.sleep(60)")
        grandchild = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE)
        grandchild.stdout.readline()
        print(grandchild.pid, flush=True)
        time.sleep(60)
        """), on_stdout=out.append)
    assert wait_for(lambda: out, 30)
    grandchild = int(out[0])
    assert child.stop(grace_s=20) == 0
    assert wait_for(lambda: not alive(grandchild), 10), "the group outlived its leader"


def test_stop_kills_a_child_once_the_grace_ran_out():
    out = []
    child = launch.start(py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """), on_stdout=out.append)
    assert wait_for(lambda: out, 30)
    start = time.monotonic()
    assert child.stop(grace_s=1.0) == -signal.SIGKILL
    assert time.monotonic() - start >= 1.0  # the grace was given


def test_stop_lets_a_child_that_handles_the_signal_end_on_its_own():
    out = []
    child = launch.start(py("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))
        print("ready", flush=True)
        time.sleep(60)
        """), on_stdout=out.append)
    assert wait_for(lambda: out, 30)
    assert child.stop(grace_s=20) == 5


def test_a_timed_out_wait_says_so_and_leaves_the_child_running():
    child = launch.start(py("import time; time.sleep(60)"))
    assert child.wait(0.2) is None and alive(child.pid)
    child.kill()
    assert child.wait() == -signal.SIGKILL


@pytest.mark.parametrize("with_parent", [True, False])
def test_a_child_dies_with_its_parent_even_by_sigkill(with_parent):
    parent = subprocess.Popen(py(f"""
        import sys, time
        from harness.core import launch, paths
        child = launch.start([sys.executable, "-c", "import time; time.sleep(60)"], log=open("/dev/null", "w"),
                             with_parent={with_parent})
        print(child.pid, flush=True)
        time.sleep(60)
        """), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.communicate()
    try:
        # Without it the child lives on: the promise is the launcher's, not an accident.
        assert wait_for(lambda: not alive(child), 10 if with_parent else 2) is with_parent
    finally:
        if alive(child):
            os.killpg(child, signal.SIGKILL)


COUNTS_SIGINT = """
    import signal, sys, time
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))
    print("ready", flush=True)
    while not got:
        time.sleep(0.05)
    time.sleep(3)  # a second SIGINT to the parent meanwhile must not reach us
    print("SIGINTs:", len(got), flush=True)
    sys.exit(7)
    """


def test_run_forwards_the_first_signal_and_waits_for_the_child():
    out, forwarded = [], []

    def on_stdout(line):
        out.append(line)
        if line == "ready\n":
            os.kill(os.getpid(), signal.SIGINT)  # reaches this (main) thread, inside run

    def on_stop(signum):
        forwarded.append(signum)
        # A second Ctrl-C during the grace: handled as run waits again (sent from here, not a timer thread,
        # which on a loaded machine could come after run had ended and put back the previous handler).
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.getsignal(signal.SIGINT)
    code, signum = launch.run(py(COUNTS_SIGINT), grace_s=30, on_stop=on_stop, on_stdout=on_stdout)
    assert (code, signum, forwarded) == (7, signal.SIGINT, [signal.SIGINT])
    assert out == ["ready\n", "SIGINTs: 1\n"]
    assert signal.getsignal(signal.SIGINT) is previous  # our own handling ends with the child


def test_run_forwards_a_signal_that_came_before_the_child_existed(monkeypatch):
    real_start = launch.start

    def start_after_a_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled by run's handler: no child to forward it to yet
        return real_start(*args, **kwargs)

    monkeypatch.setattr(launch, "start", start_after_a_signal)
    started = time.monotonic()
    code, signum = launch.run(py("import time; time.sleep(60)"), grace_s=30)
    assert (code, signum) == (-signal.SIGTERM, signal.SIGTERM)
    assert time.monotonic() - started < 30


def test_a_signal_that_comes_after_the_childs_end_was_seen_is_not_lost(monkeypatch, pythons_ctrl_c):
    """It came while run ended the child's orphans, its own handler still in place: it reaches the handler
    run found (here Python's Ctrl-C), as if it came just after run returned. Lost, an A/B whose step
    ended as the Ctrl-C or SIGTERM came went on to its next step and never stopped."""
    real_end_orphans = launch.end_orphans

    def orphans_ended_as_a_signal_comes():
        os.kill(os.getpid(), signal.SIGINT)
        real_end_orphans()

    monkeypatch.setattr(launch, "end_orphans", orphans_ended_as_a_signal_comes)
    with pytest.raises(KeyboardInterrupt):
        launch.run(py("pass"), grace_s=30)


def test_a_stop_held_off_while_the_child_started_ends_that_child_when_it_is_handled(monkeypatch, pythons_ctrl_c):
    """A Ctrl-C that came during the Popen (held off there, so that none strikes between the fork and the
    handle) is handled as the mask lifts: the child is killed and reaped there, its pipe closed, not left
    running where no caller has its handle (and end_orphans skips what start counts as its own)."""
    popen = subprocess.Popen
    started = []

    def popen_as_a_ctrl_c_comes(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        # To this (the main) thread, which start holds SIGINT off in: a signal to the process could go to
        # another thread (pytest-xdist's), which holds nothing off (start's with_parent is for processes
        # without other threads).
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return started[-1]

    monkeypatch.setattr(launch.subprocess, "Popen", popen_as_a_ctrl_c_comes)
    with pytest.raises(KeyboardInterrupt):
        launch.start(py("import time; time.sleep(60)"), on_stdout=lambda line: None, with_parent=True)
    [proc] = started
    assert proc.returncode == -signal.SIGKILL and proc.stdout.closed
    assert proc.pid not in launch.children()


def test_a_stop_during_a_deferred_cleanup_is_taken_once_it_ends_and_a_thread_defers_nothing(pythons_ctrl_c):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with launch.stops_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # a third, impatient: still one stop
            time.sleep(0.1)  # where it would have struck
            done.append("cleaned up")
    assert done == ["cleaned up"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # Off the main thread no handler can be set: the cleanup runs as it would without it.
    errors = []

    def in_a_thread():
        try:
            with launch.stops_deferred():
                done.append("thread")
        except Exception as exc:  # noqa: BLE001 - what the assertion below shows
            errors.append(exc)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(10)
    assert errors == [] and done[-1] == "thread"


def test_run_kills_a_child_that_outlives_the_grace():
    out, killed = [], []

    def on_stdout(line):
        out.append(line)
        os.kill(os.getpid(), signal.SIGTERM)

    code, signum = launch.run(py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """), grace_s=1, on_kill=lambda: killed.append(1), on_stdout=on_stdout)
    assert (code, signum, killed) == (-signal.SIGKILL, signal.SIGTERM, [1])


def test_run_passes_a_signal_it_does_not_forward_on_and_leaves_no_child(pythons_ctrl_c):
    out = []

    def on_stdout(line):
        out.append(line)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        launch.run(py("""
            import os, time
            print(os.getpid(), flush=True)
            time.sleep(60)
            """), grace_s=30, forward=(signal.SIGTERM,), on_stdout=on_stdout)
    assert not alive(int(out[0]))


def test_a_call_is_forked_into_its_own_group_with_its_environment_and_output():
    # Written to the descriptors: pytest's capture holds sys.stdout, which a fork inherits as is.
    def call():
        os.write(1, f"{os.getpgid(0) == os.getpid()} {os.environ.get('ZL_X')} {os.getcwd()}\n".encode())
        os.write(2, b"err\n")
        return 3

    out, err = [], []
    child = launch.start(["(a fork)"], call=call, on_stdout=out.append, on_stderr=err.append, env={"ZL_X": "1"})
    assert child.wait() == 3
    assert out == [f"True 1 {REPO_ROOT}\n"] and err == ["err\n"]
    assert "ZL_X" not in os.environ  # the child's environment, not ours


def test_run_forwards_a_ctrl_c_to_a_forked_call_whose_handlers_are_pythons_own():
    def call():
        os.write(1, b"ready\n")
        time.sleep(60)
        return 0

    def on_stdout(line):
        if line == "ready\n":
            os.kill(os.getpid(), signal.SIGINT)  # while run waits: its handler must not be the child's

    code, signum = launch.run(["(a fork)"], grace_s=30, call=call, on_stdout=on_stdout)
    assert (code, signum) == (128 + signal.SIGINT, signal.SIGINT)


def test_a_stop_signal_is_known_to_every_thread_as_it_arrives_before_the_main_threads_handler_runs():
    """stops_on_signals: a thread deciding whether to start something sees a SIGINT or SIGTERM that reached
    the process while the main thread has not run its handler yet (it is held here in a handler of its own);
    another signal is no stop; outside the context nothing is."""
    assert launch.stop_signal_arrived() is False
    seen, went_on = [], threading.Event()

    def usr1(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGUSR1, usr1)
    try:
        with launch.stops_on_signals():
            os.kill(os.getpid(), signal.SIGUSR1)
            assert launch.stop_signal_arrived() is False  # a signal, not a stop
            # The SIGTERM lands on the other thread, which asks at once; the main thread, blocked in its join,
            # runs the Python handler only once the join returns.
            answer = []

            def ask():
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
                answer.append(launch.stop_signal_arrived())
                went_on.set()

            t = threading.Thread(target=ask)
            with pytest.raises(launch.Stopped):
                t.start()
                t.join()
                time.sleep(5)  # the handler raises before this ends
            t.join()
            assert answer == [True] and went_on.is_set()
            assert launch.stop_signal_arrived() is True  # it stays known
        assert launch.stop_signal_arrived() is False  # the context's own: gone with it
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1]


def test_a_stop_that_comes_during_a_gated_start_is_said_before_the_child_is_waited_for():
    # A warm worker may still be importing when the stop comes: the user hears of it at once, not once the
    # worker has forked the child that reads its gate closed.
    order: list[str] = []

    class Late:
        def wait(self, timeout=None):
            order.append("waited")
            return -signal.SIGINT

    def starter(argv, gate):
        os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C arrives while the child is being started
        return Late()

    code, signum = launch.run(["(a warm worker's step)"], grace_s=5, starter=starter, gated=True,
                              on_stop=lambda s: order.append(f"said {signal.Signals(s).name}"))
    assert (code, signum) == (-signal.SIGINT, signal.SIGINT)
    assert order == ["said SIGINT", "waited"]


def test_a_forked_childs_exit_is_not_lost_to_a_handler_that_raises_as_it_is_read(monkeypatch):
    """A signal handler that raises (launch.run's Ctrl-C) between reading a forked child's exit and keeping it:
    the next wait still gives the exit, where a reap before the keep would have lost it (ECHILD)."""
    child = launch.start(["(a fork)"], call=lambda: 3)
    waitid, interrupted = os.waitid, []

    def read_then_interrupted(*args):
        found = waitid(*args)
        if found is not None and found.si_pid and not interrupted:
            interrupted.append(found.si_pid)
            raise KeyboardInterrupt
        return found

    monkeypatch.setattr(os, "waitid", read_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        child.wait()
    assert interrupted == [child.pid] and child.wait() == 3


def test_a_forked_childs_exit_kept_before_a_handler_raised_as_it_was_reaped_is_given(monkeypatch):
    child = launch.start(["(a fork)"], call=lambda: os.kill(os.getpid(), signal.SIGKILL))
    waitpid = os.waitpid

    def reaped_then_interrupted(pid, options):
        found = waitpid(pid, options)
        if found[0]:  # reaped: the handler raises before the reap is known
            monkeypatch.setattr(os, "waitpid", waitpid)
            raise KeyboardInterrupt
        return found

    monkeypatch.setattr(os, "waitpid", reaped_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        child.wait()
    assert child.wait() == -signal.SIGKILL
