"""`shared/delta.py` against references: a delta restores the new version bit for bit, holds
exactly the changed words, and refuses a base it was not packed for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.delta import (
    DeltaMismatch,
    _planes,
    _unplanes,
    apply,
    changed_words,
    from_words,
    pack,
    read_header,
    to_words,
)


def bf16_versions(seed: int, shapes: dict[str, tuple[int, ...]], share: float):
    """Version V-1 and V as bf16 words, as an optimizer step in fp32 then a cast would give."""
    gen = torch.Generator().manual_seed(seed)
    base, new = {}, {}
    for name, shape in shapes.items():
        master = torch.randn(shape, generator=gen) * 0.02
        step = torch.randn(shape, generator=gen) * 1e-4 * (torch.rand(shape, generator=gen) < share)
        base[name] = to_words(master.to(torch.bfloat16))
        new[name] = to_words((master + step).to(torch.bfloat16))
    return base, new


SHAPES = {"embed.weight": (64, 32), "layers.0.w": (32, 32), "layers.0.b": (32,), "norm": (1,)}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("share", [0.0, 0.01, 0.3, 1.0])
def test_apply_of_pack_restores_the_new_version_bit_for_bit(seed, share):
    base, new = bf16_versions(seed, SHAPES, share)
    blob = pack(base, new)
    restored = apply(base, blob)
    assert sorted(restored) == sorted(new)
    for name in new:
        assert restored[name].dtype == np.uint16 and np.array_equal(restored[name], new[name]), name
    reference = sum(int((base[n] != new[n]).sum()) for n in new)
    assert changed_words(blob) == (reference, sum(a.size for a in new.values()))


def test_apply_never_changes_the_base_and_shares_unchanged_tensors():
    base, new = bf16_versions(7, SHAPES, 0.05)
    new["norm"] = base["norm"].copy()
    before = {n: a.copy() for n, a in base.items()}
    restored = apply(base, pack(base, new))
    assert all(np.array_equal(base[n], before[n]) for n in base)
    assert restored["norm"] is base["norm"]


def test_a_sparse_change_packs_far_smaller_than_the_weights():
    base, new = bf16_versions(3, {"w": (1024, 1024)}, 0.01)
    blob = pack(base, new)
    full = base["w"].nbytes
    changed, _ = changed_words(blob)
    assert 0 < changed < 0.02 * base["w"].size
    assert len(blob) < full / 20


def test_words_of_several_element_sizes_round_trip():
    gen = torch.Generator().manual_seed(1)
    base = {"a": torch.randn(100, generator=gen), "b": torch.randn(50, generator=gen).to(torch.bfloat16)}
    new = {"a": base["a"].clone(), "b": base["b"].clone()}
    new["a"][[3, 97]] += 1.0
    new["b"][0] = -new["b"][0]
    words = {n: to_words(t) for n, t in base.items()}
    restored = apply(words, pack(words, {n: to_words(t) for n, t in new.items()}))
    for n, t in new.items():
        back = from_words(restored[n], t.dtype, list(t.shape))
        assert torch.equal(back, t) and back.dtype == t.dtype


def test_a_delta_refuses_a_base_of_other_tensors_or_sizes():
    base, new = bf16_versions(2, SHAPES, 0.1)
    blob = pack(base, new)
    with pytest.raises(DeltaMismatch, match="tensors differ"):
        apply({n: a for n, a in base.items() if n != "norm"}, blob)
    with pytest.raises(DeltaMismatch, match="words"):
        apply({**base, "norm": np.zeros(2, np.uint16)}, blob)
    with pytest.raises(DeltaMismatch, match="tensors differ"):
        pack(base, {**new, "extra": np.zeros(1, np.uint16)})
    with pytest.raises(DeltaMismatch, match="bad magic"):
        apply(base, b"not a delta")


def reference_planes(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words.view(np.uint8).reshape(-1, words.itemsize).T).reshape(-1)


def test_the_streams_hold_gaps_and_xors_as_byte_planes_in_the_documented_layout():
    """The wire format, byte for byte before compression: positions as uint32 gaps (the first
    absolute), then the XORs in element-size order, each stream split into byte planes."""
    import pyarrow as pa

    base, new = bf16_versions(7, {**SHAPES, "big": (300, 70)}, 0.2)
    gen = torch.Generator().manual_seed(3)
    master = torch.randn(40, generator=gen)
    base["fp32"], new["fp32"] = (
        to_words(master),
        to_words(master + (torch.rand(40, generator=gen) < 0.5) * 1e-3),
    )
    blob = pack(base, new)
    header, at = read_header(blob)
    (gap_packed, gap_size), (value_packed, value_size) = header["sizes"]
    codec = pa.Codec(header["codec"])
    gaps = codec.decompress(blob[at : at + gap_packed], decompressed_size=gap_size, asbytes=True)
    values = codec.decompress(blob[at + gap_packed :], decompressed_size=value_size, asbytes=True)
    assert at + gap_packed + value_packed == len(blob)
    names = sorted(new)
    where = {n: np.flatnonzero(base[n] != new[n]) for n in names}
    expected_gaps = np.concatenate([np.diff(where[n], prepend=0).astype(np.uint32) for n in names])
    xors = {
        size: np.concatenate([(base[n] ^ new[n])[where[n]] for n in names if new[n].itemsize == size])
        for size in (2, 4)
    }
    assert gaps == reference_planes(expected_gaps).tobytes()
    assert values == reference_planes(xors[2]).tobytes() + reference_planes(xors[4]).tobytes()
    assert [t["name"] for t in header["tensors"]] == names


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_byte_planes_match_the_transpose_and_invert(dtype):
    words = np.random.default_rng(1).integers(0, np.iinfo(dtype).max, 1001, dtype=dtype, endpoint=True)
    planes = _planes(words, words.itemsize)
    assert planes.reshape(-1).tobytes() == reference_planes(words).tobytes()
    assert np.array_equal(_unplanes(planes.reshape(-1), words.itemsize, words.dtype.name), words)
    assert _planes(words[:0], words.itemsize).size == 0
