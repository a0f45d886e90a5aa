"""What the orchestrator asks of a weight backend."""

from __future__ import annotations

from typing import Protocol

from shared.admin_api import WeightsInfo
from shared.errors import TriadError


class DigestMismatch(TriadError):
    """A server holds other weights than the trainer published, even after a reload: the run stops."""


class WeightBackend(Protocol):
    kind: str
    updates: bool  # False: the server cannot load new weights
    # the server answers a list of prompts in one completion request as vLLM does, numbering prompt
    # k's sample i k * n + i (`pool.ServerPool.complete` then sends first requests together)
    lists_prompts: bool

    async def current(self) -> WeightsInfo: ...

    async def load(self, version: int, path: str) -> WeightsInfo:
        """Serve the weights in `path` (relative to the run directory) as `version`; what the
        server then reports serving."""

    def model(self, version: int) -> str | None:
        """The model name requests for `version` go to; None: the server's served model."""
