import dataclasses

import flag_gems
import pytest
import torch
import triton
import yaml

from . import consts
from .conftest import Config, update_result


class Benchmark:
    DEFAULT_DTYPES = consts.FLOAT_DTYPES
    DEFAULT_SHAPES = consts.DEFAULT_SHAPES
    DEFAULT_METRICS = consts.DEFAULT_METRICS

    def __init__(self, op_name, torch_op, dtypes=None, gems_op=None, is_backward=False, **kwargs):
        self.op_name = op_name
        self.torch_op = torch_op
        self.gems_op = gems_op
        self.is_backward = is_backward
        self.dtypes = dtypes or self.DEFAULT_DTYPES
        self.to_bench_dtypes = self.dtypes
        self.to_bench_metrics = list(self.DEFAULT_METRICS)
        self.shapes = self.DEFAULT_SHAPES
        self.device = flag_gems.device

    def set_shapes(self, shape_file_path):
        with open(shape_file_path) as f:
            data = yaml.safe_load(f)
        if self.op_name in data:
            self.shapes = data[self.op_name].get("shapes", self.DEFAULT_SHAPES)
        else:
            for cls in type(self).__mro__:
                if cls.__name__ in data:
                    self.shapes = data[cls.__name__].get("shapes", self.DEFAULT_SHAPES)
                    break
            else:
                self.shapes = self.DEFAULT_SHAPES
        self.shapes = [tuple(s) for s in self.shapes]
        if Config.bench_level == consts.BenchLevel.COMPREHENSIVE:
            self.shapes = list(dict.fromkeys(self.shapes + self.set_more_shapes()))

    def set_more_shapes(self):
        return []

    def set_dtypes(self, dtypes):
        if dtypes and not all(d in self.dtypes for d in dtypes):
            raise ValueError(f"Given dtype(s) can't be supported by this op '{self.op_name}'")
        self.to_bench_dtypes = dtypes or self.dtypes

    def get_latency(self, op, *args, **kwargs):
        return triton.testing.do_bench(lambda: op(*args, **kwargs), return_mode="median")

    def get_input_iter(self, dtype):
        raise NotImplementedError

    def run(self):
        self.set_dtypes(Config.user_desired_dtypes)
        self.set_shapes(Config.shape_file)
        for dtype in self.to_bench_dtypes:
            metrics = []
            for inputs in self.get_input_iter(dtype):
                args = [a for a in inputs if not isinstance(a, dict)]
                kwargs = {k: v for a in inputs if isinstance(a, dict) for k, v in a.items()}
                metric = consts.BenchmarkMetrics()
                try:
                    metric.shape_detail = [list(a.shape) if torch.is_tensor(a) else a for a in args]
                    metric.latency_base = self.get_latency(self.torch_op, *args, **kwargs)
                    with flag_gems.use_gems():
                        metric.latency = self.get_latency(self.gems_op or self.torch_op, *args, **kwargs)
                    metric.speedup = metric.latency_base / metric.latency
                    if "tflops" in self.to_bench_metrics:
                        metric.tflops = self.get_tflops(*args) / metric.latency / 1e9
                except Exception as e:
                    metric.error_msg = str(e)
                    pytest.fail(str(e))
                finally:
                    metrics.append(metric)
            result = consts.BenchmarkResult(op_name=self.op_name, dtype=str(dtype), mode=Config.mode.value,
                                            level=Config.bench_level.value, result=metrics)
            update_result(self.op_name, dataclasses.asdict(result))


class GenericBenchmark(Benchmark):
    def __init__(self, *args, input_fn, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_fn = input_fn

    def get_input_iter(self, dtype):
        for shape in self.shapes:
            yield from self.input_fn(shape, dtype, self.device)


class UnaryReductionBenchmark(Benchmark):
    def set_more_shapes(self):
        return [(3, 48)]

    def get_input_iter(self, dtype):
        for shape in self.shapes:
            yield torch.randn(shape, dtype=dtype, device=self.device),


class BlasBenchmark(Benchmark):
    DEFAULT_METRICS = consts.DEFAULT_METRICS + ["tflops"]

    def __init__(self, *args, input_fn, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_fn = input_fn

    def get_input_iter(self, dtype):
        for b, m, n, k in self.shapes:
            yield from self.input_fn(b, m, n, k, dtype, self.device)

    def get_tflops(self, a, b):
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
