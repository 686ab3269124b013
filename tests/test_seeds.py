"""The input digest: byte-exact where cheap, a device-side fingerprint for large device tensors.
The fingerprint runs on CPU tensors here: its arithmetic is the same on every device."""

import torch

from harness.child.plugins import seeds


def _bytes(n_values: int, dtype=torch.float32) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(n_values).to(dtype).view(torch.uint8)


def test_fingerprint_changes_with_any_word_and_any_reordering():
    flat = _bytes(4099)  # 16396 bytes: 2049 words and a 4-byte tail
    base = seeds._fingerprint(flat)
    for position in (0, 8000, 16390):  # first word, a middle word, the tail
        changed = flat.clone()
        changed[position] ^= 1
        assert seeds._fingerprint(changed) != base, position
    words = flat[:16392].view(torch.int64).clone()
    words[[3, 7]] = words[[7, 3]]
    swapped = torch.cat([words.view(torch.uint8), flat[16392:]])
    assert seeds._fingerprint(swapped) != base
    assert seeds._fingerprint(flat.clone()) == base


def test_fingerprint_does_not_depend_on_the_chunking(monkeypatch):
    flat = _bytes(10_000)
    whole = seeds._fingerprint(flat)
    monkeypatch.setattr(seeds, "CHUNK_WORDS", 7)  # many chunks, the last one short
    assert seeds._fingerprint(flat) == whole


def test_host_tensors_are_hashed_byte_for_byte_and_large_device_ones_fingerprinted(monkeypatch):
    x = torch.randn(300, 5)
    exact = seeds.input_sha256(x)
    monkeypatch.setattr(seeds, "EXACT_BYTES", 16)
    assert seeds.input_sha256(x) == exact  # on the host, the size does not matter
    fingerprinted = []
    monkeypatch.setattr(seeds, "_fingerprint", lambda flat: fingerprinted.append(flat.numel()) or b"fp")
    meta = torch.empty(300, 5, device="meta")  # a tensor not on the host, large for EXACT_BYTES=16
    seeds.input_sha256([meta])
    assert fingerprinted == [300 * 5 * 4]


def test_digest_covers_dtype_shape_layout_and_containers():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    digest = seeds.input_sha256
    assert digest(x) == digest(x.clone())
    assert digest(x.t()) == digest(x.t().contiguous())  # layout does not count, content does
    assert digest(x) != digest(x.reshape(4, 3))
    assert digest(x) != digest(x.double())
    assert digest([x, 1]) != digest([x, 2]) != digest((x, 2))
    assert digest({"a": x, "b": 1.0}) == digest({"b": 1.0, "a": x})
