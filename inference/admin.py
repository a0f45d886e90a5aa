"""The `/admin` routes: thin handlers over `WeightManager`, which holds the logic."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ValidationError
from safetensors import safe_open

from inference.deltas import ChainBroken, DeltaChain, is_delta
from inference.vllm_api import pause_keeping_requests
from shared.admin_api import (
    ADAPTERS_ROUTE,
    ADMIN_PREFIX,
    BROADCAST_INIT_ROUTE,
    BROADCAST_RECEIVE_ROUTE,
    PAUSE_ROUTE,
    RESUME_ROUTE,
    WEIGHTS_ROUTE,
    AdapterInfo,
    AdaptersInfo,
    BroadcastInit,
    BroadcastReceive,
    BroadcastState,
    LoadAdapterRequest,
    LoadWeightsRequest,
    PauseState,
    WeightsInfo,
)
from shared.authstore import store_secret
from shared.broadcast import SendReady
from shared.digest import agreed, version_digest
from shared.errors import TriadError
from shared.faults import audit_read
from shared.metrics import MetricsWriter
from shared.rundir import INFERENCE, AdapterFiles, DeltaFiles, Handshake, RunDir, has_marker, pull_step_dir

log = logging.getLogger("triad.inference")
T = TypeVar("T")


class AdminError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def resolve_inside(rundir: RunDir, raw: str) -> tuple[str, Path]:
    """The directory `raw` names (relative to the run directory, or absolute), which must lie
    inside it once `..` and symlinks are resolved: its relative name and a local copy
    (fetched into the cache from an object store)."""
    try:
        return pull_step_dir(rundir, raw)
    except TriadError as e:
        raise AdminError(400, str(e)) from None


def resolve_weights_dir(rundir: RunDir, raw: str, base_path: str) -> tuple[str, Path] | None:
    """The weights directory `raw` names, if it lies inside the run directory and is
    complete; None for the base model the server started from."""
    if raw == base_path:
        return None
    served, path = resolve_inside(rundir, raw)
    if not RunDir.has_marker_at(path):
        rundir.store.drop_local(served)
        raise AdminError(409, f"path {raw!r} has no {RunDir.marker_name()} marker: not published yet")
    if not RunDir.tensor_files_at(path) and not DeltaFiles.file_at(path).is_file():
        raise AdminError(400, f"path {raw!r} holds no .safetensors files and no delta")
    return served, path


def check_safetensors(path: Path) -> None:
    """Every .safetensors file must have a readable header whose tensors fit in the file:
    a corrupt or truncated one is refused before the engine is touched."""
    for file in RunDir.tensor_files_at(path):
        try:
            with safe_open(file, framework="pt") as f:
                names = list(f.keys())
        except Exception as e:  # safetensors raises its own error types
            where = f"{file.parent.name}/{file.name}"
            raise AdminError(400, f"{where} is not a valid safetensors file: {e}") from None
        if not names:
            raise AdminError(400, f"{file.parent.name}/{file.name} holds no tensors")


def read_send_ready(path: Path, version: int) -> SendReady:
    name = Handshake.SEND_READY.value
    try:
        ready = SendReady.model_validate_json(RunDir.handshake_at(path, Handshake.SEND_READY) or b"")
    except ValidationError:
        raise AdminError(409, f"{path.name} has no valid {name}: the trainer is not sending") from None
    if ready.version != version:
        raise AdminError(400, f"{path.name}/{name} is for version {ready.version}, not {version}")
    return ready


def digest_fields(per_worker: list[dict[str, str] | None] | None) -> dict:
    """`WeightsInfo`'s digest fields from what each worker reported loading."""
    if not per_worker or any(d is None for d in per_worker):
        return {}
    tensors = agreed(per_worker)
    return {"digest": version_digest(tensors), "tensor_digests": tensors}


def check_marker_version(path: Path, version: int) -> None:
    """The version asked for must be the one the directory's marker vouches for."""
    marker = RunDir.marker_at(path)
    if marker is None:
        raise AdminError(400, f"{path.name}/{RunDir.marker_name()} is not a valid marker")
    held = getattr(marker, "version", marker.step)
    if held != version:
        raise AdminError(400, f"{path.name} holds version {held}, not {version}")


def check_size(path: Path) -> None:
    """The files must add up to at least the bytes the marker vouches for: a copy cut short is
    refused (a handshake file written after the marker may add a few bytes)."""
    marker = RunDir.marker_at(path)
    vouched = getattr(marker, "bytes", 0)
    found = RunDir.payload_bytes_at(path)
    if vouched and found < vouched:
        raise AdminError(400, f"{path.name} holds {found} bytes, its marker vouches for {vouched}")


class WeightManager:
    """Knows which weights are served and swaps them in place, one load at a time."""

    def __init__(
        self, engine, rundir: RunDir, base_path: str, metrics: MetricsWriter, token: str | None = None
    ) -> None:
        self.engine = engine
        self.token = token
        self.rundir = rundir
        self.base_path = base_path
        self.info = WeightsInfo(version=0, path=base_path, base_path=base_path)
        self.metrics = metrics
        self._lock = asyncio.Lock()
        self.group: BroadcastInit | None = None
        self.deltas = DeltaChain(rundir)

    def workers(self) -> int:
        parallel = getattr(getattr(self.engine, "vllm_config", None), "parallel_config", None)
        return int(getattr(parallel, "world_size", 1))

    def broadcast_state(self) -> BroadcastState:
        return BroadcastState(workers=self.workers(), generation=self.group and self.group.generation)

    async def broadcast_init(self, request: BroadcastInit) -> BroadcastState:
        """Remember the group; workers join it at the next receive (joining waits for the trainer)."""
        last_rank = request.rank_offset + self.workers() - 1
        if last_rank >= request.world_size:
            raise AdminError(400, f"ranks up to {last_rank} do not fit a group of {request.world_size}")
        self.group = request
        return self.broadcast_state()

    async def broadcast_receive(self, request: BroadcastReceive) -> WeightsInfo:
        """Take version V from the trainer's broadcast, in place, as `load` does from files."""
        async with self._lock:
            if self.group is None:
                raise AdminError(409, "no broadcast group: POST /admin/broadcast/init first")
            served, path = await asyncio.to_thread(resolve_inside, self.rundir, request.path)
            try:
                ready = read_send_ready(path, request.version)
            finally:
                self.rundir.store.drop_local(served)
            spec = {**self.group.model_dump(), **ready.model_dump(include={"tensors", "bucket_bytes"})}
            spec["secret"] = self.token and store_secret(self.token, ready.run_id).hex()
            started = time.monotonic()
            loaded = await self._swap("triad_broadcast_receive", spec)
            load_s = time.monotonic() - started
            self._now_serving(
                WeightsInfo(
                    version=request.version, path=served, base_path=self.base_path, **digest_fields(loaded)
                )
            )
        log.info("serving weights version %d (broadcast, generation %d)", request.version, spec["generation"])
        await self.metrics.log_from_loop(
            request.version, version=request.version, path=served, transport="broadcast", load_s=load_s
        )
        return self.info

    async def _swap(self, method: str, arg) -> list:
        """Run a weight-loading worker method with generation paused (requests kept); each
        worker's answer."""
        await pause_keeping_requests(self.engine)
        try:
            answers = await self.engine.collective_rpc(method, args=(arg,))
            await self.engine.reset_prefix_cache(reset_running_requests=True)
            return answers
        except Exception:
            # half-loaded weights are no version at all: make every client re-align
            self._now_serving(WeightsInfo(version=-1, path="", base_path=self.base_path))
            raise
        finally:
            await self.engine.resume_generation()

    async def load(self, request: LoadWeightsRequest) -> WeightsInfo:
        async with self._lock:
            served = None
            try:
                # off the event loop: from an object store this downloads, and /health must keep answering
                raw, base = request.path, self.base_path
                pulled = await asyncio.to_thread(resolve_weights_dir, self.rundir, raw, base)
                if pulled is None and request.version != 0:
                    raise AdminError(400, "the base model is version 0")
                served, path = pulled or (self.base_path, None)
                load_s = await self._load_pulled(request.version, served, path)
            except Exception as e:
                await asyncio.to_thread(self._failed, request, served, e)
                raise
        log.info("serving weights version %d from %s", request.version, self.info.path)
        await self.metrics.log_from_loop(
            request.version, version=request.version, path=self.info.path, load_s=load_s
        )
        return self.info

    async def _load_pulled(self, version: int, served: str, path: Path | None) -> float:
        """Check and load a pulled version; the seconds the load took."""
        if path is not None:
            self._check_pulled(served, path, version)
            path = await asyncio.to_thread(self._full, version, path)
        started = time.monotonic()
        loaded = await self._swap("triad_load_weights", str(path) if path else None)
        load_s = time.monotonic() - started
        digests = digest_fields(loaded)
        self._now_serving(WeightsInfo(version=version, path=served, base_path=self.base_path, **digests))
        self.deltas.served(version, path, digests.get("digest"))
        return load_s

    def _now_serving(self, info: WeightsInfo) -> None:
        """Record the version now served, by files or by broadcast; the cache holds its copy only
        (a copy from an object store of the version served before is dropped)."""
        previous = self.info.path
        self.info = info
        if previous not in (info.path, self.base_path, ""):
            self.rundir.store.drop_local(previous)

    def _full(self, version: int, path: Path) -> Path:
        """A directory of full weights for the pulled version: itself, or a delta rebuilt."""
        marker = RunDir.marker_at(path)
        if not is_delta(marker):
            return path
        try:
            return self.deltas.rebuild(version, marker, DeltaFiles.file_at(path).read_bytes())
        except ChainBroken as e:
            raise AdminError(400, f"cannot rebuild version {version}: {e}; load a newer one") from None

    def _failed(self, request: LoadWeightsRequest, served: str | None, error: Exception) -> None:
        """After a failed load: drop the copy of the version from the cache, and if the version
        was pruned meanwhile (the trainer keeps only the newest few), say so with a 400."""
        if served not in (None, self.base_path):
            self.rundir.store.drop_local(served)
        if isinstance(error, AdminError) or self.base_path in (served, request.path):
            return
        try:
            if has_marker(self.rundir, served or request.path):
                return  # not pruned: the error stands as it is
        except (OSError, TriadError):
            return
        why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        raise AdminError(
            400,
            f"weights version {request.version} at {request.path} was pruned from the run directory "
            f"while this server fetched or loaded it ({why}): load a newer version",
        ) from None

    def _check_pulled(self, served: str, path: Path, version: int) -> None:
        try:
            if AdapterFiles.is_adapter_at(path):
                raise AdminError(
                    400, f"{served} holds a LoRA adapter, not weights: load it with POST /admin/adapters"
                )
            check_marker_version(path, version)
            check_safetensors(path)
            check_size(path)
        except AdminError:
            self.rundir.store.drop_local(served)
            raise
        audit_read(path, RunDir.has_marker_at(path), INFERENCE)

    async def pause(self) -> PauseState:
        await pause_keeping_requests(self.engine)
        return PauseState(paused=True)

    async def resume(self) -> PauseState:
        await self.engine.resume_generation()
        return PauseState(paused=False)


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """Validate a JSON body here, not in vLLM's app-wide handler (which answers 400):
    malformed bodies get 422 with the first problem named."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise HTTPException(status_code=422, detail=f"{where}: {first['msg']}") from None


def bearer_guard(token: str | None):
    """A dependency that rejects requests without the admin token (if one is set)."""

    async def check(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong admin token")

    return check


async def answer(call: Awaitable[T]) -> T:
    """The manager's result, or its AdminError as an HTTP error with the same status."""
    try:
        return await call
    except AdminError as e:
        raise HTTPException(status_code=e.status, detail=e.detail) from None


def add_admin_routes(app: FastAPI, manager: WeightManager, token: str | None, adapters=None) -> None:
    router = APIRouter(prefix=ADMIN_PREFIX, dependencies=[Depends(bearer_guard(token))])
    if adapters is not None:
        add_adapter_routes(router, adapters)

    @router.get(WEIGHTS_ROUTE)
    async def get_weights() -> WeightsInfo:
        return manager.info

    @router.post(WEIGHTS_ROUTE)
    async def post_weights(request: Request) -> WeightsInfo:
        return await answer(manager.load(parse_body(await request.body(), LoadWeightsRequest)))

    @router.get(BROADCAST_INIT_ROUTE)
    async def get_broadcast() -> BroadcastState:
        return manager.broadcast_state()

    @router.post(BROADCAST_INIT_ROUTE)
    async def broadcast_init(request: Request) -> BroadcastState:
        return await answer(manager.broadcast_init(parse_body(await request.body(), BroadcastInit)))

    @router.post(BROADCAST_RECEIVE_ROUTE)
    async def broadcast_receive(request: Request) -> WeightsInfo:
        body = parse_body(await request.body(), BroadcastReceive)
        try:
            return await answer(manager.broadcast_receive(body))
        except HTTPException:
            raise
        except Exception as e:  # a peer that left, a timeout: the caller falls back to files
            log.warning("broadcast of version %d failed: %r", body.version, e)
            raise HTTPException(status_code=502, detail=f"broadcast receive failed: {e!r}"[:500]) from None

    @router.post(PAUSE_ROUTE)
    async def pause() -> PauseState:
        return await manager.pause()

    @router.post(RESUME_ROUTE)
    async def resume() -> PauseState:
        return await manager.resume()

    app.include_router(router)


def add_adapter_routes(router: APIRouter, adapters) -> None:
    """`GET /admin/adapters` lists the loaded LoRA adapters; `POST` loads a run's new version."""

    @router.get(ADAPTERS_ROUTE)
    async def get_adapters() -> AdaptersInfo:
        return adapters.info()

    @router.post(ADAPTERS_ROUTE)
    async def post_adapter(request: Request) -> AdapterInfo:
        return await answer(adapters.load(parse_body(await request.body(), LoadAdapterRequest)))
