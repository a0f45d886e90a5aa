"""Weight digests: exact, equal across layouts, and changed by any single changed word, any
swap of two different words, a 2x2 rectangle of +-x, a dtype reinterpretation and a reshape,
each checked over many seeded random cases (property tests without a library: hypothesis
is not installed)."""

import random

import pytest
import torch

from shared.digest import (
    MOD,
    WIDTH,
    H,
    K,
    _bytes,
    _cpu_sums,
    _device_sums,
    agreed,
    digesting,
    first_difference,
    tensor_digest,
    version_digest,
)

CASES = 300  # random cases per property
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8]


def reference_digest(t: torch.Tensor) -> str:
    """The definition, word by word in Python integers."""
    data = t.contiguous().view(torch.uint8).numpy().tobytes()
    data += b"\0" * (-len(data) % 4)
    words = [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]
    rows = -(-len(words) // WIDTH)
    p = sum((2 * i + 1) * w for i, w in enumerate(words)) % MOD
    q = sum((H[i % WIDTH] * (rows - i // WIDTH) + K[i % WIDTH]) * w for i, w in enumerate(words)) % MOD
    dtype, shape = str(t.dtype).removeprefix("torch."), "x".join(map(str, t.shape))
    return f"{dtype}[{shape}]:{t.numel() * t.element_size():x}-{p:016x}{q:016x}"


def random_tensor(rng: random.Random) -> torch.Tensor:
    """A tensor of random shape (1 to 3 dimensions, up to ~5000 elements), dtype and values,
    sometimes with many repeated values (so swaps and rectangles meet equal words)."""
    dims = [rng.randint(1, 70) for _ in range(rng.randint(1, 3))]
    dtype = rng.choice(DTYPES)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    if dtype.is_floating_point:
        t = (torch.randn(dims, generator=gen) * 10 ** rng.randint(-3, 3)).to(dtype)
    else:
        t = torch.randint(0, 100 if dtype == torch.uint8 else 2**31 - 1, dims, generator=gen, dtype=dtype)
    if rng.random() < 0.3:
        t = t.flatten().clamp(max=t.flatten()[0]).reshape(dims) if dtype != torch.uint8 else t // 50
    return t


def words_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's 32-bit words (a copy), as int32; the tensor's bytes must fill whole words."""
    return _bytes(t).clone().view(torch.int32)


def as_tensor(words: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return words.view(torch.uint8).view(like.dtype).reshape(like.shape)


def whole_words(rng: random.Random) -> torch.Tensor:
    while (t := random_tensor(rng)).numel() * t.element_size() % 4 or t.numel() * t.element_size() < 8:
        pass
    return t


def test_digest_matches_the_reference_definition_for_dtypes_and_odd_sizes():
    rng = random.Random(0)
    for _ in range(40):
        t = random_tensor(rng)
        assert tensor_digest(t) == reference_digest(t), (t.shape, t.dtype)
    for t in (torch.zeros(0), torch.ones(1, dtype=torch.uint8), torch.full((1000,), -3.0e38)):
        assert tensor_digest(t) == reference_digest(t), (t.shape, t.dtype)  # sums wrap mod 2^64


def test_any_single_changed_word_changes_the_digest():
    rng = random.Random(1)
    for _ in range(CASES):
        t = whole_words(rng)
        words = words_of(t)
        i = rng.randrange(words.numel())
        delta = rng.choice([1, -1, 1 << 31, rng.randrange(1, 2**32)])
        changed = words.clone()
        changed[i] = ((int(words[i]) + delta + 2**31) % 2**32) - 2**31
        if torch.equal(changed, words):
            continue
        assert tensor_digest(as_tensor(changed, t)) != tensor_digest(t), (t.shape, t.dtype, i, delta)


def test_any_swap_of_two_different_words_changes_the_digest():
    rng = random.Random(2)
    for _ in range(CASES):
        t = whole_words(rng)
        words = words_of(t)
        n = words.numel()
        i = rng.randrange(n)
        j = rng.choice([(i + 1) % n, (i + WIDTH) % n, rng.randrange(n)])  # same row, column, any
        if j == i:
            j = (i + 1) % n
        if words[i] == words[j]:
            words[j] = words[j] ^ (1 << rng.randrange(31))  # make them differ
            t = as_tensor(words, t)
        swapped = words.clone()
        swapped[i], swapped[j] = words[j], words[i]
        assert tensor_digest(as_tensor(swapped, t)) != tensor_digest(t), (t.shape, t.dtype, i, j)
    signs = torch.tensor([1.0, -1.0] * 200)  # words that differ in the sign bit alone
    assert tensor_digest(signs.flip(0)) != tensor_digest(signs)


def test_a_rectangle_of_plus_and_minus_x_changes_the_digest():
    """+x at (r, c) and (r', c'), -x at (r, c') and (r', c): every row and column sum stays."""
    rng = random.Random(3)
    for _ in range(CASES):
        rows, cols = rng.randint(2, 90), rng.randint(2, 90)
        words = torch.randint(
            0,
            2**30,
            (rows, cols),
            dtype=torch.int32,
            generator=torch.Generator().manual_seed(rng.randrange(2**31)),
        )
        r1, r2 = rng.sample(range(rows), 2)
        c1, c2 = rng.sample(range(cols), 2)
        x = rng.choice([1, 1 << rng.randrange(30), rng.randrange(1, 2**29)])
        changed = words.clone()
        changed[r1, c1] += x
        changed[r2, c2] += x
        changed[r1, c2] -= x
        changed[r2, c1] -= x
        assert torch.equal(changed.sum(0), words.sum(0)) and torch.equal(changed.sum(1), words.sum(1))
        assert tensor_digest(changed) != tensor_digest(words), (rows, cols, r1, r2, c1, c2, x)


def test_a_dtype_reinterpretation_or_a_reshape_changes_the_digest():
    rng = random.Random(4)
    others = {
        torch.float32: torch.int32,
        torch.int32: torch.float32,
        torch.bfloat16: torch.float16,
        torch.float16: torch.bfloat16,
        torch.uint8: torch.int8,
    }
    for _ in range(CASES):
        t = random_tensor(rng)
        same_bytes = t.view(others[t.dtype])
        assert torch.equal(_bytes(same_bytes), _bytes(t))
        assert tensor_digest(same_bytes) != tensor_digest(t)
        reshaped = t.reshape(-1) if t.dim() > 1 else t.reshape(1, -1)
        assert torch.equal(_bytes(reshaped), _bytes(t)) and reshaped.shape != t.shape
        assert tensor_digest(reshaped) != tensor_digest(t)
    t = torch.randn(40, 64, generator=torch.Generator().manual_seed(5))
    assert tensor_digest(t.T.contiguous()) != tensor_digest(t)  # same values, other layout
    assert tensor_digest(t.clone()) == tensor_digest(t)


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
    ]
    for t in cases:
        raw = _bytes(t)
        assert _cpu_sums(raw) == _device_sums(raw), (t.shape, t.dtype)
        assert tensor_digest(t) == reference_digest(t.contiguous()), (t.shape, t.dtype)
    rng = random.Random(6)
    for _ in range(40):
        raw = _bytes(random_tensor(rng))
        assert _cpu_sums(raw) == _device_sums(raw)


def test_device_reduction_blocks_add_up_to_the_whole(monkeypatch):
    """The torch path reduces a block of rows at a time: many blocks give one block's sums."""
    import shared.digest

    t = torch.randn(5 * WIDTH + 3, generator=torch.Generator().manual_seed(7))
    whole = _device_sums(_bytes(t))
    monkeypatch.setattr(shared.digest, "BLOCK_ROWS", 2)
    assert _device_sums(_bytes(t)) == whole == _cpu_sums(_bytes(t))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_and_cpu_digests_agree():
    gen = torch.Generator().manual_seed(3)
    for t in (torch.randn(1000, 64, generator=gen), torch.randn(999, generator=gen).to(torch.bfloat16)):
        assert tensor_digest(t.cuda()) == tensor_digest(t)
    bucket = torch.randn(5000, generator=gen).to(torch.bfloat16).cuda()
    assert tensor_digest(bucket[3:2003]) == tensor_digest(bucket[3:2003].cpu())
