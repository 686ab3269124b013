import dataclasses
from enum import Enum

import torch

FLOAT_DTYPES = [torch.float16, torch.float32, torch.bfloat16]
DEFAULT_SHAPES = [(64,), (1024,)]
DEFAULT_METRICS = ["latency_base", "latency", "speedup"]


class BenchLevel(Enum):
    COMPREHENSIVE = "comprehensive"
    CORE = "core"


class BenchMode(Enum):
    KERNEL = "kernel"
    OPERATOR = "operator"


@dataclasses.dataclass
class BenchmarkMetrics:
    shape_detail: object = None
    latency_base: float = None
    latency: float = None
    speedup: float = None
    tflops: float = None
    error_msg: str = None


@dataclasses.dataclass
class BenchmarkResult:
    op_name: str
    dtype: str
    mode: str
    level: str
    result: list
