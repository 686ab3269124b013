import flag_gems
import pytest
import torch

from . import base


def mm_input_fn(b, m, n, k, dtype, device):
    yield torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)


@pytest.mark.mm
def test_mm():
    bench = base.BlasBenchmark(op_name="mm", input_fn=mm_input_fn, torch_op=torch.mm, gems_op=flag_gems.mm,
                               dtypes=[torch.float32])
    bench.run()
