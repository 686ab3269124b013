"""The input digest: byte-exact where cheap, a device-side fingerprint for large device tensors.
The fingerprint runs on CPU tensors here: its arithmetic is the same on every device."""

import hashlib
import json
import os
import random
import types
from pathlib import Path

import numpy as np
import pytest
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
    monkeypatch.setattr(seeds, "_on_host", lambda t: False)  # as if on a device, large for EXACT_BYTES=16
    seeds.input_sha256([x])
    assert fingerprinted == [300 * 5 * 4]


def test_digest_covers_dtype_shape_layout_and_containers():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    digest = seeds.input_sha256
    assert digest(x) == digest(x.clone())
    # A transposed or offset view reads the same bytes in another pattern: its strides count.
    assert digest(x.t()) != digest(x.t().contiguous())
    assert digest(x.t()) == digest(x.clone().t())
    assert digest(x.reshape(-1)[4:]) != digest(x.reshape(-1)[4:].clone())
    assert digest(x) != digest(x.reshape(4, 3))
    assert digest(x) != digest(x.double())
    assert digest([x, 1]) != digest([x, 2]) != digest((x, 2))
    assert digest({"a": x, "b": 1.0}) == digest({"b": 1.0, "a": x})


def _kinds(x: torch.Tensor) -> dict:
    """The same 4x4 content as every kind of tensor the digest reads."""
    return {
        "strided": x, "coo": x.to_sparse(), "csr": x.to_sparse_csr(), "csc": x.to_sparse_csc(),
        "bsr": x.to_sparse_bsr((2, 2)), "bsc": x.to_sparse_bsc((2, 2)),
        "nested": torch.nested.nested_tensor([x[0], x[3, :3]]),
        "jagged": torch.nested.nested_tensor([x[0], x[3, :3]], layout=torch.jagged),
        "quantized": torch.quantize_per_tensor(x, 0.5, 0, torch.qint8),
        "conj": torch.complex(x, x).conj(), "neg": torch._neg_view(x),  # lazy views, contiguous
        "mkldnn": x.to_mkldnn(),
    }


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse CSR, nested and quantized are beta
def test_every_kind_of_tensor_is_read_by_content_and_kind():
    x = torch.tensor([[0.0, 1.0, 0.0, 2.0], [3.0, 0.0, 0.0, 4.0], [0.0, 0.0, 5.0, 0.0], [6.0, 0.0, 7.0, 8.0]])
    changed = x.clone()
    changed[3, 2] = 9.0  # a non-zero changed: in every kind's values or components
    moved = x.clone()
    moved[3, 1], moved[3, 2] = 7.0, 0.0  # the same values elsewhere: only a sparse kind's indices differ
    digest = seeds.input_sha256
    a = _kinds(x)
    for other in (changed, moved):
        b = _kinds(other)
        for kind in a:
            assert digest(a[kind]) == digest(_kinds(x.clone())[kind]), kind
            assert digest(a[kind]) != digest(b[kind]), kind
    assert len({digest(t) for t in a.values()}) == len(a)  # the kind counts, not only the numbers
    # a lazy conjugate or negative view reads as its resolved content
    assert digest(a["conj"]) == digest(a["conj"].resolve_conj())
    assert digest(a["neg"]) == digest(-x)


def test_a_meta_tensor_counts_by_dtype_and_shape():
    digest = seeds.input_sha256
    assert digest(torch.empty(3, 4, device="meta")) == digest(torch.empty(3, 4, device="meta"))
    assert digest(torch.empty(3, 4, device="meta")) != digest(torch.empty(4, 3, device="meta"))


class _Unreadable:
    """Stands for a tensor of a layout the digest does not know and that has no dense form."""
    is_nested = False
    layout = "some_future_layout"

    def to_dense(self):
        raise RuntimeError("no dense form")


def test_an_unreadable_tensor_raises_and_marks_the_case_instead_of_failing_it(monkeypatch):
    with pytest.raises(seeds.UndigestableInput, match="some_future_layout tensor: no dense form"):
        seeds._dense_parts(_Unreadable())

    def unreadable(inputs):
        raise seeds.UndigestableInput("some_future_layout tensor: no dense form")

    marks = []
    ctx = types.SimpleNamespace(mark=marks.append)
    assert seeds.case_digest(ctx, [torch.ones(2)]) == seeds.input_sha256([torch.ones(2)])
    assert marks == []
    monkeypatch.setattr(seeds, "input_sha256", unreadable)
    assert seeds.case_digest(ctx, [torch.ones(2)]) is None
    assert marks == ["INPUT_DIGEST_UNAVAILABLE reason='some_future_layout tensor: no dense form'"]


def test_a_plain_tensors_digest_is_its_dtype_shape_and_bytes_as_records_have_it():
    # The format records already carry: other kinds of tensor must not change it.
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert seeds.input_sha256(x) == hashlib.sha256(b"tensor torch.float32 (2, 3)\n" + x.numpy().tobytes()).hexdigest()


# --- seeding: an operator that draws from numpy, random and torch (resources/seeded_ops) ------------
SEEDED_OPS = Path(__file__).parent / "resources" / "seeded_ops"
# Two cases under the seeds plugin: each writes the digest of the inputs the operator drew for it.
CASES = """
import json, os, sys
sys.path.insert(0, {ops!r})
import pytest, torch
from draws import draws
from harness.child.plugins.seeds import input_sha256

@pytest.mark.parametrize("case", ["first", "second"])
def test_case(case):
    with open(os.environ["ZL_DIGESTS"], "a") as out:
        out.write(json.dumps([case, input_sha256(draws.inputs((3, 5), torch.float32, "cpu"))]) + "\\n")
"""


def digests_of_a_run(tmp_path, seed, name):
    """The cases' input digests in a pytest session under SeedsPlugin alone, as the child runs it."""
    cases = tmp_path / "test_cases.py"
    cases.write_text(CASES.format(ops=str(SEEDED_OPS)))
    out = tmp_path / f"{name}.jsonl"
    os.environ["ZL_DIGESTS"] = str(out)
    plugin = seeds.SeedsPlugin(types.SimpleNamespace(spec=types.SimpleNamespace(seed=seed)))
    try:
        code = pytest.main([str(cases), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)], plugins=[plugin])
    finally:
        del os.environ["ZL_DIGESTS"]
    assert code == 0
    return [tuple(json.loads(line)) for line in out.read_text().splitlines()]


def test_every_case_draws_the_same_inputs_from_numpy_random_and_torch_under_its_seed(tmp_path):
    # A process draws on between cases (the second case here, another op's cases in a batch): each
    # case starts from the seed, so the second case's inputs are the first's.
    first = digests_of_a_run(tmp_path, 0, "first")
    assert [case for case, _ in first] == ["first", "second"] and first[0][1] == first[1][1]
    # The generators' states are not left to chance between runs: draws elsewhere do not show.
    np.random.standard_normal(17), random.random(), torch.randn(3)
    assert digests_of_a_run(tmp_path, 0, "again") == first
    assert digests_of_a_run(tmp_path, 1, "other")[0][1] != first[0][1]


@pytest.mark.parametrize("generator", ["numpy", "random", "torch"])
def test_each_generator_the_operator_draws_from_is_seeded(generator, monkeypatch):
    monkeypatch.syspath_prepend(str(SEEDED_OPS))
    import draws as module

    disturb = {"numpy": lambda: np.random.seed(99), "random": lambda: random.seed(99),
               "torch": lambda: torch.manual_seed(99)}[generator]

    def drawn(before=False, after=False):
        if before:
            disturb()
        seeds.seed_everything(3)
        if after:
            disturb()
        return seeds.input_sha256(module.draws.inputs((4, 4), torch.float32, "cpu"))

    assert drawn(before=True) == drawn()  # whatever state the generator was left in, the seed resets it
    assert drawn(after=True) != drawn()  # and the operator does draw from it


# --- the digest's format: records carry it, so a later version must compute the same -------------
def sha(*chunks: bytes) -> str:
    return hashlib.sha256(b"".join(chunks)).hexdigest()


def test_the_fingerprint_is_two_wrapping_int64_sums_and_the_tail():
    flat = _bytes(4099)  # 2049 words and a 4-byte tail
    words = flat[:16392].numpy().view(np.uint64).astype(object)  # exact integers, reduced by hand below
    plain = sum(words) % 2 ** 64
    weighted = sum((2 * i + 1) * w for i, w in enumerate(words)) % 2 ** 64

    def signed(x):
        return x - 2 ** 64 if x >= 2 ** 63 else x

    assert seeds._fingerprint(flat) == f"{signed(plain)} {signed(weighted)} ".encode() + flat[16392:].numpy().tobytes()


def test_a_large_device_tensors_digest_is_its_header_and_fingerprint(monkeypatch):
    monkeypatch.setattr(seeds, "_on_host", lambda t: False)  # as if on a device
    monkeypatch.setattr(seeds, "EXACT_BYTES", 16)
    x = torch.arange(4, dtype=torch.float32)  # 16 bytes: at the limit, still exact
    assert seeds.input_sha256(x) == sha(b"tensor torch.float32 (4,)\n", x.numpy().tobytes())
    y = torch.arange(5, dtype=torch.float32)
    flat = y.view(torch.uint8)
    assert seeds.input_sha256(y) == sha(b"tensor torch.float32 (5,)\n", b"fingerprint ", seeds._fingerprint(flat))


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse CSR is beta
def test_the_headers_of_views_sparse_and_nested_tensors_and_of_other_values():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = x.t()
    assert seeds.input_sha256(t) == sha(b"tensor torch.float32 (4, 3) strides (1, 4) offset 0\n",
                                        t.contiguous().numpy().tobytes())
    coo = torch.eye(2).to_sparse()
    i, v = coo._indices(), coo._values()
    assert seeds.input_sha256(coo) == sha(b"tensor torch.float32 (2, 2) sparse_coo\n",
                                          b"(2, 2)\n", i.numpy().tobytes(), b"(2,)\n", v.numpy().tobytes())
    nested = torch.nested.nested_tensor([torch.ones(2)])
    assert seeds.input_sha256(nested) == sha(b"tensor torch.float32 nested strided\n", b"(2,)\n",
                                             torch.ones(2).numpy().tobytes())
    assert seeds.input_sha256([7, None, "a"]) == sha(b"list 3\n", b"int 7\n", b"NoneType None\n", b"str 'a'\n")
    # Keys in the order of their reprs ("'b'" before "2"), whatever their types.
    assert seeds.input_sha256({2: "c", "b": 1}) == sha(b"dict 2\n", b"str 'b'\n", b"int 1\n", b"int 2\n", b"str 'c'\n")
    assert seeds.input_sha256(object()) == sha(b"object object\n")


def test_dict_keys_and_values_and_other_objects_count():
    digest = seeds.input_sha256
    assert digest({"a": 1}) != digest({"b": 1}) and digest({"a": 1}) != digest({"a": 2})

    class Other:
        pass

    assert digest(object()) == digest(object()) != digest(Other())
