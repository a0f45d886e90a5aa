"""Learning-rate schedules as pure functions of the update number (so resuming needs no state)."""

from __future__ import annotations

import math


def lr_at(update: int, base_lr: float, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """The learning rate of update `update` (1-based): linear warm-up, then constant or cosine."""
    if warmup and update <= warmup:
        return base_lr * update / warmup
    if schedule == "constant":
        return base_lr
    progress = min(max(update - warmup, 0) / max(total - warmup, 1), 1.0)
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
