"""A bisect's probes: each an A/B of two builds, run by the A/B's own machinery (ab.Runner's steps,
its side caches and warm workers, ab.report's pairing, verdicts and explain), that replays the good
build's record on both sides instead of recording: the record is made once, by the good build, and
every probe replays it, so a probe differs from the good build by the compiler alone.

A search probe times only (each side's repeats, interleaved A B A B); the confirm of a boundary also
runs each side's one-off passes (IR, per-kernel attribution), from which its report says what the
first bad build changed in the code of each moved row (the explain of `ab`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from harness.core import rundir
from harness.core.results import read_results
from harness.sessions.ab.plan import Plan, Side
from harness.sessions.ab.reporting import report, validity
from harness.sessions.ab.runner import Runner

PROBE_LOG = "probe.log"  # in a probe's dir: its A/B report as `ab` prints it


def op_dir_name(op: str) -> str:
    return op.replace(":", "-").replace("@", "-").replace("/", "-")


class ProbeRunner(Runner):
    """An A/B's runner whose steps replay given records instead of making one."""

    def record(self, op: str) -> Path | None:
        """Side A's record of `op` (its configs only: the replays time), its run dir or None."""
        plan = self.plan
        record_dir = rundir.unclaimed_run_dir(self.dir / op_dir_name(op) / "A-record", op_dir_name(op))
        self._open_caches()
        return self.step(plan.a, plan.request("record", op, record_dir, "configs"), f"[{op}] the good build records")

    def replay(self, records: dict[str, Path], cases: dict[str, tuple[str, ...]], passes: bool,
               tag: str) -> dict[str, dict[str, list[Path]]]:
        """Both sides replay each op's record (its `cases` only), `plan.repeats` times, interleaved; with
        `passes`, each side's untimed passes step first. op -> {"record", "A", "B"[, passes keys]}."""
        from reports import compare

        plan = self.plan
        self._open_caches()
        for op, record in records.items():
            runs = self.results.setdefault(op, {"record": [record], "A": [], "B": []})
            op_dir = self.dir / op_dir_name(op)
            for side in (plan.a, plan.b):  # a warm worker begun for each of its steps, importing meanwhile
                spare = self.spares.setdefault(side.name, [])
                while len(spare) < plan.repeats + int(passes):
                    spare.append(self._new_worker(side))
                    spare[-1].begin()
            if passes:
                for side in (plan.a, plan.b):
                    passes_dir = rundir.unclaimed_run_dir(op_dir / compare.passes_key(side.name), op_dir.name)
                    passed = self.step(side, plan.request("replay", str(record), passes_dir, "passes", cases[op]),
                                       f"{tag} [{op}] {side.name}'s IR and kernels", passes=True)
                    if passed is not None:
                        runs.setdefault(compare.passes_key(side.name), []).append(passed)
            self._ready_before_timing()
            for r in range(1, plan.repeats + 1):
                for side in (plan.a, plan.b):
                    replay_dir = rundir.unclaimed_run_dir(op_dir / f"{side.name}-{r}", op_dir.name)
                    timed = plan.request("replay", str(record), replay_dir, "timing", cases[op])
                    done = self.step(side, timed, f"{tag} [{op}] repeat {r}/{plan.repeats}: {side.name}")
                    if done is not None:
                        runs[side.name].append(done)
        self.state["complete"] = True
        self._save()
        return self.results


def run(plan: Plan, probe_dir: Path, records: dict[str, Path], rows: tuple[str, ...], passes: bool,
        tag: str) -> dict:
    """One probe into `probe_dir`: its A/B of the `rows` named (their cases alone are replayed), and
    its report (report.json and the rest) there. The verdict of each row it compared, by row id:
    {"verdict", "ratio", "lo", "hi", "what_changed"}."""
    probe_dir.mkdir(parents=True)
    runner = ProbeRunner(plan, probe_dir)
    cases = {op: case_ids(record, rows) for op, record in records.items()}
    try:
        results = runner.replay(records, cases, passes, tag)
    finally:
        runner.close()
    warnings, _ = validity(results)
    failed = [s["what"] for s in runner.state["steps"] if not s["usable"]]
    if failed:
        warnings.append(f"{len(failed)} step(s) failed (see ab.log): " + "; ".join(failed))
    context = {"name": plan.name, "a": plan.a.describe(), "b": plan.b.describe(), "repeats": plan.repeats}
    with rundir.open_write(probe_dir / PROBE_LOG, "w") as log, contextlib.redirect_stdout(log):
        report(probe_dir, list(results.values()), context, warnings, {plan.options.backend}, plan.repeats,
                  plan.fdr)
    return verdicts(probe_dir)


def verdicts(probe_dir: Path) -> dict[str, dict]:
    """Row id ("op dtype shape", as the A/B labels it) -> its verdict, B/A and what changed."""
    out = {}
    for row in rundir.read_json(probe_dir / "report.json")["rows"]:
        comparison = row["comparison"] or {}
        verdict = comparison.get("verdict") or ("FAILED" if row["errors"] else "UNPAIRED")
        out[row_id(row["op"], row["dtype"], row["shape"])] = {
            "verdict": verdict, "ratio": comparison.get("ratio"), "lo": comparison.get("lo"),
            "hi": comparison.get("hi"), "what_changed": row.get("what_changed")}
    return out


def case_ids(record: Path, rows: tuple[str, ...]) -> tuple[str, ...]:
    """The record's case ids (results.json `case`) of the rows named."""
    wanted = set(rows)
    return tuple(r.case for r in read_results(record) if row_id(r.op, r.dtype, r.shape) in wanted)


def row_id(op: str, dtype: str | None, shape) -> str:
    return f"{op} {dtype} {'x'.join(map(str, shape or []))}"


def plan_for(name: str, a: Side, b: Side, ops: list[str], template: Plan, repeats: int) -> Plan:
    """The A/B of one probe: the bisect's options, fdr and step start, these sides, ops and repeats."""
    return dataclasses.replace(template, name=name, a=a, b=b, ops=ops, repeats=repeats)
