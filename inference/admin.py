"""The `/admin` routes: thin handlers over `WeightManager`, which holds the logic."""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ValidationError
from safetensors import safe_open

from shared.admin_api import (
    ADMIN_PREFIX,
    PAUSE_ROUTE,
    RESUME_ROUTE,
    WEIGHTS_ROUTE,
    LoadWeightsRequest,
    PauseState,
    WeightsInfo,
)
from shared.faults import audit_read
from shared.metrics import MetricsWriter
from shared.rundir import DONE, INFERENCE, Marker

log = logging.getLogger("triad.inference")


class AdminError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def resolve_weights_dir(run_dir: Path, raw: str, base_path: str) -> Path | None:
    """The weights directory `raw` names, if it lies inside `run_dir` and is
    complete; None for the base model the server started from."""
    if raw == base_path:
        return None
    root = run_dir.resolve()
    path = Path(raw)
    path = (path if path.is_absolute() else root / path).resolve()
    if not path.is_relative_to(root):
        raise AdminError(400, f"path {raw!r} is outside the run directory")
    if not path.is_dir():
        raise AdminError(400, f"path {raw!r} is not a directory")
    if not (path / DONE).is_file():
        raise AdminError(409, f"path {raw!r} has no {DONE} marker: not published yet")
    if not any(path.glob("*.safetensors")):
        raise AdminError(400, f"path {raw!r} holds no .safetensors files")
    return path


def check_safetensors(path: Path) -> None:
    """Every .safetensors file must have a readable header whose tensors fit in the file:
    a corrupt or truncated one is refused before the engine is touched."""
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(file, framework="pt") as f:
                names = list(f.keys())
        except Exception as e:  # safetensors raises its own error types
            raise AdminError(400, f"{file.parent.name}/{file.name} is not a valid safetensors file: {e}") from None
        if not names:
            raise AdminError(400, f"{file.parent.name}/{file.name} holds no tensors")


def check_marker_version(path: Path, version: int) -> None:
    """The version asked for must be the one the directory's marker vouches for."""
    try:
        marker = Marker.model_validate_json((path / DONE).read_bytes())
    except (OSError, ValidationError):
        raise AdminError(400, f"{path.name}/{DONE} is not a valid marker") from None
    held = getattr(marker, "version", marker.step)
    if held != version:
        raise AdminError(400, f"{path.name} holds version {held}, not {version}")


class WeightManager:
    """Knows which weights are served and swaps them in place, one load at a time."""

    def __init__(self, engine, run_dir: Path, base_path: str, metrics: MetricsWriter) -> None:
        self.engine = engine
        self.run_dir = run_dir
        self.base_path = base_path
        self.info = WeightsInfo(version=0, path=base_path, base_path=base_path)
        self.metrics = metrics
        self._lock = asyncio.Lock()

    async def load(self, request: LoadWeightsRequest) -> WeightsInfo:
        async with self._lock:
            path = resolve_weights_dir(self.run_dir, request.path, self.base_path)
            if path is None and request.version != 0:
                raise AdminError(400, "the base model is version 0")
            if path is not None:
                check_marker_version(path, request.version)
                check_safetensors(path)
            if path is not None:
                audit_read(path, INFERENCE)
            source = str(path) if path else None
            served = path.relative_to(self.run_dir.resolve()).as_posix() if path else self.base_path
            await self.engine.pause_generation(mode="keep", clear_cache=False)
            try:
                await self.engine.collective_rpc("triad_load_weights", args=(source,))
                await self.engine.reset_prefix_cache(reset_running_requests=True)
            except Exception:
                # half-loaded weights are no version at all: make every client re-align
                self.info = WeightsInfo(version=-1, path="", base_path=self.base_path)
                raise
            finally:
                await self.engine.resume_generation()
            self.info = WeightsInfo(version=request.version, path=served, base_path=self.base_path)
        log.info("serving weights version %d from %s", request.version, self.info.path)
        self.metrics.log(request.version, version=request.version, path=self.info.path)
        return self.info

    async def pause(self) -> PauseState:
        await self.engine.pause_generation(mode="keep", clear_cache=False)
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


def add_admin_routes(app: FastAPI, manager: WeightManager, token: str | None) -> None:
    router = APIRouter(prefix=ADMIN_PREFIX, dependencies=[Depends(bearer_guard(token))])

    @router.get(WEIGHTS_ROUTE)
    async def get_weights() -> WeightsInfo:
        return manager.info

    @router.post(WEIGHTS_ROUTE)
    async def post_weights(request: Request) -> WeightsInfo:
        body = parse_body(await request.body(), LoadWeightsRequest)
        try:
            return await manager.load(body)
        except AdminError as e:
            raise HTTPException(status_code=e.status, detail=e.detail) from None

    @router.post(PAUSE_ROUTE)
    async def pause() -> PauseState:
        return await manager.pause()

    @router.post(RESUME_ROUTE)
    async def resume() -> PauseState:
        return await manager.resume()

    app.include_router(router)
