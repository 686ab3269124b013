"""Seeds: random, numpy and torch seeded identically before every case, so data-dependent
operators (sort, topk, unique) see byte-identical inputs on both sides of an A/B. Each row carries
a digest of its inputs (`input_sha256`), which makes that promise checkable: a replay's rows must
show the record's digests."""

import hashlib
import random

import numpy as np
import pytest
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every accelerator's default generator


def input_sha256(inputs) -> str:
    """sha256 over a case's inputs: each tensor's dtype, shape and bytes; scalars and strings by
    value; containers in order. Other objects count by type only (their repr may hold an address,
    which differs between runs)."""
    digest = hashlib.sha256()

    def feed(value):
        if isinstance(value, torch.Tensor):
            flat = value.detach().contiguous().cpu().reshape(-1)
            digest.update(f"tensor {value.dtype} {tuple(value.shape)}\n".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        elif value is None or isinstance(value, (bool, int, float, complex, str, torch.dtype)):
            digest.update(f"{type(value).__name__} {value!r}\n".encode())
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__} {len(value)}\n".encode())
            for item in value:
                feed(item)
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)}\n".encode())
            for key in sorted(value, key=repr):
                feed(key)
                feed(value[key])
        else:
            digest.update(f"object {type(value).__qualname__}\n".encode())

    feed(inputs)
    return digest.hexdigest()


class SeedsPlugin:
    def __init__(self, ctx):
        self.ctx = ctx

    @pytest.fixture(autouse=True)
    def _seeded(self):
        seed_everything(self.ctx.spec.seed)
        yield
