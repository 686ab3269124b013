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


class UndigestableInput(Exception):
    """A tensor whose content the digest cannot reach (a kind of tensor it does not know)."""


# A sparse tensor is its index and value tensors, by layout; reading them does not densify it.
_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}


def _dense_parts(value: torch.Tensor) -> list[torch.Tensor]:
    """The strided tensors that hold a tensor's content: itself, a sparse tensor's indices and
    values, a nested tensor's components, a quantized tensor's integers, another layout's dense
    form."""
    if value.is_nested:
        return [part for component in value.unbind() for part in _dense_parts(component)]
    if value.layout in _SPARSE_PARTS:
        return [getattr(value, name)() for name in _SPARSE_PARTS[value.layout]]
    if value.layout != torch.strided:
        try:  # another layout (mkldnn): its dense form, if it has one
            return _dense_parts(value.to_dense())
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            raise UndigestableInput(f"{value.layout} tensor: {exc}") from exc
    if value.is_quantized:
        return [value.int_repr()]
    # Conjugate and negative views are lazy flags: their bytes are those of the tensor they view.
    return [value.resolve_conj().resolve_neg()]


def _on_host(value: torch.Tensor) -> bool:
    return value.device.type == "cpu"


def input_sha256(inputs) -> str:
    """sha256 over a case's inputs: each tensor's dtype, shape, layout and content (its bytes on the
    host or up to EXACT_BYTES, else a device-side fingerprint of them; a meta tensor has none);
    scalars and strings by value; containers in order. Other objects count by type only (their repr
    may hold an address, which differs between runs). Raises UndigestableInput for a tensor whose
    content it cannot reach."""
    digest = hashlib.sha256()

    def feed_content(value: torch.Tensor):
        if value.is_meta:
            return
        parts = _dense_parts(value.detach())
        for part in parts:
            flat = part.contiguous().reshape(-1).view(torch.uint8)
            if len(parts) > 1 or value.is_nested:  # where one part ends and the next begins
                digest.update(f"{tuple(part.shape)}\n".encode())
            if flat.numel() <= EXACT_BYTES or _on_host(flat):
                digest.update(flat.cpu().numpy().tobytes())
            else:
                digest.update(b"fingerprint " + _fingerprint(flat))

    def feed(value):
        if isinstance(value, torch.Tensor):
            # A plain tensor's header is dtype and shape, as digests have always been; other kinds
            # add their layout, and a strided one that is not plainly contiguous its strides and
            # storage offset (a transposed input runs another memory pattern with the same bytes).
            # A nested tensor has no single shape: its components' shapes follow.
            layout = str(value.layout).removeprefix("torch.")
            if value.is_nested:
                header = f"nested {layout}"
            elif value.layout == torch.strided:  # a quantized one too: its dtype tells it apart
                header = f"{tuple(value.shape)}"
                if not value.is_contiguous() or value.storage_offset():
                    header += f" strides {tuple(value.stride())} offset {value.storage_offset()}"
            else:
                header = f"{tuple(value.shape)} {layout}"
            digest.update(f"tensor {value.dtype} {header}\n".encode())
            feed_content(value)
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


def case_digest(ctx, inputs) -> str | None:
    """A case's input digest; where some input cannot be read, None and an INPUT_DIGEST_UNAVAILABLE
    marker on the row: the bookkeeping never fails the user's case."""
    try:
        return input_sha256(inputs)
    except UndigestableInput as exc:
        ctx.mark(f"INPUT_DIGEST_UNAVAILABLE reason={str(exc).splitlines()[0]!r}")
        return None


class SeedsPlugin:
    def __init__(self, ctx):
        self.ctx = ctx

    @pytest.fixture(autouse=True)
    def _seeded(self):
        seed_everything(self.ctx.spec.seed)
        yield
