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
    raise TriadError(f"unknown inference.backend {kind!r}")
