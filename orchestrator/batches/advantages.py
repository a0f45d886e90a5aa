"""Group-relative advantages and reward shaping: pure functions, one reward per sample.

- grpo:    A_i = (r_i - mean(r)) / (std(r) + eps), std over the group (ddof=0)
- dr_grpo: A_i = r_i - mean(r)                      (Dr. GRPO: no std division)
- rloo:    A_i = r_i - mean_{j != i}(r_j) = n/(n-1) * (r_i - mean(r))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-6


def group_advantages(rewards: Sequence[float], kind: str) -> list[float]:
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centered = [r - mean for r in rewards]
    if kind == "dr_grpo":
        return centered
    if kind == "grpo":
        std = math.sqrt(sum(c * c for c in centered) / n)
        return [c / (std + EPS) for c in centered]
    if kind == "rloo":
        return [c * n / (n - 1) for c in centered] if n > 1 else [0.0]
    raise ValueError(f"unknown advantage kind {kind!r} (grpo, dr_grpo, rloo)")


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ: a zero-variance group has all advantages 0."""
    return len(rewards) > 0 and max(rewards) - min(rewards) > EPS


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment, added to the reward:

    0 for length <= max_length - buffer, then falling linearly to -factor at max_length.
    """
    start = max_length - buffer
    if buffer <= 0 or length <= start:
        return 0.0
    return -factor * min(length - start, buffer) / buffer
