"""The weight-broadcast handshake: markers in `weights/step_V/`, and the bucket plan.

With `[weights] transport = "broadcast"`, update V reaches inference over a process
group (Gloo on CPU, NCCL on GPU) that trainer rank 0 and every inference worker
join, independent of vLLM's own; rank 0 hosts its TCPStore. The filesystem
carries the handshake, so no side waits on another without a timeout:

1. trainer rank 0 writes `SEND_READY` (the tensors it will send: names,
   dtypes, shapes) once the update is done;
2. the orchestrator answers `RECEIVING` (the group generation and size) after
   asking every healthy server to receive, or `FALLBACK` if it cannot;
3. the trainer gathers each parameter from FSDP2 in turn and broadcasts them in
   dtype-grouped buckets, then writes `DONE` with `files = false`. If anything
   fails or times out (or on `FALLBACK`) it writes the safetensors as usual and
   `DONE` with `files = true`, and the orchestrator loads those.

A generation is one group membership; a new one starts when servers change or
after any failure, under a fresh store prefix. Pure logic, no torch.
"""

from __future__ import annotations

import math
from typing import TypeVar

from pydantic import BaseModel, Field

from shared.rundir import Handshake, RunDir

M = TypeVar("M", bound=BaseModel)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


class TensorSpec(BaseModel):
    name: str
    dtype: str
    shape: list[int]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


class SendReady(BaseModel):
    run_id: str
    version: int
    tensors: list[TensorSpec]
    bucket_bytes: int = Field(gt=0)


class Receiving(BaseModel):
    run_id: str
    version: int
    generation: int
    world_size: int = Field(ge=2)


class Fallback(BaseModel):
    run_id: str
    version: int
    reason: str


def plan_buckets(tensors: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of `tensors` in send order, grouped into single-dtype buckets of at most
    `bucket_bytes` (a larger tensor gets a bucket of its own). Both sides compute it."""
    buckets: list[list[int]] = []
    open_bucket: dict[str, tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        current, size = open_bucket.get(t.dtype, ([], 0))
        if current and size + t.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        open_bucket[t.dtype] = (current, size + t.nbytes)
    buckets += [indices for indices, _ in open_bucket.values() if indices]
    return buckets


def write_handshake(rundir: RunDir, version: int, kind: Handshake, body: BaseModel) -> None:
    rundir.write_handshake(version, kind, body.model_dump_json().encode())


def read_handshake(rundir: RunDir, version: int, kind: Handshake, model: type[M], run_id: str) -> M | None:
    """The handshake file if present, valid and of this run; else None."""
    raw = rundir.read_handshake(version, kind)
    if raw is None:
        return None
    try:
        body = model.model_validate_json(raw)
    except ValueError:
        return None
    return body if getattr(body, "run_id", None) == run_id else None
