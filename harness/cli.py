"""`python -m harness record|replay|ab|batch|inventory-regen|bisect|compare-ir ...`: what the nox
sessions run. This module declares the options, turns what was parsed into the command's one frozen
request (harness.core.commands; record and replay: harness.core.request.RunRequest) and dispatches it to
harness.sessions (resolve a run spec, run it, A/B, batch, bisect, inventory regeneration): no session
sees the argparse namespace.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from harness.core import commands, options, rundir
from harness.core.errors import UsageError, clip_words
from harness.core.request import RunRequest
from harness.sessions import resolve

DEFAULT_OP = "softmax"
DESCRIPTION = ("Operator-level A/B performance testing for Triton compiler changes: the commands that the nox "
               "sessions run (`nox -s record -- ARGS` is `python -m harness record ARGS`).")
# Per command: (the one line `--help` lists it by, the description its own `--help` opens with).
COMMANDS = {
    "record": ("run one operator, sweep autotune, archive everything",
               "Run one operator over its shapes: sweep its autotuned kernels, measure every case, and archive "
               "the chosen configs, the shapes, the IR and the results in a new run dir (runs/<op>_<ts>/)."),
    "replay": ("rerun a record run with its configs, shapes and seeds pinned",
               "Rerun a record run with its autotune configs, shapes, dtypes, seed and timer pinned, into a new "
               "run dir next to it: what differs from the record is the compiler."),
    "ab": ("A records, A and B replay A's configs, interleaved; compare with statistics",
           "Compare two compilers (or two settings of one): A records once, then A and B replay A's configs in "
           "fresh processes, interleaved, N repeats; per-row verdicts and a report. With a batch option (--all, "
           "--devices, --resume, ...) it is a corpus A/B: each op's whole A/B on one device, ops spread over "
           "devices. --compare reports on two existing run or batch dirs."),
    "batch": ("screen many operators across devices, isolated, with retries and resume",
              "Screen many operators, each in its own process on one device, with per-op timeouts, retries and "
              "resume; per-op run dirs, ops_status.csv and summary.csv in the batch dir."),
    "inventory-regen": ("rebuild ops/inventory_<repo>.csv by a static scan of the built-in operators or of "
                        "FlagGems checkouts",
                        "Rebuild ops/inventory_<repo>.csv by a static scan (nothing is imported) of the built-in "
                        "operators, or of the FlagGems checkouts given with --flaggems-dir."),
    "bisect": ("find the first build in an ordered list (or a git range) at which rows moved",
               "Find, for a set of rows (an A/B's FASTER/SLOWER rows, or every row of --ops), the first build in "
               "an ordered list (--builds FILE, or --git-range with --build-cmd) at which they moved: the first "
               "build records once, each probe is an A/B replaying that record, and each boundary is confirmed "
               "by a final A/B of the last good build against the first bad one."),
    "compare-ir": ("compare the IR of two run dirs, per launched variant",
                   "Compare the IR of two run dirs per launched variant: identical, changed (naming the stages "
                   "that differ) or only in one; then what each changed variant's kernel statistics changed."),
}


def _add_common(parser: argparse.ArgumentParser, command: str, named: str | None = None,
                records: str | None = None) -> None:
    """The run options `command` takes (harness.core.options declares them), in their groups, and
    where its output goes. `named`: what --run-dir names for this command (None: it takes no
    --run-dir). `records`: for a session that starts records (batch, ab), which ones the
    measurement options reach."""
    groups = {key: parser.add_argument_group(options.GROUPS[key]) for key in ("where", "what", "flaggems")}
    out = parser.add_argument_group("output")
    where_out = out.add_mutually_exclusive_group() if named else out
    where_out.add_argument("--out", metavar="DIR", type=options.DIR_PATH, default=None,
                           help="parent of the run dir (default: runs/)")
    if named:
        where_out.add_argument("--run-dir", dest="named_run_dir", metavar="DIR", type=Path, default=None,
                               help=f"{named} itself, new or empty (created and claimed atomically; refused when it "
                                    "holds anything): for a session that reads back what it started (default: a new "
                                    "one under --out)")
    out.add_argument("--no-ir", dest="ir", action="store_false",
                     help="do not collect per-shape TTGIR (collected by default where the compiler allows)")
    out.add_argument("--no-precompile", dest="precompile", action="store_false",
                     help="compile each autotune config inside its sweep, one after another, as Triton alone "
                          "does (default: compiled in parallel before the sweep where the backend compiles)")
    out.add_argument("--triton-cache", metavar="DIR", type=options.DIR_PATH, default=None,
                     help="compile into DIR and keep it, instead of a private cache removed after the run; for "
                          "several runs of one compiler (the A/B gives each side its own) (default: private)")
    # An A/B's own: its chunked timed steps hand their child to the side's host (harness.child.host).
    out.add_argument("--measuring-host", metavar="SOCKET", type=Path, default=None, help=argparse.SUPPRESS)
    # An A/B's own: the lock of the device its steps share (harness.measure.device_gate).
    out.add_argument("--device-gate", metavar="FILE", type=Path, default=None, help=argparse.SUPPRESS)
    out.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                     help="terminal colour (run.log is always plain) (default: auto)")
    if command in ("record", "replay"):
        only = parser.add_mutually_exclusive_group()  # RunSpec.only: one of them, or everything
        only.add_argument("--timing-only", dest="only", action="store_const", const="timing",
                          help="time the rows only: no IR, no per-kernel attribution (the profiler pass); for a "
                               "repeat whose one-off passes another run of the same compiler carried (default: off)")
        only.add_argument("--passes-only", dest="only", action="store_const", const="passes",
                          help="the one-off passes only (IR, per-kernel attribution), the rows timed at a token "
                               "budget that only sizes the profiler pass: their timings are for no comparison; "
                               "for the run that carries the passes of repeats timed elsewhere (default: off)")
        if command == "record":
            only.add_argument("--configs-only", dest="only", action="store_const", const="configs",
                              help="the autotune picks only: no IR, no attribution, the rows timed at the token "
                                   "budget (their timings are for no comparison); for a record whose configs "
                                   "replays time elsewhere, as an A/B's (default: off)")
    how = options.GROUPS["how"] + (f" ({records})" if records else "")
    # A replay's record-only options are refused by name: they need no group of their own in its help.
    groups["how"] = parser.add_argument_group(how) if command != "replay" else parser
    options.RunOptions.add_arguments(groups, command)


def _add_corpus(sel, run_, command: str) -> None:
    """The selection and running options that batch and a corpus A/B share."""
    options.BatchOptions.add_arguments({"running": run_}, command, ("devices", "op_timeout"))
    options.CorpusOptions.add_arguments({"selection": sel, "running": run_}, command)


PROG = "python -m harness"


class _Parser(argparse.ArgumentParser):
    """The top-level parser. An argument its command does not take is that command's error, said with
    its usage (not the top-level one) and the option nearest to each unknown one; `commands` maps each
    command to its parser."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(namespace.command, self)
            command.error(f"unrecognized arguments: {' '.join(extras)}{_nearest(command, extras)}")
        return namespace


def _nearest(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """` (did you mean --backend?)`: the options in `parser`'s usage nearest to the unknown ones."""
    # Compared without their dashes, which every option shares.
    known = {flag.lstrip("-"): flag for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", parser.format_usage())}
    guesses = [known[match] for arg in unknown if arg.startswith("-")
               for match in difflib.get_close_matches(arg.split("=", 1)[0].lstrip("-"), known, n=1)]
    return f" (did you mean {' or '.join(dict.fromkeys(guesses))}?)" if guesses else ""


def _prog() -> str:
    """What was typed to run this: `python -m harness` (as the nox sessions run it), or the command of
    an editable install (`zl-bench`)."""
    name = Path(sys.argv[0]).name
    return PROG if name == "__main__.py" else name


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=DESCRIPTION)
    # Not required: with no command, main shows this help.
    sub = parser.add_subparsers(dest="command", parser_class=argparse.ArgumentParser)
    parser.commands = sub.choices

    def command(name: str) -> argparse.ArgumentParser:
        summary, description = COMMANDS[name]
        return sub.add_parser(name, help=summary, description=description)

    rec = command("record")
    rec.add_argument("op", nargs="?", default=DEFAULT_OP,
                     help=f"built-in operator, REPO:OP[@FILE] of a FlagGems checkout, or a pytest node "
                          f"PATH/benchmark/test_x.py::test_op (default: {DEFAULT_OP})")
    _add_common(rec, "record", "the run dir")
    rec.add_argument("--sweep-devices", type=int, metavar="N", default=0,
                     help="sweep autotune in parallel over the first N visible devices, then measure serially "
                          "on one (default: 0, a serial sweep)")
    rep = command("replay")
    rep.add_argument("run_dir", type=Path, nargs="?", default=None,
                     help="the record run dir to replay (default: the newest record run under --out)")
    _add_common(rep, "replay", "the run dir")
    rep.add_argument("--sweep-devices", action=options.RecordOnly)
    rep.add_argument("--case", dest="cases", metavar="ID", action="append", default=None,
                     help="replay only this case of the record, by its id (a row's `case` in results.json) "
                          "(repeatable; default: every case)")
    ab = command("ab")
    ab.add_argument("plan", type=Path, nargs="?", default=None,
                    help="plan yaml (default: ops/ab_default.yaml unless --ops or --compare is given)")
    side = ab.add_argument_group(options.GROUPS["experiment"])
    side.add_argument("--ops", nargs="+", metavar="[REPO:]OP[@FILE]", default=None,
                      help="operators to compare (with a corpus option below: a batch selection)")
    options.ExperimentOptions.add_arguments({"experiment": side}, "ab")
    side.add_argument("--continue", dest="continue_from", type=options.DIR_PATH, metavar="AB_DIR", action="append",
                      default=[],
                      help="go on from an interrupted A/B of the same experiment: the completed steps of its ops are "
                           "taken over, not run again (repeatable; a corpus A/B's --resume gives each op's A/B its "
                           "last one)")
    # A corpus A/B's own, for a chunk of ops: each op's single-op view of the A/B (harness.sessions.corpus_ab).
    side.add_argument("--op-dir", dest="op_dirs", action="append", metavar="OP=DIR", default=[], help=argparse.SUPPRESS)
    side.add_argument("--compare", nargs=2, type=options.DIR_PATH, metavar=("DIR_A", "DIR_B"), default=None,
                      help="compare two existing run dirs, or two batch dirs (a corpus report: the corpus "
                           "screened under A, then under B), without running anything")
    # Any of these makes it a corpus A/B: each op's whole A/B is one batch job on one device.
    _add_corpus(ab.add_argument_group("corpus A/B: selection"), ab.add_argument_group("corpus A/B: running"), "ab")
    ab.set_defaults(summarize=None)
    _add_common(ab, "ab", "the A/B dir", "A's record of each op; the replays of both sides keep them; over the plan's")
    bat = command("batch")
    sel = bat.add_argument_group("selection")
    sel.add_argument("--ops", nargs="+", metavar="[REPO:]OP[@FILE]", default=None)
    run_ = bat.add_argument_group("running")
    _add_corpus(sel, run_, "batch")
    options.BatchOptions.add_arguments({"running": run_}, "batch", ("replay_root", "triage", "op_start"))
    run_.add_argument("--summarize", type=options.DIR_PATH, metavar="DIR", default=None,
                      help="only regenerate DIR/summary.csv from its per-op dirs")
    _add_common(bat, "batch", records="each op's record; --resume: the batch's unless given; not with --replay-root")
    inv = command("inventory-regen")
    inv.add_argument("--check", action="store_true", help="fail if the committed inventory is out of date")
    inv.add_argument("--flaggems-dir", metavar="[NAME=]PATH", action="append", default=None,
                     help="scan this FlagGems-style checkout's benchmark/ into ops/inventory_NAME.csv instead of the "
                          "built-in operators; NAME is `flaggems` when omitted (repeatable)")
    inv.add_argument("--verify-collect", action="store_true",
                     help="also run `pytest --collect-only` in each checkout and record per op whether pytest "
                          "collected it (column `collected`; without this option the previous values are kept)")
    inv.add_argument("--migrate-shapes", type=Path, metavar="IN", default=None,
                     help="instead of writing inventories: keep the keys of shape file IN that still name an op, "
                          "a Benchmark class or a family key, add the checkouts' core_shapes.yaml keys IN lacks, "
                          "write OUT, and the keys naming nothing to OUT's .unmatched.yaml")
    inv.add_argument("--out", type=Path, metavar="OUT", default=None, help="the migrated shape file")
    bis = command("bisect")
    what = bis.add_argument_group(options.GROUPS["bisect"])
    what.add_argument("--ops", nargs="+", metavar="[REPO:]OP[@FILE]", default=None,
                      help="bisect every row of these operators (the first build records them); or --from-ab")
    options.BisectOptions.add_arguments({"bisect": what}, "bisect")
    options.ExperimentOptions.add_arguments({"experiment": bis.add_argument_group(options.GROUPS["experiment"])},
                                            "bisect")
    options.RunOptions.add_arguments({key: bis.add_argument_group(options.GROUPS[key])
                                      for key in ("where", "what", "flaggems", "how")}, "bisect")
    bis_out = bis.add_argument_group("output").add_mutually_exclusive_group()
    bis_out.add_argument("--out", metavar="DIR", type=options.DIR_PATH, default=None,
                         help="parent of the bisect dir (default: runs/)")
    bis_out.add_argument("--run-dir", dest="named_run_dir", metavar="DIR", type=Path, default=None,
                         help="the bisect dir itself, new or empty (default: a new one under --out)")
    cmp_ = command("compare-ir")
    cmp_.add_argument("run_a", type=Path)
    cmp_.add_argument("run_b", type=Path)
    return parser


# --- the request, parsed once ------------------------------------------------------------------
def _tuple(value) -> tuple | None:
    return None if value is None else tuple(value)


def _selection(args: argparse.Namespace) -> commands.Selection:
    return commands.Selection(_tuple(args.ops), options.CorpusOptions.from_namespace(args))


def batch_request(args: argparse.Namespace) -> commands.BatchRequest:
    return commands.BatchRequest(run=options.RunOptions.from_namespace(args),
                                 how=options.BatchOptions.from_namespace(args), selection=_selection(args),
                                 out=args.out, summarize=args.summarize)


def ab_request(args: argparse.Namespace) -> commands.ABRequest:
    return commands.ABRequest(
        plan=args.plan, ops=_tuple(args.ops), experiment=options.ExperimentOptions.from_namespace(args),
        run=options.RunOptions.from_namespace(args), continue_from=tuple(args.continue_from),
        compare=_tuple(args.compare), out=args.out, run_dir=args.named_run_dir,
        op_dirs=tuple((op, Path(d)) for op, _, d in (item.partition("=") for item in args.op_dirs)),
        corpus=options.CorpusOptions.from_namespace(args), how=options.BatchOptions.from_namespace(args))


def inventory_request(args: argparse.Namespace) -> commands.InventoryRequest:
    return commands.InventoryRequest(check=args.check, flaggems_dirs=_tuple(args.flaggems_dir),
                                     verify_collect=args.verify_collect, migrate_shapes=args.migrate_shapes,
                                     out=args.out)


def bisect_request(args: argparse.Namespace) -> commands.BisectRequest:
    return commands.BisectRequest(bisect=options.BisectOptions.from_namespace(args),
                                  experiment=options.ExperimentOptions.from_namespace(args),
                                  run=options.RunOptions.from_namespace(args), ops=_tuple(args.ops), out=args.out,
                                  run_dir=args.named_run_dir)


def run_request(args: argparse.Namespace) -> RunRequest:
    """record or replay: the RunRequest a session would give the child that runs it."""
    replay = args.command == "replay"
    try:
        return RunRequest(
            args.command, args.run_dir if replay else args.op, options.RunOptions.from_namespace(args),
            sweep_devices=args.sweep_devices, ir=args.ir, only=args.only, precompile=args.precompile,
            color=args.color, out=args.out, run_dir=args.named_run_dir, triton_cache=args.triton_cache,
            measuring_host=args.measuring_host, device_gate=args.device_gate,
            cases=_tuple(args.cases) if replay else None)
    except ValueError as exc:  # a list of cases that is no list of distinct ids: as its session says it
        raise UsageError(str(exc)) from None


def request(args: argparse.Namespace):
    """The command's request, built from what its parser parsed (harness.core.commands)."""
    builders = {"record": run_request, "replay": run_request, "batch": batch_request, "ab": ab_request,
                "inventory-regen": inventory_request, "bisect": bisect_request}
    return builders[args.command](args)


def parse_request(argv: list[str]):
    """`python -m harness ARGV`'s request, without running it."""
    return request(build_parser().parse_args([str(a) for a in argv]))


# --- resolution ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = build_parser(_prog() if argv is None else PROG)
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `zl-bench`: what it does, not an error
        parser.print_help()
        return 0
    # Each command imports only what it needs: a replay's parent process stays free of torch,
    # scipy and matplotlib (seconds of start-up on every A/B and batch step).
    try:
        if args.command in ("record", "replay"):
            from harness.sessions import run

            asked = run_request(args)
            resolved = resolve.resolve_record(asked) if asked.command == "record" else resolve.resolve_replay(asked)
            return run.execute(*resolved, cache_dir=asked.triton_cache, named_dir=asked.run_dir,
                               host=asked.measuring_host)
        if args.command == "ab":
            from harness.sessions import ab, corpus_ab

            asked = ab_request(args)
            if asked.run_dir is not None and (asked.compare or corpus_ab.wanted(asked)):
                raise UsageError("--run-dir names the dir of one A/B run: --compare writes its report under --out, "
                                 "a corpus A/B into --batch-dir")
            if asked.compare:
                from harness.sessions import compare_batches  # the reports' modules: only to compare

                if compare_batches.names_batches(asked.compare):
                    return compare_batches.run_from_args(asked)
            if corpus_ab.wanted(asked):
                return corpus_ab.run_from_args(commands.CorpusABRequest.of(asked))
            return ab.run_from_args(asked)
        if args.command == "bisect":
            from harness.sessions.bisect import session

            return session.run_from_args(bisect_request(args))
        if args.command == "batch":
            from harness.sessions import batch

            return batch.run_from_args(batch_request(args))
        if args.command == "inventory-regen":
            from harness.sessions import inventory_regen

            return inventory_regen.regen_from_args(inventory_request(args))
        from harness.measure import ir
        from reports import explain

        code = ir.compare_from_args(args.run_a, args.run_b)
        for line in explain.compare_ir_lines(args.run_a, args.run_b):
            print(line)
        return code
    except UsageError as exc:  # its exit code: 2, or one of its own (DtypeRejected: 65)
        print(f"error: {clip_words(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # A path that cannot be written (--out on a file or a read-only mount, a full disk) is one
        # line; an OSError about no path is a bug, shown whole.
        # A failed write of a session's own (a report, ab.json, batch.json, a step's) exits as a run's does.
        fault = rundir.write_fault(exc)
        if fault is None and exc.filename is None:
            raise
        print(f"error: {fault or f'{exc.strerror}: {exc.filename}'}", file=sys.stderr)
        return rundir.EXIT_DISK_FULL if fault else 1
