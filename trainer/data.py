"""From a batch's rows to this rank's tensors: balance, slice, micro-batch, pad. Pure: the
batch is read by `shared/batch.py`."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import torch


def balance(lengths: list[int], world_size: int) -> list[list[int]]:
    """Split sample indices across ranks so token counts are as even as possible.

    Greedy longest-first onto the least-loaded rank; deterministic, so every
    rank computes the same split without talking to the others.
    """
    heap = [(0, rank) for rank in range(world_size)]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, rank = heapq.heappop(heap)
        shares[rank].append(i)
        heapq.heappush(heap, (load + lengths[i], rank))
    return [sorted(s) for s in shares]


def even_slices(count: int, parts: int) -> list[range]:
    """`count` items in order, cut into `min(parts, count)` contiguous slices whose sizes
    differ by at most one (the first ones longer)."""
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def micro_batches(
    lengths: list[int], shares: list[list[int]], token_budget: int, packed: bool = False
) -> list[list[list[int]]]:
    """Split each rank's share into micro-batches of at most `token_budget` tokens:
    padded tokens (rows x longest row), or with `packed` real tokens only.

    Longest first, so padding stays small. Every rank gets the same number of
    micro-batches (FSDP's collectives run once per forward and backward), the
    short ones padded with empty micro-batches. Returns [rank][micro-batch] -> indices.
    """

    def cost(batch: list[int], extra: int) -> int:
        if packed:
            return sum(lengths[i] for i in batch) + lengths[extra]
        return lengths[batch[0]] * (len(batch) + 1)

    per_rank = []
    for share in shares:
        batches: list[list[int]] = []
        for i in sorted(share, key=lambda i: (-lengths[i], i)):
            current = batches[-1] if batches else None
            if current and cost(current, i) <= token_budget:
                current.append(i)
            else:
                batches.append([i])
        per_rank.append(batches)
    count = max(1, *(len(b) for b in per_rank))
    return [b + [[] for _ in range(count - len(b))] for b in per_rank]


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] int64, right-padded
    attention_mask: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor  # [B, T] bool
    sampler_logprobs: torch.Tensor  # [B, T] float32
    advantages: torch.Tensor  # [B] float32

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(**{k: v.to(device) for k, v in vars(self).items()})


def collate(rows: list[dict[str, Any]], pad_id: int) -> MicroBatch:
    """Right-pad rows to one tensor batch; a rank with no rows gets one masked token."""
    if not rows:
        rows = [dict(input_ids=[pad_id], loss_mask=[False], logprobs=[0.0], advantage=0.0)]
    width = max(len(r["input_ids"]) for r in rows)

    def pad(key: str, value: Any) -> list[list[Any]]:
        return [r[key] + [value] * (width - len(r[key])) for r in rows]

    return MicroBatch(
        input_ids=torch.tensor(pad("input_ids", pad_id), dtype=torch.long),
        attention_mask=torch.tensor(
            [[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows]
        ),
        loss_mask=torch.tensor(pad("loss_mask", False), dtype=torch.bool),
        sampler_logprobs=torch.tensor(pad("logprobs", 0.0), dtype=torch.float32),
        advantages=torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
    )


def loss_token_count(rows: list[dict[str, Any]]) -> int:
    return sum(sum(r["loss_mask"]) for r in rows)
