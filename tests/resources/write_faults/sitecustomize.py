"""Test-only (tests/test_write_faults.py), on the PYTHONPATH of a harness process and its child: a seam in
the one function the harness opens a file for writing with (rundir.open_write). ZL_TEST_WRITE_LOG=FILE
lists each call in FILE as `ROLE N PATH` (ROLE: parent, the `python -m harness` process, or child, the
pytest child; N counts its calls); ZL_TEST_WRITE_FAULT=ROLE:N:ERRNO fails that call with that errno, and
ROLE:*:ERRNO:PART every call whose path holds PART (one file, in whichever process writes it)."""

import os

_FAULT = os.environ.get("ZL_TEST_WRITE_FAULT")
_LOG = os.environ.get("ZL_TEST_WRITE_LOG")

if _FAULT or _LOG:
    import errno
    import sys

    from harness.core import rundir

    _real = rundir.open_write
    _counts: dict[int, int] = {}  # by pid: a forked process counts its own calls from 1

    def open_write(path, how="a", binary=False):
        role = "child" if os.path.join("harness", "child") in sys.argv[0] else "parent"
        n = _counts[os.getpid()] = _counts.get(os.getpid(), 0) + 1
        if _LOG:
            with open(_LOG, "a") as f:
                f.write(f"{role} {n} {path}\n")
        want = _FAULT.split(":") if _FAULT else []
        if want and want[0] == role and (want[1] == str(n) or (want[1] == "*" and want[3] in str(path))):
            code = getattr(errno, _FAULT.split(":")[2])
            raise OSError(code, os.strerror(code), str(path))
        return _real(path, how, binary)

    rundir.open_write = open_write
