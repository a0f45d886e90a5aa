"""`triad`: triad's own server, through its `/admin/weights` routes."""

from __future__ import annotations

from orchestrator.servers.client import InferenceClient
from shared.admin_api import WeightsInfo
from shared.errors import TriadError


class TriadAdmin:
    kind, updates = "triad", True
    lists_prompts = True  # vLLM's completions API

    def __init__(self, client: InferenceClient, timeout: float) -> None:
        self.client, self.timeout = client, timeout

    async def current(self) -> WeightsInfo:
        info = await self.client.admin.weights()
        if info is None:
            raise TriadError(f"{self.client.base_url} has no /admin/weights route: it cannot load weights")
        return info

    async def load(self, version: int, path: str) -> WeightsInfo:
        # the POST answers with what the server serves once the load is done (under its lock)
        info = await self.client.admin.load_weights(version, path, self.timeout)
        if info.version != version:
            served = f"version {info.version} from {info.path!r}"
            raise TriadError(f"{self.client.base_url} was told to load version {version} but serves {served}")
        return info

    def model(self, version: int) -> str | None:
        return None
