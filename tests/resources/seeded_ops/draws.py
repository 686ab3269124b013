"""An operator whose inputs draw from all three generators the harness seeds: numpy's, Python's
`random` and torch's. Left unseeded, any one of them gives another process other inputs."""

import random

import numpy as np
import torch

from ops import Operator


def _inputs(shape, dtype, device):
    base = torch.from_numpy(np.random.standard_normal(shape)).to(dtype)
    scale = random.uniform(0.5, 2.0)
    noise = torch.randn(*shape, dtype=dtype)
    return ((base + noise).to(device), scale)


draws = Operator(name="draws", inputs=_inputs, baseline=torch.mul, candidate=lambda x, s: x * s,
                 dtypes=("fp32",), shape_keys=("pointwise",))
