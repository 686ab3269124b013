"""Explainability: the IR of the kernel variants that actually ran, per shape, named for humans.

Layout written into the run dir:

    ttgir/<shape>/<kernel>/<variant>.ttgir   one file per compiled variant launched for that shape
    ttgir/index.tsv                          every compiled variant (sweep losers too), with
                                             parameters, launches per shape and per-stage hashes
    ttgir/naming.md                          the abbreviation legend
    ttgir/stats.json                         per launched variant, statistics of its compiled code
                                             (harness.measure.kernel_stats), by cache hash

A variant's name holds what distinguishes it inside its (shape, kernel) group: constexprs that
vary (multi-word names abbreviated, BLOCK_SIZE_M -> BSM), then warps and stages (w4s3). Names
that still collide are told apart by dtype, then alignment specialization, then a hash prefix.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from harness.core import rundir
from harness.core.errors import UsageError
from harness.core.ir_index import (
    HASHED_STAGES,
    INDEX_COLUMNS,
    INDEX_FILE,
    IR_DIR,
    STATS_FILE,
    differing_stages,
    index_path,
    launched,
)
from harness.core.spec import ONLY
from harness.measure import kernel_stats


@dataclasses.dataclass(frozen=True)
class Variant:
    kernel: str
    hash: str
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int
    dtype: str
    align: str
    stage_sha: tuple[tuple[str, str], ...] = ()

    @property
    def params(self) -> dict:
        return dict(self.constexprs)


def abbreviate(name: str) -> str:
    """BLOCK_SIZE_M -> BSM, blockSizeM -> BSM; single words stay whole (BLOCK, num)."""
    words = [w for w in re.split(r"_+|(?<=[a-z0-9])(?=[A-Z])", name) if w]
    if len(words) <= 1:
        return name
    return "".join(w[0].upper() for w in words)


def abbreviations(names) -> dict[str, str]:
    """Full name -> short name; a name whose abbreviation would clash keeps its full name."""
    names = set(names)
    short = {n: abbreviate(n) for n in names}
    counts = collections.Counter(short.values())
    return {n: s if counts[s] == 1 and (s == n or s not in names) else n for n, s in short.items()}


def _fmt(value) -> str:
    return str(value).replace("/", "_").replace(" ", "")


def varying_params(variants: list[Variant]) -> list[str]:
    """Constexprs whose value differs inside the group: the only ones a file name needs."""
    keys = sorted({k for v in variants for k, _ in v.constexprs})
    return [k for k in keys if len({_fmt(v.params.get(k)) for v in variants}) > 1]


def name_variants(variants: list[Variant]) -> dict[str, str]:
    """hash -> file stem, for the variants of one (shape, kernel) group."""
    if not variants:
        return {}
    varying = varying_params(variants)
    abbr = abbreviations(varying)
    names = {}
    for v in variants:
        parts = [f"{abbr[k]}{_fmt(v.params.get(k))}" for k in varying]
        names[v.hash] = "_".join(parts + [f"w{v.num_warps}s{v.num_stages}"])
    for tiebreak in (lambda v: v.dtype, lambda v: v.align, lambda v: v.hash[:8]):
        groups = collections.defaultdict(list)
        for v in variants:
            groups[names[v.hash]].append(v)
        for name, members in groups.items():
            if len(members) > 1 and len({tiebreak(m) for m in members}) > 1:
                for m in members:
                    names[m.hash] = f"{name}__{tiebreak(m)}"
    return names


def _dtype(signature: dict) -> str:
    for ty in signature.values():
        if isinstance(ty, str) and ty.startswith("*"):
            return ty[1:].replace("k", "")
    return "nodtype"


def _align(src) -> str:
    """Which arguments were specialized as divisible by 16 (EMdiv16 style), from the attrs."""
    names = src.fn.arg_names
    div16 = []
    for path, attrs in sorted((getattr(src, "attrs", None) or {}).items()):
        if any(a and a[0] == "tt.divisibility" and a[1] == 16 for a in attrs):
            div16.append(names[path[0]] if path and path[0] < len(names) else str(path))
    return ("div16-" + "-".join(abbreviate(n) for n in div16)) if div16 else "nodiv"


def variant_of(compiled) -> Variant:
    src = compiled.src
    fn = src.fn
    base = getattr(fn, "fn", fn)
    kernel = f"{getattr(base, '__module__', '?')}.{getattr(base, '__qualname__', compiled.name)}"
    constants = getattr(src, "constants", None) or getattr(src, "constexprs", None) or {}
    constexprs = []
    for path, value in sorted(constants.items(), key=lambda kv: str(kv[0])):
        idx = path[0] if isinstance(path, tuple) else path
        name = fn.arg_names[idx] if isinstance(idx, int) and idx < len(fn.arg_names) else str(path)
        constexprs.append((name, value))
    stage_sha = []
    for stage in HASHED_STAGES:
        text = compiled.asm.get(stage) if hasattr(compiled.asm, "get") else None
        if isinstance(text, str):
            stage_sha.append((stage, hashlib.sha256(text.encode()).hexdigest()[:16]))
    meta = compiled.metadata
    return Variant(kernel=kernel, hash=compiled.hash, constexprs=tuple(constexprs),
                   num_warps=int(meta.num_warps), num_stages=int(meta.num_stages),
                   dtype=_dtype(src.signature), align=_align(src), stage_sha=tuple(stage_sha))


# Launched variants whose statistics are extracted at once (each runs a disassembler process): few beside
# a measurement, half the host's cores where the timings are for no comparison (a record's or passes'
# 40-60 variants of 0.3 s each).
STATS_THREADS = 4
BACKGROUND_STATS_THREADS = max(STATS_THREADS, (os.cpu_count() or 1) // 2)


class IRCollector:
    """Counts launches per (shape, compiled kernel) outside autotune sweeps and writes the IR.

    `write(final=False)` is called after every case and `write()` at the end (or at exit), so a run
    that crashes leaves the IR of every case finished before the crash. The launched variants'
    statistics (a disassembly each: ~0.3 s a variant on an H200 host) are extracted in threads, a
    case's new variants at once. With `background_stats` (a run whose timings are for no comparison)
    they are left running while the next cases run, a case's write taking those done and the final
    write waiting for the rest; otherwise each case's write waits for its own, so no extraction runs
    beside a measurement (its threads would delay the timer's launches).
    """

    def __init__(self, run_dir: Path, tools: Mapping[str, str | None] | None = None, limits: Mapping | None = None,
                 background_stats: bool = False):
        self.root = run_dir / IR_DIR
        # For the statistics of launched variants (kernel_stats.extract); computed once per variant.
        self.tools = kernel_stats.find_tools() if tools is None else tools
        self.limits = limits
        self.background_stats = background_stats
        self.compiled: dict[str, object] = {}
        self.stats: dict[str, dict] = {}
        self._extracting: dict[str, concurrent.futures.Future] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.shape = "unknown"
        self.sweeping = 0
        self.launches: collections.Counter = collections.Counter()  # (shape, function handle)
        self.variants: dict[str, Variant] = {}
        self.ttgir: dict[str, str] = {}
        self.handle_to_hash: dict[int, str] = {}
        self.unreadable = 0  # launches whose metadata named no function: reported, not guessed

    # --- hooks ---------------------------------------------------------------------------------
    def on_launch(self, metadata) -> None:
        if self.sweeping:
            return
        # Triton passes a LazyDict; its `.data` holds name/function/stream without running the
        # kernel's own (possibly costly) launch_metadata callbacks.
        data = getattr(metadata, "data", metadata)
        handle = data.get("function") if isinstance(data, dict) else None
        if handle is None:
            self.unreadable += 1
            return
        self.launches[(self.shape, handle)] += 1

    def scan(self) -> None:
        """Find every compiled kernel in the process (sweep losers included)."""
        import gc

        from triton.compiler.compiler import CompiledKernel

        for obj in gc.get_objects():
            # type(), not isinstance(): some objects (torch's deprecated aliases) warn when their
            # __class__ is read.
            if issubclass(type(obj), CompiledKernel) and getattr(obj, "src", None) is not None:
                if obj.hash not in self.variants:
                    try:
                        self.variants[obj.hash] = variant_of(obj)
                    except (AttributeError, IndexError, TypeError):
                        continue
                    text = obj.asm.get("ttgir") if hasattr(obj.asm, "get") else None
                    self.ttgir[obj.hash] = text if isinstance(text, str) else ""
                    self.compiled[obj.hash] = obj
                if getattr(obj, "function", None) is not None:
                    self.handle_to_hash[obj.function] = obj.hash

    # --- output --------------------------------------------------------------------------------
    def used(self) -> dict[tuple[str, str], dict[str, int]]:
        """(shape, kernel) -> {variant hash: launches}."""
        groups: dict[tuple[str, str], dict[str, int]] = collections.defaultdict(dict)
        for (shape, handle), n in self.launches.items():
            h = self.handle_to_hash.get(handle)
            if h is None or h not in self.variants:
                continue
            v = self.variants[h]
            groups[(shape, v.kernel)][h] = groups[(shape, v.kernel)].get(h, 0) + n
        return groups

    def write(self, final: bool = True) -> None:
        """Rewrite ttgir/ whole: built in a staging dir and renamed into place, so a failure (a full
        disk) leaves the previous ttgir/ and no staging litter. `final`: with every launched
        variant's statistics (waited for); otherwise (background_stats) with those extracted so far."""
        self.scan()
        staging = self.root.with_name(f".{IR_DIR}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            self._write_into(staging, final)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            full = rundir.disk_full(exc, self.root)
            if full is not None:
                raise full from exc
            raise
        shutil.rmtree(self.root, ignore_errors=True)
        staging.rename(self.root)

    def _write_into(self, staging: Path, final: bool) -> None:
        groups = self.used()
        staging.mkdir(parents=True)
        rows, abbrs = [], {}
        launched = set()
        for (shape, kernel), counts in sorted(groups.items()):
            members = [self.variants[h] for h in counts]
            names = name_variants(members)
            abbrs.update({k: a for k, a in abbreviations(varying_params(members)).items() if a != k})
            kdir = staging / shape / kernel.rsplit(".", 1)[-1]
            kdir.mkdir(parents=True, exist_ok=True)
            for v in members:
                (kdir / f"{names[v.hash]}.ttgir").write_text(self.ttgir.get(v.hash, ""))
                rows.append(self._row(shape, v, f"{shape}/{kdir.name}/{names[v.hash]}.ttgir", counts[v.hash]))
                launched.add(v.hash)
        for h, v in sorted(self.variants.items(), key=lambda kv: (kv[1].kernel, kv[0])):
            if h not in launched:
                rows.append(self._row("-", v, "-", 0))
        (staging / INDEX_FILE).write_text(
            "\t".join(INDEX_COLUMNS) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))
        (staging / "naming.md").write_text(_legend(abbrs))
        for h in sorted(launched):
            self._extract(h)
        for h, extracting in list(self._extracting.items()):
            if final or not self.background_stats or extracting.done():
                self.stats[h] = extracting.result()
                del self._extracting[h]
        if final and self._pool is not None:  # nothing left extracting: its threads end with it
            self._pool.shutdown()
            self._pool = None
        stats = {h: self.stats[h] for h in sorted(launched) if h in self.stats}
        (staging / STATS_FILE).write_text(json.dumps({"format": kernel_stats.FORMAT, "tools": self.tools,
                                                      "variants": stats}, indent=1) + "\n")

    def _extract(self, h: str) -> None:
        """Start extracting a variant's statistics, once, in a thread (the disassembler is a process)."""
        if h in self.stats or h in self._extracting:
            return
        obj = self.compiled[h]
        meta = obj.metadata._asdict() if hasattr(obj.metadata, "_asdict") else dict(obj.metadata)
        # The driver's own counts, set once the kernel was loaded (it was: it launched).
        loaded = {k: getattr(obj, k, None) for k in ("n_regs", "n_spills")}
        if self._pool is None:
            threads = BACKGROUND_STATS_THREADS if self.background_stats else STATS_THREADS
            self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="zl_kernel_stats")
        self._extracting[h] = self._pool.submit(self._variant_stats, obj.asm, meta, loaded)

    def _variant_stats(self, asm: Mapping, meta: dict, loaded: dict) -> dict:
        try:
            return kernel_stats.extract(asm, meta, self.tools, self.limits, loaded)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, UnicodeDecodeError) as exc:
            # An artifact the parsers did not expect must not cost the run its IR: said in the record.
            return {"stats error": f"{type(exc).__name__}: {exc}"}

    @staticmethod
    def _row(shape: str, v: Variant, file: str, launches: int) -> tuple:
        sha = dict(v.stage_sha)
        constexprs = ",".join(f"{k}={val}" for k, val in v.constexprs)
        return (shape, v.kernel, file, launches, v.dtype, v.align, v.num_warps, v.num_stages,
                constexprs or "-", v.hash, *(sha.get(s, "-") for s in HASHED_STAGES))


def _legend(abbrs: dict[str, str]) -> str:
    lines = ["# Variant file names", "",
             "`<varying constexprs>_w<num_warps>s<num_stages>[__<dtype>][__<alignment>][__<hash>]`", "",
             "Constexprs equal across a (shape, kernel) group are left out of the name; the suffixes",
             "appear only when names would otherwise collide. `div16-X-Y` lists the arguments",
             "specialized as divisible by 16; `nodiv` means none.", "", "| short | full |", "|---|---|"]
    lines += [f"| {a} | {k} |" for k, a in sorted(abbrs.items(), key=lambda kv: kv[1])]
    return "\n".join(lines) + "\n"


def compare(run_a: Path, run_b: Path) -> list[dict]:
    """Per launched variant: identical / changed (with the stages that differ) / only_in_a /
    only_in_b, variants matched by identity (ir_index.IDENTITY_COLUMNS)."""
    a, b = launched(run_a) or {}, launched(run_b) or {}
    out = []
    for key in sorted(a.keys() | b.keys()):
        ra, rb = a.get(key), b.get(key)
        row = {"shape": key[0], "kernel": key[1], "file_a": ra["file"] if ra else "-",
               "file_b": rb["file"] if rb else "-", "stages": ""}
        if ra is None or rb is None:
            row["status"] = "only_in_b" if ra is None else "only_in_a"
        else:
            differ = differing_stages(ra, rb)
            row["status"] = "changed" if differ else "identical"
            row["stages"] = ",".join(differ)
        out.append(row)
    return out


# Why a run collected no IR where an A/B's passes carry it: its repeats, and a bisect's record.
LEFT_TO_PASSES_STEPS = (ONLY["timing"], ONLY["configs"])


def write_status(run_dir: Path, enabled: bool, reason: str) -> None:
    rundir.merge_json(run_dir / rundir.RUN_JSON, {"observed": {"ir": {"collected": enabled, "reason": reason}}})


def _why_no_ir(run: Path) -> str:
    """The run's own word on its IR, where it has one: a timing-only run (an A/B's repeat) points to
    the run that has it."""
    try:
        reason = rundir.read_json(Path(run) / rundir.RUN_JSON)["observed"]["ir"]["reason"]
    except (OSError, ValueError, KeyError, TypeError):
        return "IR collection was off or it is not a run dir"
    if reason in LEFT_TO_PASSES_STEPS:
        return (f"{reason}: an A/B collects IR in A's record and B's passes step (A-record and B-passes; a "
                "bisect probe in A-passes and B-passes)")
    return f"IR collection off: {reason}"


def compare_from_args(run_a: Path, run_b: Path) -> int:
    """`python -m harness compare-ir A B`: the comparison as a table."""
    from tabulate import tabulate

    for run in (run_a, run_b):
        if not os.path.lexists(index_path(run)):  # one that is there but no file: reading it says what it is
            raise UsageError(f"{run} has no {IR_DIR}/{INDEX_FILE} ({_why_no_ir(run)})")
    rows = compare(run_a, run_b)
    print(tabulate([[r["status"], r["shape"], r["kernel"].rsplit(".", 1)[-1], r["file_a"], r["file_b"], r["stages"]]
                    for r in rows], headers=["status", "shape", "kernel", "A", "B", "stages differing"]))
    counts = collections.Counter(r["status"] for r in rows)
    print("  ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if rows and counts["identical"] == len(rows):
        print("every launched variant compiled to identical IR at every stage in A and B")
    return 0
