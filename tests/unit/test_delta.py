"""`shared/delta.py` against references: a delta restores the new version bit for bit, holds
exactly the changed words, and refuses a base it was not packed for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.delta import DeltaMismatch, apply, changed_words, from_words, pack, to_words


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
