"""Telling an inference backend to serve new weights: one small protocol, three kinds.

- `triad`:  triad's `/admin/weights` routes on its vLLM server (versions checked
            against the step's `DONE` marker, in-flight requests kept);
- `sglang`: SGLang's native `POST /update_weights_from_disk`;
- `none`:   any other OpenAI-compatible server; the policy stays frozen.

`detect` picks the kind by asking the server, unless config names one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import httpx

from orchestrator.client import InferenceClient
from shared.admin_api import WeightsInfo
from shared.errors import TriadError
from shared.objectstore import is_object_url

log = logging.getLogger("triad.orchestrator")


class WeightBackend(Protocol):
    kind: str
    updates: bool  # False: the server cannot load new weights

    async def current(self) -> WeightsInfo: ...

    async def load(self, version: int, path: str) -> WeightsInfo:
        """Serve the weights in `path` (relative to the run directory) as `version`; what the
        server then reports serving."""


class TriadAdmin:
    kind, updates = "triad", True

    def __init__(self, client: InferenceClient, timeout: float) -> None:
        self.client, self.timeout = client, timeout

    async def current(self) -> WeightsInfo:
        info = await self.client.admin_weights()
        if info is None:
            raise TriadError(f"{self.client.base_url} has no /admin/weights route: it cannot load weights")
        return info

    async def load(self, version: int, path: str) -> WeightsInfo:
        await self.client.load_weights(version, path, self.timeout)
        info = await self.current()
        if info.version != version:
            served = f"version {info.version} from {info.path!r}"
            raise TriadError(f"{self.client.base_url} was told to load version {version} but serves {served}")
        return info


class SGLangUpdate:
    """SGLang reads the path on its own filesystem: `run_dir` must be mounted at the same place."""

    kind, updates = "sglang", True

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
        url = self.client.base_url + route
        try:
            r = await self.client.http.request(method, route, timeout=self.timeout, **kwargs)
        except httpx.HTTPError as e:
            raise TriadError(f"{method} {url} failed: {e!r}") from None
        if r.status_code != 200:
            raise TriadError(f"{method} {url} answered {r.status_code}: {r.text[:300]}")
        return r


class Frozen:
    kind, updates = "none", False

    async def current(self) -> WeightsInfo:
        return WeightsInfo(version=0, path="", base_path="")

    async def load(self, version: int, path: str) -> WeightsInfo:
        raise TriadError("this inference backend cannot load weights (backend 'none')")


async def _answers(client: InferenceClient, route: str) -> bool:
    try:
        return (await client.http.get(route, timeout=10)).status_code == 200
    except httpx.HTTPError:
        return False


async def detect(client: InferenceClient, kind: str, run_dir: Path | str, timeout: float) -> WeightBackend:
    """The backend `kind` names, or for `auto` the first kind the server answers to."""
    if kind == "auto":
        if await _answers(client, "/admin/weights"):
            kind = "triad"
        elif await _answers(client, "/get_model_info"):
            kind = "sglang"
        else:
            kind = "none"
        log.info("%s: weight-update backend %r (detected)", client.base_url, kind)
    if kind == "triad":
        return TriadAdmin(client, timeout)
    if kind == "sglang":
        return SGLangUpdate(client, run_dir, timeout)
    if kind == "none":
        return Frozen()
    raise TriadError(f"unknown orchestrator.backend {kind!r}")
