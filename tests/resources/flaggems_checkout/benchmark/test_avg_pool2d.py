import flag_gems
import pytest
import torch

from . import base


class AvgPoolBenchmark(base.GenericBenchmark):
    # Hardcoded shapes, as several upstream pooling and conv benchmarks do: self.shapes is ignored.
    def get_input_iter(self, dtype):
        for shape in [(2, 3, 8, 8), (1, 4, 4, 4)]:
            yield from self.input_fn(shape, dtype, self.device)


def pool_input_fn(shape, dtype, device):
    yield torch.randn(shape, dtype=dtype, device=device), {"kernel_size": 2}


def torch_half(x, kernel_size):
    return x * 0.5


@pytest.mark.avg_pool2d
def test_avg_pool2d():
    bench = AvgPoolBenchmark(op_name="avg_pool2d", input_fn=pool_input_fn, torch_op=torch_half,
                             gems_op=flag_gems.scale, dtypes=[torch.float32])
    bench.run()
