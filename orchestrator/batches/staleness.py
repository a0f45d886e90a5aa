"""The `max_async_level` bound, as arithmetic.

Batch `n` is consumed by trainer update `n`, which turns version `n-1` into
`n`. With async level eta every sample in batch `n` must come from a version
`v >= n - 1 - eta`; its lag is `n - 1 - v` (0 means on-policy).
"""

from __future__ import annotations


def oldest_allowed_version(step: int, max_async_level: int) -> int:
    return max(step - 1 - max_async_level, 0)


def lag(step: int, version: int) -> int:
    return step - 1 - version


def is_fresh(version: int, step: int, max_async_level: int) -> bool:
    return version >= oldest_allowed_version(step, max_async_level)


def step_for_next_group(assembling_step: int, groups_ahead: int, batch_size: int) -> int:
    """The batch a group started now will most likely land in.

    `groups_ahead` counts groups already accepted into the batch being
    assembled plus those generating or queued; groups fill batches in order.
    """
    return assembling_step + groups_ahead // batch_size
