"""`vllm`: a stock `vllm serve` with its RL routes, through triad's `triad_disk` engine."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from orchestrator.client import InferenceClient
from orchestrator.integrity import DigestMismatch
from orchestrator.server_calls import call
from shared.admin_api import WeightsInfo
from shared.config import LOOPBACK_HOSTS
from shared.errors import TriadError
from shared.objectstore import is_object_url

NO_BYTES = hashlib.sha256(b"").hexdigest()  # vLLM's checksum of a parameter with no elements


def skipped_parameters(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Parameters a reload left as they were while others changed (`/weight_checker` checksums of
    two consecutive versions); none if nothing changed (a version equal to the one before).
    Parameters with no bytes are not checked: vLLM's CPU build moves each linear layer's weight
    into a prepacked copy that the checksums do not cover, leaving an empty parameter."""
    held = {name: checksum for name, checksum in after.items() if checksum != NO_BYTES}
    same = sorted(name for name, checksum in held.items() if before.get(name) == checksum)
    return same if len(same) < len(held) else []


class VLLMRoutes:
    """A stock vLLM server's RL routes. vLLM reads the path on its own filesystem: `run_dir`
    must be mounted at the same place. The routes are unauthenticated: loopback only."""

    kind, updates = "vllm", True

    def __init__(self, client: InferenceClient, run_dir: Path | str, timeout: float) -> None:
        if is_object_url(run_dir):
            raise TriadError(f"backend 'vllm' needs a mounted run_dir, not the object store {run_dir}")
        host = httpx.URL(client.base_url).host
        if host not in LOOPBACK_HOSTS:
            raise TriadError(
                f"backend 'vllm': {client.base_url} is not loopback, and vLLM's RL routes have no "
                "authentication: bind the server to 127.0.0.1, or use triad's launcher (backend 'triad') "
                "with inference.admin_token"
            )
        self.client, self.run_dir, self.timeout = client, Path(run_dir).resolve(), timeout
        self.engine_ready = False
        self.checksums: dict[str, str] | None = None  # `/weight_checker` of the version served
        self.paths: dict[int, str] = {}  # what each version this backend loaded was loaded from

    async def current(self) -> WeightsInfo:
        served = (await call(self.client.http, "GET", "/weight_info", timeout=self.timeout)).json()
        version = served["weight_version"]
        version = int(version) if str(version).isdigit() else 0  # vLLM's "default": the model it started with
        return WeightsInfo(version=version, path=self.paths.get(version, ""), base_path="")

    async def load(self, version: int, path: str) -> WeightsInfo:
        post = self.post
        if not self.engine_ready:
            await post("/init_weight_transfer_engine", json={"init_info": {}})
            self.engine_ready = True
        target = None if version == 0 else str(self.run_dir / path)
        await post("/pause", params={"mode": "keep"})  # requests in flight wait, then go on
        try:
            await post("/start_weight_update")
            await post("/update_weights", json={"update_info": {"path": target}})
            await post("/finish_weight_update", json={"weight_version": str(version)})
        finally:
            await post("/resume")
        info = await self.current()
        if info.version != version:
            url = self.client.base_url
            raise TriadError(f"{url} was told to load version {version} but reports {info.version}")
        await self.check_held(version)
        self.paths = {version: path}
        return WeightsInfo(version=version, path=path, base_path="")

    async def check_held(self, version: int) -> None:
        """Checksums of what the model holds, against the version before's: a parameter left
        unchanged while the others changed is one the reload skipped."""
        r = await self.post("/weight_checker", json={"action": "checksum"})
        now, before = r.json()["checksums"], self.checksums
        self.checksums = now
        if before is not None and version != 0 and (same := skipped_parameters(before, now)):
            raise DigestMismatch(
                f"{self.client.base_url} loaded version {version} but {len(same)} of {len(now)} parameters "
                f"hold what they held before (first: {same[:3]}): the reload skipped them"
            )

    async def post(self, route: str, **kwargs) -> httpx.Response:
        return await call(self.client.http, "POST", route, timeout=self.timeout, **kwargs)

    def model(self, version: int) -> str | None:
        return None
