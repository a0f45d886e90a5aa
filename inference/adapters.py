"""LoRA adapters of several runs on one server: each run's newest version is served as
`<name>@v<V>`, loaded through vLLM's model registry (no pause: other runs keep generating).
The run's previous version stays addressable (`ADAPTER_VERSIONS_KEPT` versions in all), so
requests in flight at it when V loads finish; older ones are unloaded. A name belongs to
the run that first loaded it. A load's `path` is relative to this server's run directory:
runs sharing the server keep their run directories inside it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import load_file

from inference.admin import AdminError, check_marker_version, check_size, resolve_inside
from shared.admin_api import AdapterInfo, AdaptersInfo, LoadAdapterRequest, served_adapter_name
from shared.digest import tensor_digest, version_digest
from shared.metrics import MetricsWriter
from shared.objectstore import is_object_url
from shared.rundir import AdapterFiles, RunDir

log = logging.getLogger("triad.inference")
ADAPTER_VERSIONS_KEPT = 2  # a run's newest version and the one before: `--max-loras` >= runs x 2


def file_digests(path) -> dict[str, str]:
    """The `shared/digest.py` digest of each of the adapter's tensors as the server read them."""
    return {name: tensor_digest(t) for name, t in load_file(path).items()}


class AdapterManager:
    """The loaded adapters by name; `models` is vLLM's `OpenAIServingModels` (set once the app
    state exists). `clock` (wall-clock seconds) dates each load for the idle sweep.

    The record follows what vLLM serves: a version is recorded as soon as vLLM loaded it, and an
    older version vLLM fails to unload is logged and forgotten (it can no longer be addressed).
    Each served version's directory is kept in `paths`; its local copy (fetched from an object
    store) is dropped when the version is unloaded, or when its load fails."""

    def __init__(
        self, engine, rundir: RunDir, metrics: MetricsWriter, clock: Callable[[], float] = time.time
    ) -> None:
        self.engine, self.rundir, self.metrics, self.clock = engine, rundir, metrics, clock
        self.models = None
        self.loaded: dict[str, AdapterInfo] = {}
        self.paths: dict[str, str] = {}  # served name -> its directory, relative to the run directory
        self.digests: dict[str, str] = {}  # served name -> the version digest of what vLLM holds
        self._lock = asyncio.Lock()

    @property
    def lora(self) -> bool:
        return getattr(getattr(self.engine, "vllm_config", None), "lora_config", None) is not None

    def info(self) -> AdaptersInfo:
        root = self.rundir.name if is_object_url(self.rundir.name) else str(self.rundir.root.resolve())
        return AdaptersInfo(lora=self.lora, run_dir=root, adapters=list(self.loaded.values()))

    def check_owner(self, request: LoadAdapterRequest) -> None:
        held = self.loaded.get(request.name)
        if held is not None and held.run_id != request.run_id:
            raise AdminError(
                409, f"adapter name {request.name!r} is owned by run {held.run_id!r}, not {request.run_id!r}"
            )

    async def load(self, request: LoadAdapterRequest) -> AdapterInfo:
        if not self.lora:
            raise AdminError(
                409, "this server has no LoRA support: start it with inference.vllm_args = ['--enable-lora']"
            )
        async with self._lock:
            self.check_owner(request)
            served, path = await asyncio.to_thread(resolve_inside, self.rundir, request.path)
            started = time.monotonic()
            try:
                info = await self._load(request, served, path)
            except BaseException:
                if served not in self.paths.values():  # a copy no served version uses
                    self.rundir.store.drop_local(served)
                raise
        log.info("serving adapter %s of run %s from %s", info.served_as, request.run_id, served)
        await self.metrics.log_from_loop(
            request.version,
            version=request.version,
            path=served,
            adapter=info.served_as,
            run_id=request.run_id,
            load_s=time.monotonic() - started,
            loaded_at=info.loaded_at,
        )
        return info

    async def _load(self, request: LoadAdapterRequest, served: str, path: Path) -> AdapterInfo:
        """Check and load the version at `path`, record it, then unload what it replaces."""
        if not RunDir.has_marker_at(path) or not AdapterFiles.is_adapter_at(path):
            raise AdminError(409, f"path {request.path!r} holds no published LoRA adapter")
        check_marker_version(path, request.version)
        check_size(path)
        digests = await asyncio.to_thread(file_digests, AdapterFiles.file_at(path))
        digest = version_digest(digests)
        new = served_adapter_name(request.name, request.version)
        previous = self.loaded.get(request.name)
        kept = [*previous.kept, previous.served_as] if previous is not None else []
        if new in kept and self.digests.get(new) != digest:
            # a trainer that resumed from a checkpoint publishes this version number again, with
            # other weights: vLLM's copy under the name is what was discarded
            log.info("reloading adapter %s: version %d was published again", new, request.version)
            await self.call("unload_lora_adapter", new)
            kept.remove(new)
        if new not in kept:
            await self.call("load_lora_adapter", new, str(path))
        self.paths[new] = served
        self.digests[new] = digest
        kept = [k for k in kept if k != new]
        cut = max(len(kept) - (ADAPTER_VERSIONS_KEPT - 1), 0)
        stale, kept = kept[:cut], kept[cut:]
        self.loaded[request.name] = info = AdapterInfo(
            name=request.name,
            run_id=request.run_id,
            version=request.version,
            served_as=new,
            path=served,
            digest=digest,
            tensor_digests=digests,
            kept=kept,
            loaded_at=self.clock(),
        )
        for old in stale:
            try:
                await self.unload(old)
            except AdminError as e:
                log.warning("unloading %s, replaced by %s: %s (forgotten)", old, new, e.detail)
        return info

    async def unload(self, served_as: str) -> None:
        """Unload a served version and drop its local copy (even if vLLM refuses: the name is
        no longer served by this manager)."""
        try:
            await self.call("unload_lora_adapter", served_as)
        finally:
            self.forget(served_as)

    def forget(self, served_as: str) -> None:
        """Drop the local copy of an unloaded version's directory unless another version uses it."""
        self.digests.pop(served_as, None)
        directory = self.paths.pop(served_as, None)
        if directory is not None and directory not in self.paths.values():
            self.rundir.store.drop_local(directory)

    async def call(self, method: str, name: str, path: str | None = None) -> None:
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

        if method == "load_lora_adapter":
            answer = await self.models.load_lora_adapter(
                LoadLoRAAdapterRequest(lora_name=name, lora_path=path)
            )
        else:
            answer = await self.models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))
        if not isinstance(answer, str):  # vLLM's ErrorResponse
            raise AdminError(400, f"vLLM refused adapter {name!r}: {answer.error.message}")

    async def sweep(self, idle_s: float) -> list[str]:
        """Unload the adapters of runs that loaded no new version for `idle_s` (a run that died).
        Idleness is judged under the load lock, so a version loading meanwhile is kept; an adapter
        vLLM fails to unload stays listed."""
        unloaded = []
        async with self._lock:
            now = self.clock()
            for name, held in list(self.loaded.items()):
                if now - held.loaded_at <= idle_s:
                    continue
                try:
                    for served_as in [*held.kept, held.served_as]:
                        await self.call("unload_lora_adapter", served_as)
                        held.kept = [k for k in held.kept if k != served_as]
                        self.forget(served_as)
                except AdminError as e:
                    log.warning("unloading idle adapter %s: %s", held.served_as, e.detail)
                    continue
                del self.loaded[name]
                unloaded.append(name)
                idle = now - held.loaded_at
                log.info(
                    "unloaded adapter %s of run %s: no new version for %.0f s",
                    held.served_as,
                    held.run_id,
                    idle,
                )
        return unloaded

    async def sweep_forever(self, idle_s: float) -> None:
        while True:
            await asyncio.sleep(min(idle_s / 4, 30.0))
            await self.sweep(idle_s)
