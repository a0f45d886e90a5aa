"""Telling an inference backend to serve new weights: one small protocol, four kinds.

- `triad`:  triad's `/admin/weights` routes on its vLLM server (versions checked
            against the step's `DONE` marker, in-flight requests kept);
- `triad-lora`: a LoRA run (`trainer.lora.rank > 0`) on triad's server: each version's
            adapter loaded with `POST /admin/adapters` beside other runs' adapters, and
            requests addressed to `<adapter_name>@v<V>` (version 0: the base model);
- `vllm`:   a stock `vllm serve` with its RL routes (`VLLM_SERVER_DEV_MODE=1`): pause,
            start, update, finish, resume, through triad's `triad_disk` weight-transfer
            engine (`inference/vllm_engine.py`); the version is the `weight_version` vLLM
            reports, and `/weight_checker` checksums catch a parameter the reload skipped.
            Those routes have no authentication: loopback servers only;
- `sglang`: SGLang's native `POST /update_weights_from_disk`;
- `none`:   any other OpenAI-compatible server; the policy stays frozen.

`detect` picks the kind by asking the server, unless config names one; `backend_for`
picks `triad-lora` for a LoRA run.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Protocol

import httpx

from orchestrator.client import InferenceClient, ServerUnreachable
from orchestrator.integrity import DigestMismatch
from shared.admin_api import AdapterInfo, LoadAdapterRequest, WeightsInfo, served_adapter_name
from shared.config import LOOPBACK_HOSTS, TriadConfig
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

    def model(self, version: int) -> str | None:
        """The model name requests for `version` go to; None: the server's served model."""


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

    def model(self, version: int) -> str | None:
        return None


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
        return await call(self.client, method, route, self.timeout, **kwargs)

    def model(self, version: int) -> str | None:
        return None


async def call(client: InferenceClient, method: str, route: str, timeout: float, **kwargs) -> httpx.Response:
    """One request to a server's own (non-OpenAI) routes; TriadError naming it unless it answers 200."""
    url = client.base_url + route
    try:
        r = await client.http.request(method, route, timeout=timeout, **kwargs)
    except httpx.TransportError as e:
        raise ServerUnreachable(f"{method} {url} failed: {e!r}") from None
    except httpx.HTTPError as e:
        raise TriadError(f"{method} {url} failed: {e!r}") from None
    if r.status_code != 200:
        raise TriadError(f"{method} {url} answered {r.status_code}: {r.text[:300]}")
    return r


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
        served = (await call(self.client, "GET", "/weight_info", self.timeout)).json()["weight_version"]
        version = int(served) if str(served).isdigit() else 0  # vLLM's "default": the model it started with
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
        return await call(self.client, "POST", route, self.timeout, **kwargs)

    def model(self, version: int) -> str | None:
        return None


class Frozen:
    kind, updates = "none", False

    async def current(self) -> WeightsInfo:
        return WeightsInfo(version=0, path="", base_path="")

    async def load(self, version: int, path: str) -> WeightsInfo:
        raise TriadError("this inference backend cannot load weights (backend 'none')")

    def model(self, version: int) -> str | None:
        return None


class AdapterLoads:
    """A LoRA run's adapter on triad's server, beside other runs' adapters: version V is served
    as `<name>@v<V>`, loaded from `prefix + path` (the server reads paths relative to its own
    run directory, which holds this run's at `prefix`); version 0 is the base model."""

    kind, updates = "triad-lora", True

    def __init__(self, client: InferenceClient, name: str, run_id: str, prefix: str, timeout: float) -> None:
        self.client, self.name, self.run_id, self.prefix, self.timeout = client, name, run_id, prefix, timeout

    def model(self, version: int) -> str | None:
        return served_adapter_name(self.name, version) if version else None

    async def current(self) -> WeightsInfo:
        listed = await self.client.admin_adapters()
        if listed is None:
            raise TriadError(f"{self.client.base_url} has no /admin/adapters route: it cannot load adapters")
        held = next((a for a in listed.adapters if a.name == self.name), None)
        if held is None:
            return WeightsInfo(version=0, path="", base_path="")
        if held.run_id != self.run_id:
            raise TriadError(
                f"{self.client.base_url}: adapter name {self.name!r} is owned by run {held.run_id!r}, "
                f"not this run {self.run_id!r}: set another orchestrator.adapter_name"
            )
        return self.as_weights(held)

    def as_weights(self, held: AdapterInfo) -> WeightsInfo:
        return WeightsInfo(
            version=held.version, path=held.path.removeprefix(self.prefix), base_path="",
            digest=held.digest, tensor_digests=held.tensor_digests,
        )  # fmt: skip

    async def load(self, version: int, path: str) -> WeightsInfo:
        if version == 0:  # requests go to the base model; the adapter stays until it idles out
            return WeightsInfo(version=0, path="", base_path="")
        path = self.prefix + path
        body = LoadAdapterRequest(name=self.name, run_id=self.run_id, version=version, path=path)
        held = await self.client.load_adapter(body, self.timeout)
        if held.version != version:
            raise TriadError(
                f"{self.client.base_url} was told to load adapter version {version} "
                f"but serves {held.served_as}"
            )
        return self.as_weights(held)


def run_dir_prefix(run_dir: Path | str, server_run_dir: str, url: str) -> str:
    """Where `run_dir` lies inside the server's run directory, as a path prefix ('' for the
    server's own); TriadError naming the server if it lies outside."""
    mine, theirs = str(run_dir).rstrip("/"), server_run_dir.rstrip("/")
    if is_object_url(mine) or is_object_url(theirs):
        inside = mine == theirs or mine.startswith(theirs + "/")
        relative = mine[len(theirs) :].strip("/") if inside else None
    else:
        try:
            relative = Path(mine).resolve().relative_to(Path(theirs)).as_posix()
        except ValueError:
            relative = None
    if relative is None:
        raise TriadError(
            f"run_dir {run_dir} is not inside the run directory of {url} "
            f"({server_run_dir or 'not reported'}): "
            "the server reads adapters relative to its own run directory, so a run sharing it must keep "
            "its run_dir inside that one"
        )
    return "" if relative in ("", ".") else relative + "/"


async def adapter_backend(client: InferenceClient, cfg: TriadConfig, run_id: str) -> AdapterLoads:
    """The `triad-lora` backend for this run, once the server can serve its adapter: TriadError
    naming the server if it has no adapter routes or no LoRA support, cannot see the run
    directory, or serves the adapter name for another run."""
    url, oc = client.base_url, cfg.orchestrator
    if oc.backend not in ("auto", "triad"):
        raise TriadError(f"orchestrator.backend = {oc.backend!r} cannot load LoRA adapters: use 'triad'")
    listed = await client.admin_adapters()
    if listed is None:
        raise TriadError(
            f"{url} has no /admin/adapters route: a LoRA run (trainer.lora.rank > 0) needs "
            "triad's inference server"
        )
    if not listed.lora:
        raise TriadError(
            f"{url} has no LoRA support: start it with inference.vllm_args = ['--enable-lora', "
            "'--max-lora-rank', '<rank>', '--max-loras', '<2 x runs sharing it>']"
        )
    prefix = run_dir_prefix(cfg.run_dir, listed.run_dir, url)
    name = oc.adapter_name or f"run-{run_id}"
    backend = AdapterLoads(client, name, run_id, prefix, oc.weight_load_timeout_s)
    await backend.current()  # a name another run owns is refused here
    log.info("%s: LoRA adapter %r of run %s (run_dir at %r in the server's)", url, name, run_id, prefix)
    return backend


async def backend_for(client: InferenceClient, cfg: TriadConfig, run_id: str) -> WeightBackend:
    """How this run's versions reach the server: its adapter for a LoRA run, else `detect`."""
    oc = cfg.orchestrator
    if cfg.trainer.lora.rank:
        return await adapter_backend(client, cfg, run_id)
    return await detect(client, oc.backend, cfg.run_dir, oc.weight_load_timeout_s)


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
        elif await _answers(client, "/weight_info"):
            kind = "vllm"
        elif await _answers(client, "/get_model_info"):
            kind = "sglang"
        else:
            kind = "none"
        log.info("%s: weight-update backend %r (detected)", client.base_url, kind)
    if kind == "triad":
        return TriadAdmin(client, timeout)
    if kind == "vllm":
        return VLLMRoutes(client, run_dir, timeout)
    if kind == "sglang":
        return SGLangUpdate(client, run_dir, timeout)
    if kind == "none":
        return Frozen()
    raise TriadError(f"unknown orchestrator.backend {kind!r}")
