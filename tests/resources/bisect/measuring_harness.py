"""`python -m harness ARGS` with the interpreter's host timings taken as performance numbers, for
the bisect tests: a bisect reads verdicts, and on the interpreter every verdict is n/a. The tests'
operator (knobbed.py) makes those timings mean something: its slow builds sleep several times longer
per call. Only this parent process is changed: it is where an A/B's verdicts are called."""

import dataclasses
import sys

from backends import interpreter
from harness import __main__ as harness_main

interpreter.BACKEND = dataclasses.replace(interpreter.BACKEND, measures_performance=True)

if __name__ == "__main__":
    sys.argv[0] = "harness"
    harness_main.main()
