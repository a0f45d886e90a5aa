"""Naming the trainer's collective waits: a timeout (`trainer.collective_timeout_s`) or a
rank that left surfaces from Gloo/NCCL without saying what the trainer was doing; inside
`collective_phase` it becomes one error naming the phase, the rank and how long it waited."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from shared.errors import TriadError

TRAIN = "forward/backward and gradient reduction"
STEP_STATS = "all-reduce of the step's statistics"
GATHER_FOR_PUBLISH = "gather for publish"
PUBLISH_BARRIER = "barrier after writing weights"
BROADCAST = "broadcast to inference"
CHECKPOINT = "checkpoint save and barrier"
RESUME = "checkpoint load at resume"
BORROW_CORES = "all-reduce of the step times that decide on borrowing cores"


COLLECTIVE_WORDS = ("gloo", "nccl", "timed out", "timeout", "connection", "store", "peer")


def is_collective_failure(error: RuntimeError) -> bool:
    """torch.distributed's own errors, or a RuntimeError Gloo/NCCL raised without that type."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    return isinstance(error, dist.DistError) or any(w in str(error).lower() for w in COLLECTIVE_WORDS)


@contextmanager
def collective_phase(name: str, timeout_s: float) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    except TriadError:
        raise
    except RuntimeError as e:
        if not is_collective_failure(e):
            raise  # an out-of-memory, a shape mismatch: not a collective's failure
        rank = dist.get_rank() if dist.is_initialized() else 0
        waited = time.monotonic() - started
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TriadError(
            f"trainer rank {rank}: collective in phase '{name}' failed after {waited:.1f} s "
            f"(trainer.collective_timeout_s = {timeout_s:g}): {first_line}"
        ) from e
