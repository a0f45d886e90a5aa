"""`none`: a server that cannot load weights; the policy stays frozen."""

from __future__ import annotations

from shared.admin_api import WeightsInfo
from shared.errors import TriadError


class Frozen:
    kind, updates = "none", False
    lists_prompts = True  # a vLLM-compatible server's completions API, as triad needs

    async def current(self) -> WeightsInfo:
        return WeightsInfo(version=0, path="", base_path="")

    async def load(self, version: int, path: str) -> WeightsInfo:
        raise TriadError("this inference backend cannot load weights (backend 'none')")

    def model(self, version: int) -> str | None:
        return None
