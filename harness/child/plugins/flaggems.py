"""FlagGems: drive an upstream benchmark (`benchmark/test_<file>.py::test_<op>`) under our plugins,
without editing the checkout.

Once collection has imported the benchmark package, `Benchmark` is patched in place:
- `set_shapes`: upstream's own lookup runs first (op_name, then the class chain, plus what the
  level adds); then our shape file overrides it under the same key order. An op whose input
  iterator hardcodes its shapes gets ours through its `input_fn`, or fails loudly.
- each input the iterator yields is one case: seeds are reset before it is built, and the IR
  collector and autotune records are told its name;
- `get_latency`: our timer (graph replay where the backend can capture), one caliber per row;
- `update_result`: upstream's structured result per dtype enriches the rows we wrote per case.
FlagGems' LibTuner (its own `run` and a persistent config cache) is hooked by the autotune patch.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from harness.child.plugins.results import make_row
from harness.child.plugins.seeds import input_sha256, seed_everything
from harness.core import rundir
from harness.providers import flaggems, shapes

SHORT_DTYPES = {v: k for k, v in flaggems.TORCH_DTYPES.items()}


def _input_label(item) -> str:
    """`1024x4096,4096x4096`: the tensor shapes of one yielded input, then scalar arguments."""
    import torch

    parts = []
    for value in item if isinstance(item, (tuple, list)) else (item,):
        if isinstance(value, torch.Tensor):
            parts.append(shapes.label(value.shape) or "scalar")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(str(value))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            parts.append("[" + ",".join(shapes.label(v.shape) for v in value) + "]")
    return ",".join(parts) or "noargs"


def _reads_shapes(cls) -> bool:
    """Whether the class's input iterator takes its shapes from self.shapes (directly or via super)."""
    for klass in cls.__mro__:
        if "get_input_iter" in vars(klass):
            try:
                source = inspect.getsource(vars(klass)["get_input_iter"])
            except (OSError, TypeError):
                return True  # cannot tell: trust it
            return "self.shapes" in source or "super()" in source
    return True


class FlagGemsPlugin:
    def __init__(self, ctx, results):
        self.ctx = ctx
        self.results = results
        self.options = flaggems.Options.from_json(ctx.spec.flaggems)
        self.our_shapes = (shapes.load(ctx.run_dir / rundir.SHAPES_YAML) if self.options.shapes_file else None)
        self.patched = False
        self.case_counts: dict[str, int] = {}
        self.pending: list = []  # measurements of the current case, in call order
        self.dtype_rows: list[dict] = []  # rows of the current (benchmark, dtype), in input order
        self.notes: list[str] = []
        self.current: dict | None = None  # the case being measured: benchmark, dtype, label, id

    # --- patching, once the benchmark package is imported ----------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        base = sys.modules.get("benchmark.base")
        if base is None or not hasattr(base, "Benchmark"):
            raise pytest.UsageError(f"{self.options.root}: importing {self.options.test_file} did not import "
                                    "benchmark.base.Benchmark; is this a FlagGems-style benchmark checkout?")
        self._patch_benchmark(base)
        facts = {"level": self.options.level, "flagtune": self.options.flagtune,
                 "shapes": self.options.shapes_file or flaggems.UPSTREAM, "node": self.options.target.node,
                 "checkout": self.options.root}
        for name in flaggems.PACKAGES:
            package = sys.modules.get(name)
            if package is None:
                continue
            facts.update(package=name, package_file=getattr(package, "__file__", None),
                         vendor=getattr(package, "vendor_name", None))
            libentry = sys.modules.get(f"{name}.utils.libentry")
            if libentry is not None and hasattr(libentry, "LibTuner"):
                self.ctx.autotune_patch.install(libentry.LibTuner)
                cache = getattr(libentry, "libcache", None)
                # That cache carries no compiler identity: which one a run used is part of its result.
                facts["libtuner_cache"] = {"choice": self.options.libtuner_cache,
                                           "url": getattr(cache, "db_url", None)}
                facts["libtuner_hooked"] = True
        if "package" not in facts:
            facts["package"] = None
            self.notes.append("no flag_gems/flaggems_vllm package was imported by the benchmark")
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"flaggems": facts}})
        cache = facts.get("libtuner_cache")
        if cache and self.options.libtuner_cache == "user":
            self.ctx.say(f"WARNING: LibTuner uses FlagGems' own persistent cache {cache['url']}: its winners are "
                         "shared across compilers and runs (use the default private cache for a clean sweep)")

    def _patch_benchmark(self, base) -> None:
        if self.patched:
            return
        self.patched = True
        plugin = self
        bench_cls = base.Benchmark
        original_set_shapes = bench_cls.set_shapes
        original_update = base.update_result

        def set_shapes(bench, *args, **kwargs):
            original_set_shapes(bench, *args, **kwargs)
            plugin._override_shapes(bench)
            plugin._wrap_inputs(bench)

        def get_latency(bench, op, *args, **kwargs):
            return plugin._latency(bench, op, args, kwargs)

        def update_result(op, data):
            plugin._enrich(data)
            return original_update(op, data)

        bench_cls.set_shapes = set_shapes
        bench_cls.get_latency = get_latency
        base.update_result = update_result

    # --- shapes and cases ------------------------------------------------------------------------
    def _override_shapes(self, bench) -> None:
        if self.our_shapes is None:
            return
        keys = [bench.op_name, *(cls.__name__ for cls in type(bench).__mro__)]
        key = next((k for k in keys if k in self.our_shapes), None)
        if key is None:
            self._note(f"shapes: {self.options.shapes_file} has no key for '{bench.op_name}' "
                       f"(tried {', '.join(keys)}): the checkout's own shapes are kept")
            return
        entry = self.our_shapes[key]
        listed = entry.get("shapes") if isinstance(entry, dict) else entry
        bench.shapes = [tuple(s) if isinstance(s, list) else (s,) for s in listed]
        self._note(f"shapes: key '{key}' of {self.options.shapes_file} ({len(bench.shapes)} shapes)")
        wanted = entry.get("dtypes") if isinstance(entry, dict) else None
        if wanted and not self.ctx.spec.dtypes:  # --dtypes, passed upstream, wins over the file
            takes = [d for d in bench.to_bench_dtypes if SHORT_DTYPES.get(str(d).removeprefix("torch.")) in wanted]
            if takes:
                bench.to_bench_dtypes = takes
            else:
                self._note(f"shapes: '{bench.op_name}' takes none of dtypes {wanted} of key '{key}': "
                           f"its own {[str(d).removeprefix('torch.') for d in bench.to_bench_dtypes]} are kept")
        if not _reads_shapes(type(bench)):
            if not callable(getattr(bench, "input_fn", None)):
                raise RuntimeError(f"{type(bench).__name__}.get_input_iter hardcodes its shapes and the benchmark "
                                   "has no input_fn to feed ours through; run it with --shapes upstream")

            def from_our_shapes(dtype, _bench=bench):
                for shape in _bench.shapes:
                    yield from _bench.input_fn(shape, dtype, _bench.device)

            bench.get_input_iter = from_our_shapes
            self._note(f"shapes: {type(bench).__name__}.get_input_iter hardcodes its shapes; ours are fed "
                       "through its input_fn")

    def _wrap_inputs(self, bench) -> None:
        plugin = self
        produce = bench.get_input_iter

        def seeded(dtype):
            inputs = produce(dtype)
            while True:
                seed_everything(plugin.ctx.spec.seed)  # inputs built lazily: byte-identical on both sides
                try:
                    item = next(inputs)
                except StopIteration:
                    return
                plugin._begin_case(bench, dtype, item)
                yield item

        bench.get_input_iter = seeded

    def _begin_case(self, bench, dtype, item) -> None:
        short = SHORT_DTYPES.get(str(dtype).removeprefix("torch."), str(dtype).removeprefix("torch."))
        label = _input_label(item)
        base_id = f"{short}-{label}"
        n = self.case_counts.get(base_id, 0) + 1
        self.case_counts[base_id] = n
        case_id = base_id if n == 1 else f"{base_id}#{n}"  # same tensors, other arguments (level variants)
        if self.dtype_rows and self.dtype_rows[-1]["dtype"] != short:
            self.dtype_rows = []
        self.pending = []
        self.ctx.begin_case(case_id, label if n == 1 else f"{label}#{n}")
        self.current = {"bench": bench, "dtype": short, "label": case_id.split("-", 1)[1], "case": case_id,
                        "input_sha256": input_sha256(item)}

    def _note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)
            self.results.write_lines([line])

    # --- measurement -----------------------------------------------------------------------------
    def _latency(self, bench, op, args, kwargs) -> float:
        import torch

        fn = lambda: op(*args, **kwargs)  # noqa: E731
        if getattr(bench, "is_backward", False):
            out = fn()
            dout = torch.randn_like(out)
            xs = [a for a in args if torch.is_tensor(a) and a.requires_grad]
            fn = lambda: torch.autograd.grad((out,), xs, grad_outputs=(dout,), retain_graph=True)  # noqa: E731
        timed = self.ctx.measure(self.ctx.spec.op, {"x": fn})
        measurement = timed.measurements["x"]
        self.pending.append(measurement)
        metrics = getattr(bench, "to_bench_metrics", ("latency_base", "latency"))
        expected = ("latency_base" in metrics) + ("latency" in metrics)
        if len(self.pending) == max(expected, 1):
            self._row(bench, metrics)
        return measurement.median_ms

    def _row(self, bench, metrics) -> None:
        roles = ["baseline", "candidate"] if "latency_base" in metrics and "latency" in metrics else (
            ["baseline"] if "latency" not in metrics else ["candidate"])
        measured = dict(zip(roles, self.pending, strict=False))
        timers = {m.timer for m in measured.values()}
        timer = timers.pop() if len(timers) == 1 else "mixed"
        if timer == "mixed":
            self.ctx.mark("TIMER_MIXED " + " ".join(f"{k}={m.timer}" for k, m in measured.items()))
        cur = self.current
        row = make_row(self.ctx, op=self.ctx.spec.op, dtype=cur["dtype"], shape=[cur["label"]], params={},
                       case=cur["case"], status="SUCCESS", nodeid=self.options.target.node, measurements=measured,
                       timer=timer, input_sha256=cur["input_sha256"])
        row["benchmark"] = type(cur["bench"]).__name__
        self.dtype_rows.append(row)
        self.pending = []
        self.results.add_row(row)

    def _enrich(self, data) -> None:
        """Upstream's result for one dtype: its metrics, per input in order, join our rows."""
        results = data.get("result") if isinstance(data, dict) else None
        if not results or len(results) != len(self.dtype_rows):
            if results:
                self._note(f"upstream result for {data.get('op_name')} {data.get('dtype')} has {len(results)} "
                           f"entries, we measured {len(self.dtype_rows)}: upstream metrics not joined")
            return
        for row, metric in zip(self.dtype_rows, results, strict=True):
            row["params"] = {"shape_detail": metric.get("shape_detail")}
            for name in ("gbps", "tflops"):
                if metric.get(name) is not None:
                    row[name] = metric[name]
        self.results.update_rows()
        self.dtype_rows = []

    def pytest_sessionfinish(self, session):
        if self.notes:
            rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"flaggems_notes": self.notes}})


def child_args(options: flaggems.Options, dtypes: list[str], color: bool) -> list[str]:
    """pytest arguments for the upstream node: the checkout's own pytest config and options."""
    args = [str(Path(options.root) / options.target.node), "--rootdir", options.root,
            "-p", "no:cacheprovider", "--level", options.level,
            "-o", "console_output_style=classic", f"--color={'yes' if color else 'no'}",
            "-q", "--tb=short", "-rfE"]
    for dtype in dtypes:
        args += ["--dtypes", flaggems.TORCH_DTYPES[dtype]]
    return args
