import os
import signal
import sys

from harness.core import launch

# What an operator starts and leaves running (a server, a `sleep`, one that called setsid) is ours to
# end with the run, not init's to keep.
launch.adopt_orphans()
try:
    from harness.child.runner import main

    code = main(sys.argv[1:])
except KeyboardInterrupt:
    # A Ctrl-C before the run's own signal handlers are in place (importing torch, pytest or an
    # operator module): the parent, which got it too, says so and records the outcome; a traceback
    # here would only bury that.
    code = 128 + signal.SIGINT
finally:
    launch.end_orphans()
# Every file the run writes is complete by now, and the parent reads only those and the exit code:
# skip the interpreter's teardown (module, CUDA and profiler finalizers), ~0.8 s a step on an H200 host.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
