"""`python -m harness ...`, as the nox sessions run it, and the `zl-bench` command of an editable
install (pyproject.toml). Started without nox, it finds the light packages a session installed into
this checkout's .nox/deps; one it still lacks is one line, not an import traceback."""

import signal
import sys


def _run() -> int:
    from harness.core import deps, paths

    if not paths.SHAPES_DIR.is_dir():
        # Run dirs, shapes and operators are found beside the sources: a copy in site-packages has none.
        print(f"error: zl_bench runs from its checkout, and {paths.REPO_ROOT} has no shapes/ (not an editable "
              "install?): pip install -e CHECKOUT", file=sys.stderr)
        return 2
    deps.use_deps_dir()
    missing = deps.missing(deps.needed(sys.argv[1] if len(sys.argv) > 1 else None))
    if missing:
        names = " ".join(missing)
        print(f"error: python -m harness needs {names} (missing here); run any nox session once (it installs them "
              f"into .nox/deps) or: pip install {names}", file=sys.stderr)
        return 2
    from harness.cli import main  # after the check: it imports those packages

    return main()


def main() -> None:
    # Handled whatever the process inherited: a job started with SIGINT ignored (nohup, a background
    # job of a script) would ignore a Ctrl-C while starting up, yet answer it once launch.run, which
    # installs its own handler, runs the child: one answer in every phase.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # Imported here, under the handler: a Ctrl-C while the harness imports is one line too.
        from harness.core import launch

        # The nox session that runs us names itself: we stop (as on SIGTERM) when it dies, never outliving it.
        launch.end_with_starter()
        launch.adopt_orphans()  # what our children leave running ends with their step (launch.run)
        sys.exit(_run())
    except KeyboardInterrupt as exc:
        # A Ctrl-C (or a SIGTERM raised as one: launch.Stopped) where no command handles it: while
        # starting up, resolving what to run, importing an operator. Sessions that had started
        # something said what they kept before this.
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        sys.exit(128 + signum)


if __name__ == "__main__":
    main()
