"""Seeds: random, numpy and torch seeded identically before every case, so data-dependent
operators (sort, topk, unique) see byte-identical inputs on both sides of an A/B."""

import random

import numpy as np
import pytest
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every accelerator's default generator


class SeedsPlugin:
    def __init__(self, ctx):
        self.ctx = ctx

    @pytest.fixture(autouse=True)
    def _seeded(self):
        seed_everything(self.ctx.spec.seed)
        yield
