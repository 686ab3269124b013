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


# Host tensors and small device tensors are hashed byte for byte; larger device tensors are reduced
# where they live first (a 4 GiB input copied to the host and hashed costs seconds per row, most of
# a FlagGems op's wall), in chunks so the reduction never needs more than a few hundred MiB.
EXACT_BYTES = 1 << 20
CHUNK_WORDS = 1 << 25


def _fingerprint(flat_bytes: torch.Tensor) -> bytes:
    """Two wrap-around int64 sums over the tensor's 8-byte words, on its own device: the plain sum
    changes with any word, the position-weighted one with any reordering. Integer sums are exact
    and order-independent, so the result is the same on every run; the tail that fills no word is
    fed as is."""
    n_words = flat_bytes.numel() // 8
    words = flat_bytes[: n_words * 8].view(torch.int64)
    plain = torch.zeros((), dtype=torch.int64, device=words.device)
    weighted = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, n_words, CHUNK_WORDS):
        chunk = words[start:start + CHUNK_WORDS]
        # Odd weights (2i+1): multiplication by an odd number is a bijection mod 2**64.
        weights = torch.arange(2 * start + 1, 2 * (start + chunk.numel()) + 1, 2, dtype=torch.int64,
                               device=words.device)
        plain += chunk.sum()
        weighted += (chunk * weights).sum()
    tail = flat_bytes[n_words * 8:].cpu().numpy().tobytes()
    return f"{int(plain)} {int(weighted)} ".encode() + tail


def input_sha256(inputs) -> str:
    """sha256 over a case's inputs: each tensor's dtype, shape and content (its bytes on the host
    or up to EXACT_BYTES, else a device-side fingerprint of them); scalars and strings by value; containers
    in order. Other objects count by type only (their repr may hold an address, which differs
    between runs)."""
    digest = hashlib.sha256()

    def feed(value):
        if isinstance(value, torch.Tensor):
            flat = value.detach().contiguous().reshape(-1).view(torch.uint8)
            digest.update(f"tensor {value.dtype} {tuple(value.shape)}\n".encode())
            if flat.numel() <= EXACT_BYTES or flat.device.type == "cpu":
                digest.update(flat.cpu().numpy().tobytes())
            else:
                digest.update(b"fingerprint " + _fingerprint(flat))
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
