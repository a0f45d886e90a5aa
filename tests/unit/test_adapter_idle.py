"""Inference's `AdapterManager` against a fake vLLM model registry and an injected clock: the idle
sweep unloads the adapter of a run that stopped updating (and so says the admin list), keeps one
that keeps updating or whose new version is loading when the sweep comes; a failed unload
leaves the record on the new version; local copies from an object store go with their version;
no load or unload pauses the engine (other runs keep generating); a version number published
again with other weights (a trainer that resumed) is loaded again."""

from __future__ import annotations

import asyncio
import types

import pytest
import torch

from inference.adapters import AdapterManager
from inference.admin import AdminError
from shared.admin_api import LoadAdapterRequest
from shared.rundir import INFERENCE, RunDir
from shared.waiting import async_wait_for

IDLE_S = 1.0  # halves and quarters of it are exact in binary, so "exactly IDLE_S" is exact


class LoraEngine:
    """vLLM's engine client with LoRA on; its pause calls (what a full weight load makes) are
    recorded."""

    class vllm_config:  # noqa: N801 (vLLM's attribute names)
        lora_config = object()

    def __init__(self) -> None:
        self.pauses: list[str] = []
        self.engine_core = types.SimpleNamespace(pause_scheduler_async=self.record("pause_scheduler_async"))
        self.pause_generation = self.record("pause_generation")

    def record(self, method: str):
        async def call(*args, **kwargs) -> None:
            self.pauses.append(method)

        return call


class FakeModels:
    """vLLM's `OpenAIServingModels` as far as adapters go: which names it serves; a load of a
    name in `gates` waits for its event."""

    def __init__(self) -> None:
        self.served: set[str] = set()
        self.unloaded: list[str] = []
        self.loads: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.waiting: set[str] = set()
        self.refuse_unload: set[str] = set()
        self.refuse_load: set[str] = set()

    async def load_lora_adapter(self, request) -> str:
        if request.lora_name in self.gates:
            self.waiting.add(request.lora_name)
            await self.gates[request.lora_name].wait()
        if request.lora_name in self.served or request.lora_name in self.refuse_load:
            return types.SimpleNamespace(error=types.SimpleNamespace(message=f"{request.lora_name} refused"))
        self.served.add(request.lora_name)
        self.loads.append(request.lora_name)
        return "loaded"

    async def unload_lora_adapter(self, request) -> str:
        if request.lora_name in self.refuse_unload:
            return types.SimpleNamespace(
                error=types.SimpleNamespace(message="The lora adapter was not found")
            )
        self.served.remove(request.lora_name)
        self.unloaded.append(request.lora_name)
        return "unloaded"


@pytest.fixture
def rundir(tmp_path) -> RunDir:
    """A run directory with adapter versions 1..4 (tiny tensors in PEFT's layout)."""
    from trainer.versions import Adapter, write_version

    rundir = RunDir(tmp_path)
    for version in range(1, 5):
        state = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.full((2, 4), float(version))}
        write_version(rundir, "r", version, Adapter(state, {"r": 2, "peft_type": "LORA"}), keep_last=10)
    return rundir


def load(manager: AdapterManager, rundir: RunDir, name: str, version: int):
    request = LoadAdapterRequest(
        name=name, run_id=f"run-{name}", version=version, path=rundir.weights.relative(version)
    )
    return asyncio.create_task(manager.load(request))


def listed(manager: AdapterManager) -> dict[str, int]:
    return {a.name: a.version for a in manager.info().adapters}


def alive_before(version: int) -> list[str]:
    """What loading "alive" up to `version` unloads: each version before the one kept."""
    return [f"alive@v{v}" for v in range(1, version - 1)]


class Clock:
    """Wall-clock seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def scenario(rundir: RunDir) -> None:
    models, clock = FakeModels(), Clock()
    manager = AdapterManager(LoraEngine(), rundir, rundir.metrics.writer(INFERENCE), clock=clock)
    manager.models = models
    await load(manager, rundir, "dead", 1)
    for version in (1, 2, 3, 4):  # "alive" updates every IDLE_S / 2, with a sweep between
        await load(manager, rundir, "alive", version)
        clock.now += IDLE_S / 2
        swept = await manager.sweep(IDLE_S)
        assert swept == (["dead"] if version == 3 else []), (version, swept)  # IDLE_S at 2: not yet
    assert listed(manager) == {"alive": 4}
    assert sorted(models.unloaded) == sorted(["dead@v1", *alive_before(4)])
    assert manager.loaded["alive"].kept == ["alive@v3"] and {"alive@v3", "alive@v4"} <= models.served
    clock.now += IDLE_S / 2  # exactly IDLE_S since the last load: not idle yet
    assert await manager.sweep(IDLE_S) == [] and listed(manager) == {"alive": 4}
    clock.now += 0.25
    assert await manager.sweep(IDLE_S) == ["alive"] and listed(manager) == {}
    # "slow"'s version 1 goes idle while its version 2 is loading: the sweep that comes
    # meanwhile waits for the load, and the new version is kept.
    await load(manager, rundir, "slow", 1)
    clock.now += IDLE_S / 2
    models.gates["slow@v2"] = asyncio.Event()
    loading = load(manager, rundir, "slow", 2)

    async def reached() -> bool | None:
        return "slow@v2" in models.waiting or None

    await async_wait_for(reached, "the load of slow@v2 to reach vLLM", timeout=10.0, poll=0.01)
    clock.now += IDLE_S  # version 1 is idle now
    sweeping = asyncio.create_task(manager.sweep(IDLE_S))
    await asyncio.sleep(0)
    assert not sweeping.done()  # waits for the load's lock
    models.gates["slow@v2"].set()
    assert (await loading).version == 2 and "slow@v1" in models.served  # kept, for requests in flight
    assert await sweeping == [] and manager.loaded["slow"].kept == ["slow@v1"]
    clock.now += IDLE_S + 0.25
    assert await manager.sweep(IDLE_S) == ["slow"] and listed(manager) == {}
    assert models.served == set() and manager.info().lora


def test_idle_adapters_are_unloaded_and_updated_or_loading_ones_kept(rundir):
    asyncio.run(scenario(rundir))


def test_a_failed_unload_of_the_old_version_still_records_the_new_one(rundir):
    """vLLM loaded v2 but refuses to unload v0's successor: the record must say v2, or every
    retry would ask vLLM for v2 again and be told it is already loaded."""

    async def run() -> None:
        models = FakeModels()
        manager = AdapterManager(LoraEngine(), rundir, rundir.metrics.writer(INFERENCE))
        manager.models = models
        for version in (1, 2):
            await load(manager, rundir, "a", version)
        models.refuse_unload.add("a@v1")
        assert (await load(manager, rundir, "a", 3)).version == 3
        assert manager.loaded["a"].served_as == "a@v3" and manager.loaded["a"].kept == ["a@v2"]
        assert (await load(manager, rundir, "a", 3)).version == 3  # a retry is not "already loaded"
        assert (await load(manager, rundir, "a", 4)).kept == ["a@v3"]
        assert models.served == {"a@v1", "a@v3", "a@v4"}  # vLLM kept v1; nothing addresses it

    asyncio.run(run())


def test_loads_and_unloads_never_pause_the_engine(rundir):
    async def run() -> LoraEngine:
        engine, models = LoraEngine(), FakeModels()
        manager = AdapterManager(engine, rundir, rundir.metrics.writer(INFERENCE))
        manager.models = models
        for version in (1, 2, 3, 4):  # each from the third on unloads the one two before it
            await load(manager, rundir, "a", version)
        assert models.unloaded == ["a@v1", "a@v2"]
        assert await manager.sweep(0.0) == ["a"]
        return engine

    assert asyncio.run(run()).pauses == []


def test_local_copies_from_an_object_store_go_with_their_version(tmp_path, monkeypatch):
    """Each version is fetched into the cache to load it; its copy is dropped when the version is
    unloaded (replaced, or idle) and when its load fails."""
    from shared.storage import open_store
    from tests.s3 import MotoServer
    from trainer.versions import Adapter, write_version

    moto = MotoServer(tmp_path / "moto.log")
    try:
        moto.create_bucket("adapters")
        for key, value in moto.env().items():
            monkeypatch.setenv(key, value)
        url = "s3://adapters/run"
        rundir = RunDir(url, open_store(url, tmp_path / "cache"))
        for version in range(1, 5):
            state = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.full((2, 4), float(version))}
            write_version(rundir, "r", version, Adapter(state, {"r": 2, "peft_type": "LORA"}), keep_last=10)
        cached = [rundir.store.local_path(rundir.weights.relative(v)) for v in range(5)]
        clock = Clock()
        models = FakeModels()
        manager = AdapterManager(LoraEngine(), rundir, rundir.metrics.writer(INFERENCE), clock=clock)
        manager.models = models

        async def run() -> None:
            for version in (1, 2, 3):
                await load(manager, rundir, "a", version)
            assert [c.exists() for c in cached[1:4]] == [False, True, True]  # v1 unloaded, v2 kept
            models.refuse_load.add("a@v4")
            with pytest.raises(AdminError, match="refused"):
                await load(manager, rundir, "a", 4)
            assert not cached[4].exists() and cached[3].exists()
            clock.now += IDLE_S + 0.25
            assert await manager.sweep(IDLE_S) == ["a"]
            assert not any(c.exists() for c in cached)

        asyncio.run(run())
    finally:
        moto.close()


def test_a_version_published_again_with_other_weights_is_loaded_again(rundir):
    """The trainer resumed from its checkpoint after update 1 and publishes 2 and 3 again, with
    other weights: the server holds 2 (kept) and 3 (served) under those names, and must not serve
    the discarded adapters; loading the same files again (a retry) loads nothing."""
    from shared.digest import version_digest
    from trainer.versions import Adapter, write_version

    async def run() -> None:
        models = FakeModels()
        manager = AdapterManager(LoraEngine(), rundir, rundir.metrics.writer(INFERENCE))
        manager.models = models
        for version in (1, 2, 3):
            await load(manager, rundir, "a", version)
        assert (await load(manager, rundir, "a", 3)).version == 3 and models.loads == ["a@v1", "a@v2", "a@v3"]
        written = {}
        for version in (2, 3):
            state = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.full((2, 4), -float(version))}
            adapter = Adapter(state, {"r": 2, "peft_type": "LORA"})
            written[version] = write_version(rundir, "r", version, adapter, keep_last=10).digests
        for version in (2, 3):
            info = await load(manager, rundir, "a", version)
            assert info.digest == version_digest(written[version]) and info.tensor_digests == written[version]
        assert models.loads == ["a@v1", "a@v2", "a@v3", "a@v2", "a@v3"]
        assert models.unloaded == ["a@v1", "a@v2", "a@v3"]  # v1 replaced; v2 and v3 as they were
        assert manager.loaded["a"].served_as == "a@v3" and manager.loaded["a"].kept == ["a@v2"]
        assert models.served == {"a@v2", "a@v3"}

    asyncio.run(run())
