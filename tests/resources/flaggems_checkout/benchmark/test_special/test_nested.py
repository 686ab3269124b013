import flag_gems
import pytest
import torch

from .. import base


class NestedBenchmark(base.GenericBenchmark):
    pass


def nested_input_fn(shape, dtype, device):
    yield torch.randn(shape, dtype=dtype, device=device),


@pytest.mark.scale_nested
def test_scale_nested():
    bench = NestedBenchmark(op_name="scale_nested", input_fn=nested_input_fn, torch_op=lambda x: x * 0.5,
                            gems_op=flag_gems.scale, dtypes=[torch.float32])
    bench.run()
