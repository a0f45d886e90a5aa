import pytest

from trainer.schedule import lr_at


def test_warmup_then_constant():
    assert [lr_at(u, 1.0, 4, 100, "constant", 0.1) for u in (1, 2, 4, 5, 100)] == [0.25, 0.5, 1.0, 1.0, 1.0]


def test_cosine_decays_to_the_floor():
    lrs = [lr_at(u, 2.0, 0, 10, "cosine", 0.1) for u in range(0, 11)]
    assert lrs[0] == pytest.approx(2.0)
    assert lrs[5] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))  # half way: mean of top and floor
    assert lrs[10] == pytest.approx(0.2)
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
