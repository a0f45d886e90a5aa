"""Which weight backend a server gets: the one config names, or for `auto` the first the server
answers to; a LoRA run's adapter backend."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx

from orchestrator.servers.backends.admin_routes import TriadAdmin
from orchestrator.servers.backends.base import WeightBackend
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.backends.lora import adapter_backend
from orchestrator.servers.backends.sglang import SGLangUpdate
from orchestrator.servers.backends.stock_vllm import VLLMRoutes
from orchestrator.servers.client import InferenceClient
from shared.config import TriadConfig, refuse_deltas
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")


async def backend_for(client: InferenceClient, cfg: TriadConfig, run_id: str) -> WeightBackend:
    """How this run's versions reach the server: its adapter for a LoRA run, else `detect`;
    TriadError if the server cannot apply the run's delta versions (`inference.backend = "auto"`
    finding a stock server: config refuses the kinds it names)."""
    if cfg.trainer.lora.rank:
        return await adapter_backend(client, cfg, run_id)
    backend = await detect(
        client, cfg.inference.backend, cfg.run_dir, cfg.orchestrator.servers.weight_load_timeout_s
    )
    if backend.kind in ("vllm", "sglang") and cfg.weights.snapshot_every > 1:
        raise TriadError(f"{client.base_url}: {refuse_deltas(backend.kind, cfg.weights.snapshot_every)}")
    return backend


async def _answers(client: InferenceClient, route: str) -> bool:
    """Whether the server has `route`: 200 yes; 404 (or 405) no. Any other answer is no ground
    for a guess: a wrong or missing admin token (401, 403) taken for a server without `/admin`
    would train the whole run on the base model's samples."""
    url = f"{client.base_url}{route}"
    try:
        status = (await client.http.get(route)).status_code  # bounded as any request: request_timeout_s
    except httpx.HTTPError as e:
        raise TriadError(
            f"{url} did not answer while finding how the server loads weights ({type(e).__name__}: {e}); "
            "check the server, or set inference.backend"
        ) from None
    if status in (401, 403):
        raise TriadError(
            f"{url} answered {status}: the server's admin routes want a token this orchestrator does not "
            "hold; give it the server's inference.admin_token (or admin_token_file)"
        )
    if status not in (200, 404, 405):
        raise TriadError(
            f"{url} answered {status} while finding how the server loads weights; check the server's log, "
            "or set inference.backend"
        )
    return status == 200


async def detect(client: InferenceClient, kind: str, run_dir: Path | str, timeout: float) -> WeightBackend:
    """The backend `kind` names, or for `auto` the first kind the server answers to; TriadError
    where the server's answer does not tell (`_answers`)."""
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
    raise TriadError(f"unknown inference.backend {kind!r}")
