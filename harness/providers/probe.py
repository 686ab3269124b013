"""What operators declare (name, dtypes, shape keys, dims, provider), learned by importing their
modules in a child process under a timeout. A session needs these facts before anything runs, but
an --ops-path module is user code: one that waits forever, exits (os._exit) or kills its process
while it imports must not take the session along, silently or for ever.

`python -m harness.providers.probe REQUEST_JSON` is the child: it says on its own stdout (the
module's prints go to stderr) which module it is importing, then each operator's facts or error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from harness.core import launch
from harness.providers import registry

# Long enough for a module that compiles or downloads at import; a batch narrows it to its
# --op-timeout, but never below IMPORT_FLOOR_S: importing torch alone takes seconds on a busy host.
IMPORT_TIMEOUT_S = 300.0
IMPORT_FLOOR_S = 30.0


def budget(op_timeout: float) -> float:
    """The import budget of ops that run under `op_timeout` each."""
    return min(IMPORT_TIMEOUT_S, max(op_timeout, IMPORT_FLOOR_S))


@dataclasses.dataclass(frozen=True)
class OperatorFacts:
    """What a session reads of an operator (the child loads the operator itself)."""

    name: str
    dtypes: tuple[str, ...]
    shape_keys: tuple[str, ...]
    dims: tuple[str, ...] | None


def load(names: list[str], ops_paths: list[str], timeout: float = IMPORT_TIMEOUT_S
         ) -> tuple[dict[str, tuple[OperatorFacts, str] | registry.OperatorNotFound], list[str]]:
    """({name: (facts, provider) or the OperatorNotFound that registry.load raised}, warning lines
    about modules skipped). OperatorNotFound when importing the modules itself did not end well:
    it outlasted `timeout`, or its process ended without saying anything more."""
    said: list[dict] = []
    err_tail: list[str] = []

    def on_stdout(line: str) -> None:
        try:
            said.append(json.loads(line))
        except ValueError:
            pass  # nothing but our own JSON lines reach this stream

    def on_stderr(line: str) -> None:
        err_tail[:] = [*err_tail[-4:], line.rstrip()]

    request = json.dumps({"names": names, "ops_paths": ops_paths})
    child = launch.start([sys.executable, "-m", "harness.providers.probe", request],
                         on_stdout=on_stdout, on_stderr=on_stderr)
    try:
        code = child.wait(timeout)
        if code is None:
            child.kill()
            child.wait()
    except BaseException:  # a Ctrl-C: the probe goes with this process
        child.kill()
        child.wait()
        raise
    done = next((m for m in said if "done" in m), None)
    importing = [m["importing"] for m in said if "importing" in m]
    if done is None:
        where = f"--ops-path module {importing[-1]}" if importing else "the operator probe"
        if code is None:
            raise registry.OperatorNotFound(f"{where} did not finish importing in {timeout:.0f} s (does it wait "
                                            "or loop at import?); nothing was run")
        last = next((line for line in reversed(err_tail) if line.strip()), "")
        raise registry.OperatorNotFound(
            f"{where} ended its process while importing ({launch.describe_exit(code)}); an operator module must "
            f"not exit or kill its process at import" + (f" (its last line: {last[:200]})" if last else ""))
    found: dict = {}
    for m in said:
        if "facts" in m:
            found[m["op"]] = (OperatorFacts(**{k: tuple(v) if isinstance(v, list) else v
                                               for k, v in m["facts"].items()}), m["provider"])
        elif "error" in m:
            found[m["op"]] = registry.OperatorNotFound(m["error"])
    return found, done["warnings"]


def main(request: dict) -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a module's own prints must not be read as ours

    def say(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    warnings: list[str] = []
    for entry in request["ops_paths"]:
        try:
            modules = list(registry.user_modules(entry))
        except registry.OperatorNotFound:
            continue  # registry.load says so, per operator
        for where, importer in modules:
            say({"importing": where})
            try:
                importer()
            except registry.ImportFailed:
                pass  # registry.load reports it, once per operator that needs it
    for name in request["names"]:
        try:
            op, provider = registry.load(name, request["ops_paths"], warn=warnings.append)
        except registry.OperatorNotFound as exc:
            say({"op": name, "error": str(exc)})
            continue
        say({"op": name, "provider": provider, "facts": {
            "name": op.name, "dtypes": list(op.dtypes), "shape_keys": list(op.shape_keys),
            "dims": None if op.dims is None else list(op.dims)}})
    say({"done": True, "warnings": warnings})


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except KeyboardInterrupt:
        sys.exit(130)  # its session says so; a traceback here would only bury that
    sys.stdout.flush()
    os._exit(0)  # a module's threads or atexit hooks do not hold the session up
