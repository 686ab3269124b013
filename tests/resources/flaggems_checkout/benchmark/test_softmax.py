import flag_gems
import pytest
import torch

from . import base


@pytest.mark.softmax
def test_softmax():
    bench = base.UnaryReductionBenchmark(op_name="softmax", torch_op=torch.softmax,
                                         gems_op=flag_gems.softmax, dtypes=[torch.float32, torch.float16])
    bench.torch_op = lambda x: torch.softmax(x, dim=-1)
    bench.run()


@pytest.mark.log_softmax
def test_log_softmax():
    bench = base.UnaryReductionBenchmark(op_name="log_softmax", torch_op=torch.log_softmax,
                                         gems_op=flag_gems.log_softmax, dtypes=[torch.float32])
    bench.torch_op = lambda x: torch.log_softmax(x, dim=-1)
    bench.run()
