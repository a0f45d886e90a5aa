"""`vllm`: a stock `vllm serve` with its RL routes, through triad's `triad_disk` engine."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from orchestrator.servers.backends.base import DigestMismatch
from orchestrator.servers.calls import ServerUnreachable, call
from orchestrator.servers.client import InferenceClient
from shared.admin_api import WeightsInfo
from shared.config import LOOPBACK_HOSTS
from shared.errors import TriadError
from shared.objectstore import is_object_url

NO_BYTES = hashlib.sha256(b"").hexdigest()  # vLLM's checksum of a parameter with no elements


def skipped_parameters(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Parameters a reload to another version left as they were (`/weight_checker` checksums
    before and after it): every parameter of a trained model moves from one version to the next.
    Parameters with no bytes are not checked: vLLM's CPU build moves each linear layer's weight
    into a prepacked copy that the checksums do not cover, leaving an empty parameter."""
    return sorted(name for name, sum in after.items() if sum != NO_BYTES and before.get(name) == sum)


class VLLMRoutes:
    """A stock vLLM server's RL routes. vLLM reads the path on its own filesystem: `run_dir`
    must be mounted at the same place. The routes are unauthenticated: loopback only."""

    kind, updates = "vllm", True
    lists_prompts = True  # vLLM's completions API

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
        # the version served, and its path (None: the base model, or not known)
        self.held: tuple[int, str | None] = (0, None)
        self.checksums: dict[str, str] = {}  # `/weight_checker` of the version served
        self.unfinished = False  # a reload started and did not finish: the model may be half on `meta`

    async def current(self) -> WeightsInfo:
        served = (await call(self.client.http, "GET", "/weight_info", timeout=self.timeout)).json()
        version = served["weight_version"]
        version = int(version) if str(version).isdigit() else 0  # vLLM's "default": the model it started with
        held, path = self.held
        return WeightsInfo(version=version, path=path if version == held and path else "", base_path="")

    async def load(self, version: int, path: str) -> WeightsInfo:
        """Load `version` between a pause and a resume; a load that fails or skips parameters is
        rolled back to the version held before, and if that fails too the server stays paused: a
        half-loaded model is never served."""
        if not self.engine_ready:
            await self.post("/init_weight_transfer_engine", json={"init_info": {}})
            self.checksums = await self.checksum()
            self.held = ((await self.current()).version, None)
            self.engine_ready = True
        target = None if version == 0 else str(self.run_dir / path)
        await self.first_post("/pause", params={"mode": "keep"})  # requests in flight wait, then go on
        try:
            checksums = await self.reload(version, target)
            self.check_moved(version, checksums)
        except TriadError as e:
            await self.roll_back(version, e)
            raise
        finally:
            if not self.unfinished:
                await self.post("/resume")
        self.held, self.checksums = (version, path), checksums
        return WeightsInfo(version=version, path=path, base_path="")

    async def reload(self, version: int, target: str | None) -> dict[str, str]:
        """Weights from `target` (None: the base model) as `version`; the checksums they give."""
        self.unfinished = True
        await self.first_post("/start_weight_update")
        await self.post("/update_weights", json={"update_info": {"path": target}})
        await self.post("/finish_weight_update", json={"weight_version": str(version)})
        self.unfinished = False
        info = await self.current()
        if info.version != version:
            raise TriadError(
                f"{self.client.base_url} was told to load version {version} but reports {info.version}"
            )
        return await self.checksum()

    def check_moved(self, version: int, checksums: dict[str, str]) -> None:
        """A parameter that holds what it held under another version is one the reload skipped."""
        held = self.held[0]
        if version != held and (same := skipped_parameters(self.checksums, checksums)):
            raise DigestMismatch(
                f"{self.client.base_url} loaded version {version} but {len(same)} of {len(checksums)} "
                f"parameters hold what they held under version {held} (first: {same[:3]}): the reload "
                "skipped them"
            )

    async def roll_back(self, version: int, error: TriadError) -> None:
        """After `error` loading `version`: the version held before loaded again (the base model
        if its path is not known); the run's weight follower then takes the server out and brings
        it to the newest version. If that fails, the server stays paused: TriadError saying so."""
        held, path = self.held if self.held[1] is not None else (0, None)
        target = None if path is None else str(self.run_dir / path)
        try:
            self.checksums = await self.reload(held, target)
        except TriadError as e:
            unreachable = isinstance(e, ServerUnreachable)  # the weight follower's connect tells it apart
            raise (ServerUnreachable if unreachable else TriadError)(
                f"{self.client.base_url} could not load version {version}: {error}; rolling back to version "
                f"{held} failed too ({e}): it stays paused, serving nothing, until a load succeeds"
            ) from None
        self.held = (held, path)
        if isinstance(error, DigestMismatch):
            return
        raise type(error)(
            f"{self.client.base_url} could not load version {version}: {error}; back to version {held}"
        ) from None

    async def checksum(self) -> dict[str, str]:
        return (await self.post("/weight_checker", json={"action": "checksum"})).json()["checksums"]

    async def first_post(self, route: str, **kwargs) -> httpx.Response:
        """`post`, once more if the server did not answer: the first request after a failed one may
        find the connection that vLLM closed after its 500 (an exception out of a route)."""
        try:
            return await self.post(route, **kwargs)
        except ServerUnreachable:
            return await self.post(route, **kwargs)

    async def post(self, route: str, **kwargs) -> httpx.Response:
        return await call(self.client.http, "POST", route, timeout=self.timeout, **kwargs)

    def model(self, version: int) -> str | None:
        return None
