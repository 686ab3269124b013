"""`python -m harness record|replay|ab|batch|inventory-regen|compare-ir ...`: what the nox
sessions run. This module declares the options and dispatches to harness.sessions (resolve a run
spec, run it, A/B, batch, inventory regeneration).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import backends
from harness.core import rundir
from harness.core import spec as spec_mod
from harness.core.errors import UsageError
from harness.core.request import STEP_PASSES, STEP_STARTS
from harness.providers import flaggems
from harness.sessions import resolve
from ops import DTYPES_RULE, valid_dtype_list

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
    "compare-ir": ("compare the IR of two run dirs, per launched variant",
                   "Compare the IR of two run dirs per launched variant: identical, changed (naming the stages "
                   "that differ) or only in one; then what each changed variant's kernel statistics changed."),
}


def _dtype_list(text: str) -> list[str]:
    items = [d.strip() for d in text.split(",") if d.strip()]
    if not valid_dtype_list(items):
        raise argparse.ArgumentTypeError(f"{text!r} must be {DTYPES_RULE}, comma-separated")
    return items


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _nonneg_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _checkout(text: str) -> str:
    # Absolute now: the value travels into run specs and plans that processes read from other directories.
    return flaggems.absolute_dir(text, Path.cwd())


def _libtuner_cache(text: str) -> str:
    return flaggems.absolute_libtuner_cache(text, Path.cwd())


def _add_common(parser: argparse.ArgumentParser, named: str | None = None) -> None:
    """`named`: what --run-dir names for this command (None: it takes no --run-dir)."""
    where = parser.add_argument_group("where to run")
    where.add_argument("--backend", metavar="NAME", default=None,
                       help=f"{'|'.join(backends.NAMES)} or an alias (default: the accelerator found; "
                            "replay: the recorded one)")
    where.add_argument("--device", metavar="N", type=int, default=None,
                       help="device index (default: the first visible device)")
    what = parser.add_argument_group("what to run")
    what.add_argument("--shapes", metavar="FILE", type=Path, default=None,
                      help="shape yaml (default: shapes/<backend default>; replay: the recorded shapes; FlagGems "
                           "ops: `upstream`, the checkout's own, by default)")
    what.add_argument("--dtypes", metavar="LIST", type=_dtype_list, default=None,
                      help="comma-separated subset of fp16,bf16,fp32 (default: the shape file's, else the op's)")
    fg = parser.add_argument_group("FlagGems benchmark checkouts (operators named REPO:OP[@FILE] or a pytest node)")
    fg.add_argument("--flaggems-dir", metavar="[NAME=]PATH", action="append", default=None, type=_checkout,
                    help="a FlagGems-style checkout (benchmark/ and src/); NAME is the repo prefix of its "
                         "operators, `flaggems` when omitted (repeatable)")
    fg.add_argument("--level", choices=("core", "comprehensive"), default=None,
                    help="upstream --level, recorded; replays keep the recorded one (default: core)")
    fg.add_argument("--flagtune", choices=("0", "1"), default=None,
                    help="FlagGems' USE_FLAGTUNE switch, recorded; replays keep the recorded one "
                         "(default: $USE_FLAGTUNE, else 0)")
    fg.add_argument("--libtuner-cache", metavar="private|user|URL", default=None, type=_libtuner_cache,
                    help="LibTuner's persistent config cache: a fresh one in the run dir (private, the default), "
                         "FlagGems' own (user), or a sqlite path/URL; recorded in run.json")
    what.add_argument("--ops-path", metavar="PATH", action="append", default=None,
                      help="extra operator definitions: a directory of modules, a .py file or a module "
                           "name (repeatable)")
    out = parser.add_argument_group("output")
    where_out = out.add_mutually_exclusive_group() if named else out
    where_out.add_argument("--out", metavar="DIR", type=Path, default=None,
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
    out.add_argument("--triton-cache", metavar="DIR", type=Path, default=None,
                     help="compile into DIR and keep it, instead of a private cache removed after the run; for "
                          "several runs of one compiler (the A/B gives each side its own) (default: private)")
    out.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                     help="terminal colour (run.log is always plain) (default: auto)")


def _add_timing_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timing-only", action="store_true",
                        help="time the rows only: no IR, no per-kernel attribution (the profiler pass); for a "
                             "repeat whose one-off passes another run of the same compiler carried (default: off)")


def _add_measurement(parser: argparse.ArgumentParser, records: str = "") -> None:
    """`records`: for a session that starts records (batch, ab), which ones these options reach; its
    defaults are None, so that only what is given is passed on (and a resume keeps what was stored)."""
    how = parser.add_argument_group("how to measure" + (f" ({records})" if records else ""))
    default = (lambda value: None) if records else (lambda value: value)
    how.add_argument("--seed", metavar="N", type=int, default=default(0),
                     help="seed for random/numpy/torch (default: 0)")
    how.add_argument("--timer", choices=spec_mod.TIMERS, default=default("auto"),
                     help="auto: graph where the backend can capture, else direct; profiler: the device "
                          "profiler's summed kernel time per call (default: auto)")
    how.add_argument("--l2", choices=spec_mod.L2_MODES, default=default("warm"),
                     help="warm: calls reuse what the last left in the device L2; cold: flush it before every "
                          "call (default: warm)")
    how.add_argument("--warmup-ms", metavar="MS", type=_nonneg_float, default=None,
                     help="warmup budget per measurement (default: the backend's, 25 on GPUs)")
    how.add_argument("--rep-ms", metavar="MS", type=_nonneg_float, default=None,
                     help="timing budget per measurement (default: the backend's, 100 on GPUs)")


class _RecordOnly(argparse.Action):
    """A record's measurement option given to replay: refused by name, not as an unknown argument."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is record-only: a replay measures as its record did (run.json spec); "
                     "record again to change it")


def _add_corpus(sel, run_) -> None:
    """The selection and running options that batch and a corpus A/B share."""
    sel.add_argument("--all", action="store_true", help="the whole inventory, minus skip marks and ops/dismiss.txt")
    sel.add_argument("--ops-file", type=Path, metavar="FILE", default=None, help="one selection entry per line")
    sel.add_argument("--repos", nargs="+", metavar="REPO", default=None, help="only these inventories")
    sel.add_argument("--sample", type=int, metavar="N", default=None,
                     help="a seeded random sample of N ops from the selection (after exclusions)")
    sel.add_argument("--sample-seed", type=int, metavar="S", default=0,
                     help="the sample's seed (default 0): the same seed and inventory pick the same ops")
    run_.add_argument("--devices", metavar="LIST", default=None,
                      help="comma-separated device indices (default: the backend's visible devices)")
    run_.add_argument("--op-timeout", type=_positive_float, metavar="S", default=None,
                      help="per-op timeout in seconds; the op's process group is killed (default: 1800; "
                           "--resume: the batch's)")
    run_.add_argument("--resume", action="store_true",
                      help="rerun only ops not PASS/SKIP in --batch-dir, with the selection and options stored "
                           "there unless given again")
    run_.add_argument("--batch-dir", type=Path, metavar="DIR", default=None,
                      help="the batch dir: a new or empty one (created), or with --resume the batch to resume "
                           "(default for a new batch: runs/batch_<ts>)")
    run_.add_argument("--executor", choices=("local", "ray", "slurm"), default="local",
                      help="local subprocesses, Ray tasks of one device each, or Slurm array tasks of one GPU each "
                           "through submitit (the batch dir on a shared filesystem) (default: local)")
    run_.add_argument("--ray-address", metavar="ADDR", default=None,
                      help="Ray cluster to join (default with --executor ray: a local Ray instance)")
    run_.add_argument("--slurm-param", action="append", metavar="KEY=VAL", default=None,
                      help="with --executor slurm: a Slurm job parameter for submitit (slurm_KEY), e.g. partition=gpu, "
                           "account=x (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str) -> argparse.ArgumentParser:
        summary, description = COMMANDS[name]
        return sub.add_parser(name, help=summary, description=description)

    rec = command("record")
    rec.add_argument("op", nargs="?", default=DEFAULT_OP,
                     help=f"built-in operator, REPO:OP[@FILE] of a FlagGems checkout, or a pytest node "
                          f"PATH/benchmark/test_x.py::test_op (default: {DEFAULT_OP})")
    _add_common(rec, "the run dir")
    _add_timing_only(rec)
    _add_measurement(rec)
    rec.add_argument("--sweep-devices", type=int, metavar="N", default=0,
                     help="sweep autotune in parallel over the first N visible devices, then measure serially "
                          "on one (default: 0, a serial sweep)")
    rep = command("replay")
    rep.add_argument("run_dir", type=Path, nargs="?", default=None,
                     help="the record run dir to replay (default: the newest record run under --out)")
    _add_common(rep, "the run dir")
    _add_timing_only(rep)
    for flag in ("--seed", "--timer", "--l2", "--warmup-ms", "--rep-ms", "--sweep-devices"):
        rep.add_argument(flag, action=_RecordOnly)
    ab = command("ab")
    ab.add_argument("plan", type=Path, nargs="?", default=None,
                    help="plan yaml (default: ops/ab_default.yaml unless --ops or --compare is given)")
    side = ab.add_argument_group("the experiment (override the plan)")
    side.add_argument("--ops", nargs="+", metavar="[REPO:]OP[@FILE]", default=None,
                      help="operators to compare (with a corpus option below: a batch selection)")
    side.add_argument("--repeats", type=int, metavar="N", default=None, help="replays per side (>= 2; default 3)")
    side.add_argument("--fdr", type=float, metavar="Q", default=None,
                      help="false discovery rate of the report's FASTER/SLOWER calls (default 0.05)")
    for s_ in ("a", "b"):
        side.add_argument(f"--{s_}-env", action="append", metavar="KEY=VAL", default=None,
                          help=f"environment variable for side {s_.upper()} (repeatable)")
        side.add_argument(f"--{s_}-python", metavar="PATH", default=None,
                          help=f"Python interpreter of side {s_.upper()} (a second compiler build)")
    side.add_argument("--step-start", choices=STEP_STARTS, default=None,
                      help="how each step starts: fork (a warm worker per side, with torch, triton and pytest "
                           "imported once, forks every step) or fresh (a new process per step) (default: fork)")
    side.add_argument("--step-passes", choices=STEP_PASSES, default=None,
                      help="where IR collection and per-kernel attribution run: once (a step of their own per "
                           "side, A-passes and B-passes, whose timings no verdict uses; the record and every repeat "
                           "time only) or every (every step) (default: once)")
    side.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"), default=None,
                      help="compare two existing run dirs, or two batch dirs (a corpus report: the corpus "
                           "screened under A, then under B), without running anything")
    # Any of these makes it a corpus A/B: each op's whole A/B is one batch job on one device.
    _add_corpus(ab.add_argument_group("corpus A/B: selection"), ab.add_argument_group("corpus A/B: running"))
    ab.set_defaults(replay_root=None, triage=False, summarize=None)
    _add_common(ab, "the A/B dir")
    _add_measurement(ab, "A's record of each op; the replays of both sides keep them; over the plan's")
    bat = command("batch")
    sel = bat.add_argument_group("selection")
    sel.add_argument("--ops", nargs="+", metavar="[REPO:]OP[@FILE]", default=None)
    run_ = bat.add_argument_group("running")
    _add_corpus(sel, run_)
    run_.add_argument("--replay-root", type=Path, metavar="DIR", default=None,
                      help="replay each op from this earlier batch dir")
    run_.add_argument("--triage", action=argparse.BooleanOptionalAction, default=None,
                      help="rerun a FlagGems op that still fails or times out as the bare upstream pytest node: "
                           "FAIL_UPSTREAM or TIMEOUT_UPSTREAM when that fails or times out too (not counted as "
                           "ours), FAIL or TIMEOUT otherwise (default: on; --resume: the batch's)")
    run_.add_argument("--summarize", type=Path, metavar="DIR", default=None,
                      help="only regenerate DIR/summary.csv from its per-op dirs")
    _add_common(bat)
    _add_measurement(bat, "each op's record; --resume: the batch's unless given; not with --replay-root")
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
    cmp_ = command("compare-ir")
    cmp_.add_argument("run_a", type=Path)
    cmp_.add_argument("run_b", type=Path)
    return parser


# --- resolution ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Each command imports only what it needs: a replay's parent process stays free of torch,
    # scipy and matplotlib (seconds of start-up on every A/B and batch step).
    try:
        if args.command in ("record", "replay"):
            from harness.sessions import run

            resolved = resolve.resolve_record(args) if args.command == "record" else resolve.resolve_replay(args)
            return run.execute(*resolved, cache_dir=args.triton_cache, named_dir=args.named_run_dir)
        if args.command == "ab":
            from harness.sessions import ab, compare_batches, corpus_ab

            if args.named_run_dir is not None and (args.compare or corpus_ab.wanted(args)):
                raise UsageError("--run-dir names the dir of one A/B run: --compare writes its report under --out, "
                                 "a corpus A/B into --batch-dir")
            if args.compare and compare_batches.names_batches(args.compare):
                return compare_batches.run_from_args(args)
            return corpus_ab.run_from_args(args) if corpus_ab.wanted(args) else ab.run_from_args(args)
        if args.command == "batch":
            from harness.sessions import batch

            return batch.run_from_args(args)
        if args.command == "inventory-regen":
            from harness.sessions import inventory_regen

            return inventory_regen.regen_from_args(args)
        from harness.measure import ir
        from reports import explain

        code = ir.compare_from_args(args.run_a, args.run_b)
        for line in explain.compare_ir_lines(args.run_a, args.run_b):
            print(line)
        return code
    except UsageError as exc:  # its exit code: 2, or one of its own (DtypeRejected: 65)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # A path that cannot be written (--out on a file or a read-only mount, a full disk) is one
        # line; an OSError about no path is a bug, shown whole.
        full = rundir.disk_full(exc)
        if full is None and exc.filename is None:
            raise
        print(f"error: {full or f'{exc.strerror}: {exc.filename}'}", file=sys.stderr)
        return 1
