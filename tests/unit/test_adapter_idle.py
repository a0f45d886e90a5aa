"""Inference's idle-adapter unload (`AdapterManager.sweep_forever`) against a fake vLLM model
registry: the adapter of a run that stopped updating goes, and so says the admin list; one
that keeps updating, or whose new version is loading when the sweep comes, stays."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from inference.adapters import AdapterManager
from shared.admin_api import LoadAdapterRequest
from shared.rundir import INFERENCE, RunDir

IDLE_S = 0.8  # the sweep runs every IDLE_S / 4


class LoraEngine:
    class vllm_config:  # noqa: N801 (vLLM's attribute names)
        lora_config = object()


class FakeModels:
    """vLLM's `OpenAIServingModels` as far as adapters go: which names it serves; a load of a
    name in `gates` waits for its event."""

    def __init__(self) -> None:
        self.served: set[str] = set()
        self.unloaded: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def load_lora_adapter(self, request) -> str:
        if request.lora_name in self.gates:
            await self.gates[request.lora_name].wait()
        self.served.add(request.lora_name)
        return "loaded"

    async def unload_lora_adapter(self, request) -> str:
        self.served.remove(request.lora_name)
        self.unloaded.append(request.lora_name)
        return "unloaded"


@pytest.fixture
def rundir(tmp_path) -> RunDir:
    """A run directory with adapter versions 1..4 (tiny tensors in PEFT's layout)."""
    from trainer.publish import write_adapter

    rundir = RunDir(tmp_path)
    for version in range(1, 5):
        state = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.full((2, 4), float(version))}
        write_adapter(rundir, "r", version, state, {"r": 2, "peft_type": "LORA"}, keep_last=10)
    return rundir


def load(manager: AdapterManager, rundir: RunDir, name: str, version: int):
    request = LoadAdapterRequest(name=name, run_id=f"run-{name}", version=version,
                                 path=rundir.weights.relative(version))  # fmt: skip
    return asyncio.create_task(manager.load(request))


def listed(manager: AdapterManager) -> dict[str, int]:
    return {a.name: a.version for a in manager.info().adapters}


def alive_before(version: int) -> list[str]:
    """What loading "alive" up to `version` unloads: each version before the one kept."""
    return [f"alive@v{v}" for v in range(1, version - 1)]


async def until(check, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def scenario(rundir: RunDir) -> None:
    models = FakeModels()
    manager = AdapterManager(LoraEngine(), rundir, rundir.metrics.writer(INFERENCE))
    manager.models = models
    sweeper = asyncio.create_task(manager.sweep_forever(IDLE_S))
    try:
        await load(manager, rundir, "dead", 1)
        started = time.monotonic()
        for version in (1, 2, 3, 4):  # "alive" updates every IDLE_S / 2
            await load(manager, rundir, "alive", version)
            await asyncio.sleep(IDLE_S / 2)
        assert time.monotonic() - started > IDLE_S * 1.5  # every sweep of that time has run
        assert listed(manager) == {"alive": 4}
        assert sorted(models.unloaded) == sorted(["dead@v1", *alive_before(4)])
        assert manager.loaded["alive"].kept == ["alive@v3"] and {"alive@v3", "alive@v4"} <= models.served
        await until(lambda: listed(manager) == {}, '"alive" to be unloaded once it stops updating')
        # "slow"'s version 1 goes idle while its version 2 is loading: the sweeps that come
        # meanwhile wait for the load, and the new version is kept.
        await load(manager, rundir, "slow", 1)
        await asyncio.sleep(IDLE_S / 2)
        models.gates["slow@v2"] = asyncio.Event()
        loading = load(manager, rundir, "slow", 2)
        await asyncio.sleep(IDLE_S)
        models.gates["slow@v2"].set()
        assert (await loading).version == 2 and "slow@v1" in models.served  # kept, for requests in flight
        assert manager.loaded["slow"].kept == ["slow@v1"]
        await asyncio.sleep(IDLE_S / 2)  # two more sweeps: the new version is fresh
        assert listed(manager)["slow"] == 2 and "slow@v2" in models.served
        await until(lambda: listed(manager) == {}, '"slow" to be unloaded once idle')
        assert models.served == set() and manager.info().lora
    finally:
        sweeper.cancel()


def test_idle_adapters_are_unloaded_and_updated_or_loading_ones_kept(rundir):
    asyncio.run(scenario(rundir))
