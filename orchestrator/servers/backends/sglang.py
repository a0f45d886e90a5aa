"""`sglang`: SGLang's native `POST /update_weights_from_disk`."""

from __future__ import annotations

from pathlib import Path

import httpx

from orchestrator.servers.calls import call
from orchestrator.servers.client import InferenceClient
from shared.admin_api import WeightsInfo
from shared.errors import TriadError
from shared.objectstore import is_object_url


class SGLangUpdate:
    """SGLang reads the path on its own filesystem: `run_dir` must be mounted at the same place."""

    kind, updates = "sglang", True
    lists_prompts = False  # its numbering of a list's samples is not vLLM's contract: one prompt a request

    def __init__(self, client: InferenceClient, run_dir: Path | str, timeout: float) -> None:
        if is_object_url(run_dir):
            raise TriadError(f"backend 'sglang' needs a mounted run_dir, not the object store {run_dir}")
        self.client, self.run_dir, self.timeout = client, Path(run_dir).resolve(), timeout
        self.info: WeightsInfo | None = None

    async def current(self) -> WeightsInfo:
        if self.info is None:
            r = await self._call("GET", "/get_model_info")
            base = str(r.json().get("model_path", ""))
            self.info = WeightsInfo(version=0, path=base, base_path=base)
        return self.info

    async def load(self, version: int, path: str) -> WeightsInfo:
        base = (await self.current()).base_path
        target = base if version == 0 else str(self.run_dir / path)
        r = await self._call("POST", "/update_weights_from_disk", json={"model_path": target})
        answer = r.json()
        if not answer.get("success", False):
            raise TriadError(f"{self.client.base_url} could not load {target}: {answer.get('message')}")
        self.info = WeightsInfo(version=version, path=path, base_path=base)
        return self.info

    async def _call(self, method: str, route: str, **kwargs) -> httpx.Response:
        return await call(self.client.http, method, route, timeout=self.timeout, **kwargs)

    def model(self, version: int) -> str | None:
        return None
