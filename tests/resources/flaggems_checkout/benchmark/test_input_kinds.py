import pytest
import torch

from . import base


class SparseInputBenchmark(base.Benchmark):
    """Inputs that are not plain strided tensors (upstream's sparse_sampled_addmm builds CSR ones):
    a sparse CSR matrix times a dense one."""

    def get_input_iter(self, dtype):
        for m, n in self.shapes:
            dense = torch.randn(m, n, dtype=dtype, device=self.device)
            sparse = (dense * (dense > 0.5)).to_sparse_csr()
            yield sparse, torch.randn(n, 4, dtype=dtype, device=self.device)


@pytest.mark.sparse_input
def test_sparse_input():
    bench = SparseInputBenchmark(op_name="sparse_input", torch_op=lambda a, b: a @ b, dtypes=[torch.float32])
    bench.run()
