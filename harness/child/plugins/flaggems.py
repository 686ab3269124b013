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
FlagGems' LibTuner (its own `run` and a persistent config cache) is hooked by the autotune patch. Its
LibEntry caches, per kernel in front of its tuners, the config chosen per argument key: each entry's cache
starts this run empty, as in a process of its own (a measuring host runs several ops' replays in one). For
the same reason the benchmark package's modules (conftest, base, the test files) leave sys.modules as the
run ends: the next run in the process imports them anew, as a process of its own would (base binds
conftest's Config, made per session, at its import).
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
import os
import sys
import weakref
from pathlib import Path

import pytest

from harness.child.plugins.results import make_row
from harness.child.plugins.seeds import case_digest, seed_everything
from harness.core import rundir
from harness.core.spec import FlagGemsOptions
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



def _roles(metrics) -> list[str]:
    """The sides upstream times for one case, in its order: the torch baseline (latency_base),
    then the FlagGems candidate (latency); a benchmark that names neither is read as one baseline."""
    roles = [role for metric, role in (("latency_base", "baseline"), ("latency", "candidate")) if metric in metrics]
    return roles or ["baseline"]


# Torch's random draws a benchmark's input iterator may make on the host, and the fewest elements one must have
# to be drawn on the device instead. Torch draws on the host one element at a time (1G int16 in 3.1 s on a
# loaded 2-core CPU machine); bitwise_right_shift_ draws its shift amounts so, `torch.randint(0, 8, shape,
# device="cpu").to(device)`, 1G elements in 4 of its 10 cases, and each of its steps (record, passes, every
# repeat) took ~47 s on an H100 host for 0.65 s of timing; ~15 benchmark files draw so, upstream's own
# generate_tensor_input among them (its integer and bool tensors). Such a draw is made on the benchmark's device
# from the same distribution (the same arguments), seeded as every input is; smaller draws, and any that names a
# generator, an output, pinned memory, a gradient or a layout, stay upstream's.
HOST_DRAWS = ("randint", "randn", "rand")
HOST_DRAW_MIN_ELEMENTS = 1 << 20
UPSTREAM_DRAW_KEYWORDS = ("generator", "out", "pin_memory", "requires_grad", "layout")  # any named: upstream's draw
# What a host tensor may be asked without its values: a draw still on the device stays there.
TENSOR_METADATA = (("size", "dim", "numel", "nelement", "stride", "is_contiguous", "element_size"),
                   ("shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad"))


def _drawn_elements(args, kwargs) -> int:
    """The element count a torch.randint / randn / rand call asks for: its `size`, else its last sequence
    argument (randint's low and high are scalars), else randn's and rand's integer arguments."""
    size = kwargs.get("size")
    if size is None:
        sequences = [a for a in args if isinstance(a, (tuple, list))]
        size = sequences[-1] if sequences else [a for a in args if isinstance(a, int)] or None
    try:
        return math.prod(int(n) for n in size) if size is not None else 0
    except (TypeError, ValueError):
        return 0


def _copy_back(host, drawn) -> None:
    host.copy_(drawn)


class HostDrawsOnDevice:
    """While entered, torch's HOST_DRAWS of HOST_DRAW_MIN_ELEMENTS or more on the host are made on `device`. The
    caller gets a host tensor of the draw's shape and dtype whose values cross the bus only when read: its
    `.to(device)` or `.cuda()` onto the draw's device (upstream's `torch.randint(..., device="cpu").to(device)`)
    gets a copy made on the device, and the host tensor is filled (`copy_back(host, drawn)`) only where anything
    else reads it, or where it is still alive at the exit. Counts by function: `moved` (drawn on the device),
    `handed` (a device copy handed to a `.to`), `copied_back`, and `refused` (the device's generator lacks the
    dtype: upstream's own draw, on the host)."""

    COUNTS = ("moved", "handed", "copied_back", "refused")

    def __init__(self, device, copy_back=_copy_back):
        self.device = device
        self.copy_back = copy_back
        self.moved, self.handed, self.copied_back, self.refused = (collections.Counter() for _ in self.COUNTS)
        self.waiting: dict[int, tuple] = {}  # id(host tensor) -> (weakref to it, the device draw, function name)
        self.mode = None

    def counts(self) -> dict[str, collections.Counter]:
        return {name: getattr(self, name) for name in self.COUNTS}

    def __enter__(self):
        self.mode = _draws_mode()(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.mode.__exit__(*exc)
        finally:
            self.mode = None
            for key in list(self.waiting):  # what the caller kept (an input yielded on the host) gets its values
                host = self.waiting[key][0]()
                if host is not None:
                    self._fill(host)
            self.waiting.clear()

    def _draw(self, func, args, kwargs):
        import torch

        name = func.__name__
        target = kwargs.get("device")
        where = torch.device(target) if target is not None else torch.get_default_device()
        if (where.type != "cpu" or any(kwargs.get(k) for k in UPSTREAM_DRAW_KEYWORDS)
                or _drawn_elements(args, kwargs) < HOST_DRAW_MIN_ELEMENTS):
            return func(*args, **kwargs)
        try:
            drawn = self._on_device(func, args, kwargs)
        except (RuntimeError, TypeError):  # a dtype the device's generator lacks: upstream's own draw
            self.refused[name] += 1
            return func(*args, **kwargs)
        self.moved[name] += 1
        host = torch.empty(drawn.shape, dtype=drawn.dtype)  # its pages untouched until filled
        key = id(host)
        self.waiting[key] = (weakref.ref(host), drawn, name)
        weakref.finalize(host, self.waiting.pop, key, None)  # gone unread: the device draw is let go with it
        return host

    def _on_device(self, func, args, kwargs):
        return func(*args, **{**kwargs, "device": self.device})

    def _fill(self, host) -> None:
        _, drawn, name = self.waiting.pop(id(host))
        self.copy_back(host, drawn)
        self.copied_back[name] += 1

    def _waiting_in(self, args, kwargs) -> list:
        import torch
        from torch.utils import _pytree

        found = []
        for leaf in _pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor) and id(leaf) in self.waiting and self.waiting[id(leaf)][0]() is leaf:
                found.append(leaf)
        return found

    def _handed_over(self, func, args, kwargs):
        """A `.to` / `.cuda` of a waiting host tensor onto its draw's device: a copy made there (upstream's
        copy was a new tensor too); None where the call is not one."""
        import torch

        if func is torch.Tensor.to:
            target = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
        elif func is torch.Tensor.cuda:
            device = args[1] if len(args) > 1 else kwargs.get("device")
            target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        else:
            return None
        _, drawn, name = self.waiting[id(args[0])]
        if target is None or target.type != drawn.device.type or target.index not in (None, drawn.device.index):
            return None
        moved = func(drawn, *args[1:], **kwargs)
        if moved is drawn:
            moved = drawn.clone()
        self.handed[name] += 1
        return moved

    def _call(self, func, args, kwargs):
        """The mode's handler: a draw redirected, a hand-over, or any other call once the waiting host tensors it
        names have their values."""
        if func in _host_draw_functions():
            return self._draw(func, args, kwargs)
        if not self.waiting:  # the common case: no argument to look through
            return func(*args, **kwargs)
        waiting = self._waiting_in(args, kwargs)
        if waiting and func not in _metadata_functions():
            alone = len(waiting) == 1 and waiting[0] is args[0]  # by identity: `==` on tensors compares elements
            moved = self._handed_over(func, args, kwargs) if alone else None
            if moved is not None:
                return moved
            for host in waiting:
                self._fill(host)
        return func(*args, **kwargs)


@functools.cache
def _host_draw_functions() -> frozenset:
    import torch

    return frozenset(getattr(torch, name) for name in HOST_DRAWS)


@functools.cache
def _metadata_functions() -> frozenset:
    import torch

    methods, properties = TENSOR_METADATA
    return frozenset([*(getattr(torch.Tensor, n) for n in methods), *(getattr(torch.Tensor, n).__get__
                                                                      for n in properties)])


@functools.cache
def _draws_mode():
    """HostDrawsOnDevice's torch function mode (torch imported only where a run draws its inputs): every torch
    call the input iterator makes, whatever name it was imported under, passes through `draws._call`."""
    from torch.overrides import TorchFunctionMode

    class DrawsMode(TorchFunctionMode):
        def __init__(self, draws):
            super().__init__()
            self.draws = draws

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return self.draws._call(func, args, kwargs or {})

    return DrawsMode


_INHERITED = object()  # a patched attribute the class did not define itself: deleted, not set, when put back


class FlagGemsPlugin:
    def __init__(self, ctx, results, measure, autotune):
        """`results`, `measure` and `autotune`: the results plugin, the timing plugin's measure and
        the autotune plugin, handed over by the runner (harness.child.runner.build_plugins)."""
        self.ctx = ctx
        self.results = results
        self.measure = measure
        self.autotune = autotune
        self.hook = None  # pytest's hook relay, to announce each case (harness.child.hookspec)
        self.options = ctx.spec.flaggems
        self.our_shapes = (shapes.load(ctx.run_dir / rundir.SHAPES_YAML) if self.options.shapes_file else None)
        self.patched: list[tuple[object, str, object]] = []  # (owner, name, original): put back as the run ends
        self.entries_called: list = []  # LibEntry kernels this run called: their own run dropped as it ends
        self.case_counts: dict[str, int] = {}
        self.pending: list = []  # measurements of the current case, in call order
        self.dtype_rows: list[dict] = []  # rows of the current (benchmark, dtype), in input order
        self.notes: list[str] = []
        self.current: dict | None = None  # the case being measured: benchmark, dtype, label, id
        # HostDrawsOnDevice's counts over the run's input iterators: {"moved": {function: n}, "handed": {...}, ...}
        self.host_draws = {name: collections.Counter() for name in HostDrawsOnDevice.COUNTS}

    def pytest_configure(self, config):
        self.hook = config.hook
        given = Path(self.options.root, self.options.test_file)
        test_file = given.resolve()
        self.collected_paths = {test_file, *test_file.parents}
        # A path pytest reaches is resolved only where its name is one of ours: resolving each of benchmark/'s
        # ~700 entries was ~70 ms of every step (profiled on an H200 host).
        self.collected_names = {p.name for p in (given, *given.parents, test_file, *test_file.parents)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_ignore_collect(self, collection_path, config):
        # Reaching the node, pytest makes a node of every entry in each directory on the way (FlagGems'
        # benchmark/ has ~700 files: 0.3 s of every step); only the node's file and its directories are ours.
        # Its conftests load all the same: pytest loads them by directory, not by collecting them.
        if collection_path.name not in self.collected_names:
            return True
        return collection_path.resolve() not in self.collected_paths or None

    # --- patching, once the benchmark package is imported ----------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        base = sys.modules.get("benchmark.base")
        if base is None or not hasattr(base, "Benchmark"):
            raise pytest.UsageError(f"{self.options.root}: importing {self.options.test_file} did not import "
                                    "benchmark.base.Benchmark; is this a FlagGems-style benchmark checkout?")
        self._patch_benchmark(base)
        facts = {"level": self.options.level, "flagtune": self.options.flagtune,
                 "shape_file_parser": self._parse_yaml_in_c(base),
                 "shapes": self.options.shapes_file or flaggems.UPSTREAM, "node": self.options.node,
                 "checkout": self.options.root}
        for name in flaggems.PACKAGES:
            package = sys.modules.get(name)
            if package is None:
                continue
            facts.update(package=name, package_file=getattr(package, "__file__", None),
                         vendor=getattr(package, "vendor_name", None),
                         # imported once by the warm worker that forked this run (harness.providers.flaggems.preload)
                         preloaded=name in flaggems.PRELOADED)
            libentry = sys.modules.get(f"{name}.utils.libentry")
            if libentry is not None and "run" in vars(getattr(libentry, "LibEntry", object)):
                self._empty_entries_as_first_called(libentry.LibEntry)
            if libentry is not None and hasattr(libentry, "LibTuner"):
                self.autotune.install_on(libentry.LibTuner)
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

    def _parse_yaml_in_c(self, base) -> str:
        """Upstream's set_shapes parses the whole level's shape file (core_shapes.yaml, ~850 lines) with the
        pure-Python safe loader on every step: ~70 ms on a CPU host, 0.47 s of a profiled FlagGems step on an
        H100 host. Where PyYAML has libyaml, the benchmark module's `yaml.safe_load` is the same safe loading
        in C (yaml.CSafeLoader), the pure-Python one for a text libyaml refuses. Which one ran: run.json."""
        import types

        import yaml

        if not getattr(yaml, "__with_libyaml__", False) or getattr(base, "yaml", None) is not yaml:
            return "pyyaml"

        def safe_load(stream):
            text = stream.read() if hasattr(stream, "read") else stream
            try:
                return yaml.load(text, Loader=yaml.CSafeLoader)
            except yaml.YAMLError:
                return yaml.safe_load(text)

        in_c = types.ModuleType("yaml", "PyYAML, its safe_load in C")
        vars(in_c).update({k: v for k, v in vars(yaml).items() if not k.startswith("__")})
        in_c.safe_load = safe_load
        self.patched.append((base, "yaml", yaml))
        base.yaml = in_c
        return "libyaml"

    def _empty_entries_as_first_called(self, entry_cls) -> None:
        """A LibEntry's first call in this run empties its caches (what an earlier run in this process
        chose would be replayed in place of this run's records, and its rows would name no config); that
        entry's later calls go to LibEntry.run itself, nothing added to their launch."""
        original = vars(entry_cls)["run"]
        called = self.entries_called

        def run(entry, *args, **kwargs):
            for cache in (*getattr(entry, "kernel_cache", ()), getattr(entry, "_cpu_cache", None)):
                if isinstance(cache, dict):
                    cache.clear()
            vars(entry)["run"] = original.__get__(entry)
            called.append(entry)
            return original(entry, *args, **kwargs)

        self.patched.append((entry_cls, "run", original))
        entry_cls.run = run

    def _patch_benchmark(self, base) -> None:
        if self.patched:
            return
        plugin = self
        bench_cls = base.Benchmark
        original_run = bench_cls.run
        original_set_dtypes = bench_cls.set_dtypes
        original_update = base.update_result

        def set_dtypes(bench, *args, **kwargs):
            try:
                result = original_set_dtypes(bench, *args, **kwargs)
            except Exception:
                # Upstream refused the dtypes asked for (checking them is all set_dtypes does): a fact
                # in run.json for the batch's dtype fallback, not wording to search a log for.
                rundir.merge_json(plugin.ctx.run_dir / rundir.RUN_JSON, {"observed": {"dtype_rejected": True}})
                raise
            plugin._narrow_dtypes(bench)  # before run() loops over them
            return result

        def run(bench, *args, **kwargs):
            # Hooked where every benchmark starts, not in set_shapes: a subclass with its own
            # set_shapes (upstream's channel_shuffle, unfold_copy) never calls the base one.
            plugin._take_inputs(bench)
            return original_run(bench, *args, **kwargs)

        def get_latency(bench, op, *args, **kwargs):
            return plugin._latency(bench, op, args, kwargs)

        def update_result(op, data):
            plugin._enrich(data)
            return original_update(op, data)

        # Put back as the run ends: a measuring host's next run (harness.child.host) patches the originals
        # for itself, not this run's wrappers over them.
        for owner, name, patched in ((bench_cls, "run", run), (bench_cls, "set_dtypes", set_dtypes),
                                     (bench_cls, "get_latency", get_latency), (base, "update_result", update_result)):
            self.patched.append((owner, name, owner.__dict__.get(name, _INHERITED)))
            setattr(owner, name, patched)

    # --- shapes and cases ------------------------------------------------------------------------
    def _our_entry(self, bench):
        """(keys tried, key found or None, its entry) of our shape file for this benchmark: its
        op_name, then its class chain."""
        keys = [bench.op_name, *(cls.__name__ for cls in type(bench).__mro__)]
        key = next((k for k in keys if k in self.our_shapes), None) if self.our_shapes is not None else None
        return keys, key, (self.our_shapes[key] if key is not None else None)

    def _narrow_dtypes(self, bench) -> None:
        """An entry's dtypes narrow the benchmark's own, unless --dtypes (passed upstream) was given."""
        _, key, entry = self._our_entry(bench)
        wanted = entry.get("dtypes") if isinstance(entry, dict) else None
        if wanted and not self.ctx.spec.dtypes:  # --dtypes, passed upstream, wins over the file
            takes = [d for d in bench.to_bench_dtypes if SHORT_DTYPES.get(str(d).removeprefix("torch.")) in wanted]
            if takes:
                bench.to_bench_dtypes = takes
            else:
                self._note(f"shapes: '{bench.op_name}' takes none of dtypes {wanted} of key '{key}': "
                           f"its own {[str(d).removeprefix('torch.') for d in bench.to_bench_dtypes]} are kept")

    def _override_shapes(self, bench):
        """Our shape file's entry for this benchmark into bench.shapes; returns the input iterator
        to use instead of the benchmark's own when that one hardcodes its shapes, else None."""
        if self.our_shapes is None:
            return None
        keys, key, entry = self._our_entry(bench)
        if key is None:
            self._note(f"shapes: {self.options.shapes_file} has no key for '{bench.op_name}' "
                       f"(tried {', '.join(keys)}): the checkout's own shapes are kept")
            return None
        listed = entry.get("shapes") if isinstance(entry, dict) else entry
        bench.shapes = [tuple(s) if isinstance(s, list) else (s,) for s in listed]
        self._note(f"shapes: key '{key}' of {self.options.shapes_file} ({len(bench.shapes)} shapes)")
        if not _reads_shapes(type(bench)):
            if not callable(getattr(bench, "input_fn", None)):
                raise RuntimeError(f"{type(bench).__name__}.get_input_iter hardcodes its shapes and the benchmark "
                                   "has no input_fn to feed ours through; run it with --shapes upstream")

            def from_our_shapes(dtype, _bench=bench):
                for shape in _bench.shapes:
                    yield from _bench.input_fn(shape, dtype, _bench.device)

            self._note(f"shapes: {type(bench).__name__}.get_input_iter hardcodes its shapes; ours are fed "
                       "through its input_fn")
            return from_our_shapes
        return None

    def _take_inputs(self, bench) -> None:
        """Each input the benchmark's iterator yields becomes one case, seeded before it is built.
        Our shapes go in when the iterator is first asked for, i.e. after run() set the
        benchmark's own (through whichever set_shapes)."""
        plugin = self
        own = bench.get_input_iter

        def seeded(dtype):
            inputs = (plugin._override_shapes(bench) or own)(dtype)
            while True:
                seed_everything(plugin.ctx.spec.seed)  # inputs built lazily: byte-identical on both sides
                try:
                    item = plugin._next_input(bench, inputs)
                except StopIteration:
                    return
                # Named (and counted, so later ids stay the record's) whether timed or not: a replay of
                # some cases (RunSpec.cases) gives upstream's loop only those.
                case_id, label = plugin._case_id(dtype, item)
                if not plugin.ctx.selects(case_id):
                    continue
                plugin._begin_case(bench, dtype, item, case_id, label)
                yield item

        bench.get_input_iter = seeded

    def _next_input(self, bench, inputs):
        """The iterator's next input, its big host draws made on the benchmark's device (HostDrawsOnDevice)."""
        import torch

        device = getattr(bench, "device", None)
        try:
            on_device = device is not None and torch.device(device).type != "cpu"
        except (RuntimeError, TypeError):
            on_device = False
        if not on_device:
            return next(inputs)
        draws = HostDrawsOnDevice(device)
        try:
            with draws:
                return next(inputs)
        finally:  # counted once the exit has filled what the input kept on the host
            for name, counted in draws.counts().items():
                self.host_draws[name].update(counted)

    def _flush_pending(self) -> None:
        """Timings of a case that ended with fewer than its metrics promised (a benchmark timing
        one side only, outside upstream's loop) still make its row, with the sides measured."""
        if self.pending and self.current is not None:
            bench = self.current["bench"]
            self._row(bench, _roles(getattr(bench, "to_bench_metrics", ("latency_base", "latency"))))

    def pytest_runtest_teardown(self, item):
        self._flush_pending()

    def _case_id(self, dtype, item) -> tuple[str, str]:
        """(the case id, its shape label) of the next input of `dtype`, counted: the same tensors with
        other arguments (level variants) are `#2`, `#3`..."""
        short = SHORT_DTYPES.get(str(dtype).removeprefix("torch."), str(dtype).removeprefix("torch."))
        label = _input_label(item)
        base_id = f"{short}-{label}"
        n = self.case_counts.get(base_id, 0) + 1
        self.case_counts[base_id] = n
        return (base_id, label) if n == 1 else (f"{base_id}#{n}", f"{label}#{n}")

    def _begin_case(self, bench, dtype, item, case_id: str, shape_label: str) -> None:
        self._flush_pending()
        short = case_id.split("-", 1)[0]
        if self.dtype_rows and self.dtype_rows[-1]["dtype"] != short:
            self.dtype_rows = []
        self.pending = []
        self.ctx.begin_case(self.hook, case_id, shape_label)
        self.current = {"bench": bench, "dtype": short, "label": case_id.split("-", 1)[1], "case": case_id,
                        "input_sha256": case_digest(self.ctx, item)}

    def _case_from_arguments(self, bench, args, kwargs) -> None:
        """A timing whose inputs did not come through a hooked input iterator (a benchmark that
        overrides run(), or times outside its loop): the case is named from the arguments timed.
        Its inputs were built by upstream, so their seeding is upstream's: said once."""
        import torch

        tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
        dtype = tensors[0].dtype if tensors else "none"
        self._note(f"inputs: {type(bench).__name__} times inputs that did not come through its input iterator: "
                   "cases are named from the arguments timed, and zl_bench did not seed their construction")
        item = (*args, *kwargs.values())
        self._begin_case(bench, dtype, item, *self._case_id(dtype, item))

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
        if self.current is None:
            self._case_from_arguments(bench, args, kwargs)
        metrics = getattr(bench, "to_bench_metrics", ("latency_base", "latency"))
        roles = _roles(metrics)
        # Upstream times the baseline first, then the candidate: the side is named as it is timed,
        # so its markers (NO_DEVICE_WORK side=...) say which one.
        side = roles[min(len(self.pending), len(roles) - 1)]
        # The row carries the kernels of the side timed last.
        carried = len(self.pending) >= len(roles) - 1
        measurement = self.measure(self.ctx.spec.op, {side: fn}, carried=carried).measurements.get(side)
        self.pending.append(measurement)  # None: a baseline this replay does not time (TimingPlugin.times_baseline)
        if len(self.pending) == len(roles):
            self._row(bench, roles)
        # Upstream divides by what it is handed (its speedup): an untimed baseline hands it NaN, not a number.
        return measurement.latency_ms if measurement is not None else math.nan

    def _row(self, bench, roles) -> None:
        measured = {role: m for role, m in zip(roles, self.pending, strict=False) if m is not None}
        timers = {m.timer for m in measured.values()}
        timer = timers.pop() if len(timers) == 1 else "mixed"
        if timer == "mixed":
            self.ctx.mark("TIMER_MIXED " + " ".join(f"{k}={m.timer}" for k, m in measured.items()))
        cur = self.current
        row = make_row(self.ctx, op=self.ctx.spec.op, dtype=cur["dtype"], shape=[cur["label"]], params={},
                       case=cur["case"], status="SUCCESS", nodeid=self.options.node, measurements=measured,
                       timer=timer, input_sha256=cur["input_sha256"])
        row["benchmark"] = type(cur["bench"]).__name__
        self.dtype_rows.append(row)
        self.pending = []
        self.current = None  # a further timing of these inputs is a case of its own
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
        for owner, name, original in reversed(self.patched):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self.patched.clear()
        for entry in self.entries_called:
            vars(entry).pop("run", None)
        self.entries_called.clear()
        dropped = _drop_modules_under(Path(self.options.root) / "benchmark")
        rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"flaggems": {
            "benchmark_modules_dropped": dropped, "host_draws_on_device": self.host_draws}}})
        if self.notes:
            rundir.merge_json(self.ctx.run_dir / rundir.RUN_JSON, {"observed": {"flaggems_notes": self.notes}})


def _modules_under(root: Path) -> list[tuple[str, object]]:
    """(name, module) of the imported modules whose file is under `root` (as given or resolved)."""
    under = tuple(dict.fromkeys(f"{os.path.abspath(p)}{os.sep}" for p in (root, root.resolve())))
    return [(name, module) for name, module in list(sys.modules.items())
            if isinstance(getattr(module, "__file__", None), str) and module.__file__.startswith(under)]


def _drop_modules_under(root: Path) -> int:
    """Remove from sys.modules every module under `root`; how many."""
    found = _modules_under(root)
    for name, _ in found:
        del sys.modules[name]
    return len(found)


def child_args(options: FlagGemsOptions, dtypes: list[str], color: bool) -> list[str]:
    """pytest arguments for the upstream node: the checkout's own pytest config and options."""
    args = [str(Path(options.root) / options.node), "--rootdir", options.root,
            "-p", "no:cacheprovider", "-p", "no:unraisableexception", "--level", options.level,  # child.ini says why
            "-o", "console_output_style=classic", f"--color={'yes' if color else 'no'}",
            "-q", "--tb=short", "-rfE"]
    for dtype in dtypes:
        args += ["--dtypes", flaggems.TORCH_DTYPES[dtype]]
    return args
