import math

import pytest

from orchestrator.batches.advantages import group_advantages


def test_grpo_normalises_by_group_std():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +-1
    assert group_advantages([1.0, 0.0, 0.0, 1.0], "grpo") == pytest.approx([1, -1, -1, 1], abs=1e-5)
    # rewards 3, 1, 2: mean 2, std sqrt(2/3)
    s = math.sqrt(2 / 3)
    assert group_advantages([3.0, 1.0, 2.0], "grpo") == pytest.approx([1 / s, -1 / s, 0.0], abs=1e-5)


def test_dr_grpo_only_centres():
    assert group_advantages([3.0, 1.0, 2.0], "dr_grpo") == pytest.approx([1.0, -1.0, 0.0])


def test_rloo_leaves_one_out():
    # r_i - mean of the others: 3-(1+2)/2=1.5, 1-(3+2)/2=-1.5, 2-(3+1)/2=0
    assert group_advantages([3.0, 1.0, 2.0], "rloo") == pytest.approx([1.5, -1.5, 0.0])


def test_equal_rewards_give_zero_advantage():
    for kind in ("grpo", "dr_grpo", "rloo"):
        assert group_advantages([0.7, 0.7, 0.7], kind) == pytest.approx([0, 0, 0], abs=1e-6)


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown advantage"):
        group_advantages([1.0], "ppo")
