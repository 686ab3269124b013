import pytest
import torch

from . import base


class OwnShapesBenchmark(base.Benchmark):
    """Shapes decided in the subclass's own set_shapes (upstream's channel_shuffle, unfold_copy):
    the base class's set_shapes never runs."""

    def set_shapes(self, shape_file_path=None):
        self.shapes = [((2, 8), 2), ((4, 16), 4)]

    def get_input_iter(self, dtype):
        for shape, shift in self.shapes:
            yield torch.randn(shape, dtype=dtype, device=self.device), shift


@pytest.mark.own_shapes
def test_own_shapes():
    bench = OwnShapesBenchmark(op_name="own_shapes", torch_op=lambda x, s: torch.roll(x, s, 1),
                               dtypes=[torch.float32])
    bench.run()


@pytest.mark.direct_latency
def test_direct_latency():
    # Times without run() and without any input iterator.
    bench = base.Benchmark(op_name="direct_latency", torch_op=torch.abs, dtypes=[torch.float32])
    x = torch.randn(8, 8, device=bench.device)
    bench.get_latency(torch.abs, x)
