"""Weight digests: exact, sensitive to any changed or moved word, equal across layouts."""

import pytest
import torch

from shared.digest import (
    _bytes,
    _cpu_sums,
    _device_sums,
    agreed,
    digesting,
    first_difference,
    tensor_digest,
    version_digest,
)


def reference_digest(t: torch.Tensor) -> str:
    """The definition, word by word in Python integers."""
    data = t.contiguous().view(torch.uint8).numpy().tobytes()
    data += b"\0" * (-len(data) % 8)
    words = [int.from_bytes(data[i : i + 8], "little", signed=True) for i in range(0, len(data), 8)]
    rows, cols = {}, {}
    for i, w in enumerate(words):
        rows[i // 64] = rows.get(i // 64, 0) + w
        cols[i % 64] = cols.get(i % 64, 0) + w
    r = sum((2 * k + 1) * v for k, v in rows.items()) % 2**64
    c = sum((2 * k + 1) * v for k, v in cols.items()) % 2**64
    return f"{t.numel() * t.element_size():x}-{r:016x}{c:016x}"


def test_digest_matches_the_reference_definition_for_dtypes_and_odd_sizes():
    gen = torch.Generator().manual_seed(0)
    cases = [((3, 5), torch.float32), ((7, 130), torch.bfloat16), ((1,), torch.float16),
             ((999,), torch.bfloat16), ((0,), torch.float32), ((4, 64), torch.float64)]  # fmt: skip
    for shape, dtype in cases:
        t = (torch.randn(shape, generator=gen) * 1e3).to(dtype)
        assert tensor_digest(t) == reference_digest(t), (shape, dtype)
    big = torch.full((1000,), -3.0e38)  # sums wrap around mod 2^64, exactly as the reference
    assert tensor_digest(big) == reference_digest(big)


def test_any_flipped_bit_or_moved_word_changes_the_digest():
    t = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    base = tensor_digest(t)
    raw = t.clone().view(torch.uint8)
    for byte in (0, 1, 4097, raw.numel() - 1):
        for bit in (0, 7):
            flipped = raw.clone()
            flipped.view(-1)[byte] ^= 1 << bit
            assert tensor_digest(flipped.view(torch.float32)) != base
    words = t.clone().view(torch.int64).view(-1)
    for i, j in [(0, 1), (0, 64), (5, 700)]:  # same row, same column, neither
        swapped = words.clone()
        swapped[i], swapped[j] = words[j], words[i]
        assert tensor_digest(swapped.view(torch.float32)) != base
    assert tensor_digest(t.T.contiguous()) != base  # same values, other layout
    assert tensor_digest(t.clone()) == base


def test_a_view_into_a_bucket_digests_like_the_tensor_itself():
    t = torch.randn(1001).to(torch.bfloat16)
    bucket = torch.cat([torch.randn(3).to(torch.bfloat16), t])
    assert tensor_digest(bucket[3:].view(7, 143)) == tensor_digest(t.view(7, 143))


def test_version_digest_first_difference_and_worker_agreement():
    a = {"w": "1", "b": "2"}
    assert version_digest(a) == version_digest(dict(reversed(a.items())))
    assert version_digest(a) != version_digest({**a, "b": "3"})
    assert first_difference(a, a) is None
    assert first_difference(a, {**a, "w": "9", "b": "9"}, order=["w", "b"]) == "w"
    assert first_difference(a, {**a, "w": "9", "b": "9"}) == "b"  # by name without an order
    assert first_difference(a, {"w": "1"}) == "b"
    assert agreed([a, dict(a)]) == a
    split = agreed([a, {**a, "b": "5"}])
    assert split["w"] == "1" and split["b"] == "workers disagree: 2, 5"


def test_digesting_passes_tensors_through_and_records_them():
    tensors = [("x", torch.ones(3)), ("y", torch.zeros(2))]
    seen: dict[str, str] = {}
    assert [n for n, _ in digesting(iter(tensors), seen)] == ["x", "y"]
    assert seen == {n: tensor_digest(t) for n, t in tensors}


def test_cpu_kernel_and_torch_reductions_agree_on_every_layout():
    """CPU tensors are reduced by the numba kernel, device tensors by torch: one checksum
    either way (the torch path run here on the CPU; the CUDA test below runs it on a GPU)."""
    gen = torch.Generator().manual_seed(2)
    bucket = torch.randn(5000, generator=gen).to(torch.bfloat16)
    cases = [
        torch.randn(300, 64, generator=gen) * 1e30,  # whole rows, large words
        torch.randn(2049, generator=gen).to(torch.bfloat16),  # partial row and padded word
        torch.randn(64 * 8 + 1, generator=gen).to(torch.float16),  # last row one padded word
        torch.full((4 * 64 - 1,), 7, dtype=torch.float16),  # tail fills the partial row
        bucket[3:2003],  # misaligned view
        torch.randn(3, 130, generator=gen).T,  # not contiguous
        torch.zeros(0),
    ]  # fmt: skip
    for t in cases:
        raw = _bytes(t)
        assert _cpu_sums(raw) == _device_sums(raw), (t.shape, t.dtype)
        assert tensor_digest(t) == reference_digest(t.contiguous()), (t.shape, t.dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_and_cpu_digests_agree():
    gen = torch.Generator().manual_seed(3)
    for t in (torch.randn(1000, 64, generator=gen), torch.randn(999, generator=gen).to(torch.bfloat16)):
        assert tensor_digest(t.cuda()) == tensor_digest(t)
    bucket = torch.randn(5000, generator=gen).to(torch.bfloat16).cuda()
    assert tensor_digest(bucket[3:2003]) == tensor_digest(bucket[3:2003].cpu())
