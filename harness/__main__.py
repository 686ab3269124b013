"""`python -m harness ...`, as the nox sessions run it. Started without nox, it finds the light
packages a session installed into this checkout's .nox/deps; one it still lacks is one line, not
an import traceback."""

import os
import sys

from harness.core import deps, launch

# The nox session that runs us names itself: we stop (as on SIGTERM) when it dies, never outliving it.
# Ours alone: a process we start has its own tie to us.
_session = os.environ.pop(launch.END_WITH_ENV, None)
if _session:
    launch.end_with(int(_session))
launch.adopt_orphans()  # what our children leave running ends with their step (launch.run)

deps.use_deps_dir()
_missing = deps.missing(deps.needed(sys.argv[1] if len(sys.argv) > 1 else None))
if _missing:
    names = " ".join(_missing)
    print(f"error: python -m harness needs {names} (missing here); run any nox session once (it installs them "
          f"into .nox/deps) or: pip install {names}", file=sys.stderr)
    sys.exit(2)

from harness.cli import main  # noqa: E402  (after the check: it imports those packages)

sys.exit(main())
