"""`WeightManager.load` when a load fails: a version pruned meanwhile is a one-line 400 naming
it, and the server's cache never keeps a version it failed to load."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from inference.admin import WeightManager, add_admin_routes
from shared.admin_api import LoadWeightsRequest
from shared.metrics import MetricsWriter
from shared.rundir import INFERENCE, Handshake, RunDir
from shared.storage import LocalStore
from trainer.versions import FullWeights, Metadata, write_version

RUN_ID = "run-1"


class CachedStore:
    """A local run directory that readers `fetch` into a cache of their own, as from an object
    store, so what a failed load leaves in the cache shows."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.inner, self.cache = LocalStore(root), cache

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def fetch(self, key: str, last: str | None = None) -> Path:
        shutil.copytree(self.inner.local_path(key), self.cache / key, dirs_exist_ok=True)
        return self.cache / key

    def drop_local(self, key: str) -> None:
        shutil.rmtree(self.cache / key, ignore_errors=True)


class EngineCore:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def pause_scheduler_async(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(f"pause {mode} clear_cache={clear_cache}")


class Engine:
    """vLLM's engine as far as a load goes; `during_load` runs inside the worker's load, `calls`
    records the order of the engine calls."""

    def __init__(self) -> None:
        self.during_load = lambda path: None
        self.calls: list[str] = []
        self.engine_core = EngineCore(self.calls)

    async def resume_generation(self) -> None:
        self.calls.append("resume")

    async def reset_prefix_cache(self, reset_running_requests: bool) -> None:
        self.calls.append(f"reset running={reset_running_requests}")

    async def collective_rpc(self, method: str, args=()) -> list:
        self.calls.append(method)
        self.during_load(args[0])
        return [None]


@pytest.fixture
def setup(tmp_path):
    store = CachedStore(tmp_path / "run", tmp_path / "cache")
    rundir = RunDir(tmp_path / "run", store)
    metadata = Metadata(rundir, lambda d: None)
    for version in (1, 2):
        state = {"w": torch.full((4, 4), float(version))}
        write_version(rundir, RUN_ID, version, FullWeights(state, metadata), keep_last=5)
    engine = Engine()
    metrics = MetricsWriter(store, rundir.metrics.key(INFERENCE, "ab"))
    manager = WeightManager(engine, rundir, "/base", metrics)
    app = FastAPI()
    add_admin_routes(app, manager, None)
    return rundir, store, engine, manager, TestClient(app)


def post(client: TestClient, rundir: RunDir, version: int):
    return client.post("/admin/weights", json={"version": version, "path": rundir.weights.relative(version)})


def test_a_load_runs_with_scheduling_paused_and_requests_kept_then_resets_the_cache(setup):
    rundir, store, engine, manager, client = setup
    assert post(client, rundir, 1).json()["version"] == 1
    assert engine.calls == [
        "pause keep clear_cache=False",
        "triad_load_weights",
        "reset running=True",
        "resume",
    ]
    engine.calls.clear()
    engine.during_load = lambda path: 1 / 0
    with pytest.raises(ZeroDivisionError):
        asyncio.run(manager.load(LoadWeightsRequest(version=2, path=rundir.weights.relative(2))))
    assert engine.calls == ["pause keep clear_cache=False", "triad_load_weights", "resume"]  # resumed anyway


def test_a_version_pruned_while_the_server_loads_it_is_a_400_naming_it(setup):
    rundir, store, engine, manager, client = setup
    engine.during_load = lambda path: (rundir.weights.clear(1), Path(path, "gone").read_bytes())
    answer = post(client, rundir, 1)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(f"weights version 1 at {rundir.weights.relative(1)} was pruned from the run ")
    assert "FileNotFoundError" in detail and "load a newer version" in detail and "\n" not in detail
    assert not (store.cache / rundir.weights.relative(1)).exists()  # the failed copy is dropped
    engine.during_load = lambda path: None
    assert post(client, rundir, 2).json()["version"] == 2  # the server goes on


def test_a_version_pruned_before_the_fetch_is_a_400_too(setup):
    rundir, store, engine, manager, client = setup

    def pruned_meanwhile(key: str, last: str | None = None) -> Path:
        rundir.weights.clear(1)
        raise FileNotFoundError(f"{key}/model.bin")

    store.fetch = pruned_meanwhile
    answer = post(client, rundir, 1)
    assert answer.status_code == 400 and "weights version 1 at " in answer.json()["detail"], answer.text


def test_any_failed_load_drops_its_copy_and_an_error_of_a_kept_version_stands(setup):
    rundir, store, engine, manager, client = setup
    request = LoadWeightsRequest(version=2, path=rundir.weights.relative(2))

    def broken(path):
        raise RuntimeError("worker died")

    engine.during_load = broken
    with pytest.raises(RuntimeError, match="worker died"):  # not pruned: the engine's error stands
        asyncio.run(manager.load(request))
    assert not (store.cache / rundir.weights.relative(2)).exists()
    engine.during_load = lambda path: None
    assert asyncio.run(manager.load(request)).version == 2
    assert (store.cache / rundir.weights.relative(2)).is_dir()  # the served version stays cached


SLOW_ROW_S = 0.5


def test_a_loads_metrics_row_is_appended_in_place_locally_and_written_off_the_loop_in_a_store(setup):
    """On a local store a row is an append (well under a millisecond): written on the loop, since
    a thread hop made the hand-off ~7 ms longer on a busy core (`bench.quick --base`, four pairs).
    In an object store a row is a round trip (moto: 70-150 ms under load): made in a thread, so
    the server's loop, which answers /health and streams generation, keeps running."""
    rundir, store, engine, manager, client = setup
    on_main: list[bool] = []
    append, write_bytes = store.inner.append, store.inner.write_bytes

    def local_append(key: str, data: bytes) -> None:
        on_main.append(threading.current_thread() is threading.main_thread())
        append(key, data)

    def slow_put(key: str, data: bytes) -> None:
        on_main.append(threading.current_thread() is threading.main_thread())
        time.sleep(SLOW_ROW_S)
        write_bytes(key, data)

    store.append, store.write_bytes = local_append, slow_put
    gaps: list[float] = []

    async def main() -> None:
        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        assert (
            await manager.load(LoadWeightsRequest(version=1, path=rundir.weights.relative(1)))
        ).version == 1
        manager.metrics = rundir.metrics.writer(INFERENCE, "ab")  # not a LocalStore: the parts writer
        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        assert (
            await manager.load(LoadWeightsRequest(version=2, path=rundir.weights.relative(2)))
        ).version == 2
        await asyncio.sleep(0.02)  # a tick after the load: a loop held by it shows as one long gap
        ticking.cancel()

    asyncio.run(main())
    assert on_main == [True, False]
    assert [r["version"] for r in rundir.metrics.rows(INFERENCE)] == [1, 2]
    assert len(gaps) > 50 and max(gaps) < SLOW_ROW_S / 2, max(gaps)


def test_the_cache_sweep_removes_what_dead_processes_left_and_keeps_the_living(tmp_path):
    import os
    import subprocess
    import sys

    from shared.objectcache import sweep_dead_tmp
    from shared.tmpname import this_host

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(dead.stdout)
    version = RunDir(tmp_path).weights.path(3)  # a fetched version
    here = this_host()
    left = [
        tmp_path / f".tmp-{dead_pid}@{here}-write-abc",
        version.parent / f".tmp-{dead_pid}@{here}-fetch-0123",
    ]
    kept = [
        tmp_path / f".tmp-{os.getpid()}@{here}-write-def",  # this live process's scratch
        tmp_path / f".tmp-{dead_pid}@another.host-write-ghi",  # another machine's (a cache on NFS)
        tmp_path / f".tmp-{dead_pid}-write-jkl",  # no host: whose pid it is cannot be told
        version,
        version.parent / ".tmp-probe",  # not a process's (no pid): left alone
    ]
    for d in left + kept:
        (d / "part").mkdir(parents=True)
    assert sorted(sweep_dead_tmp(tmp_path)) == sorted(left)
    assert not any(d.exists() for d in left) and all(d.is_dir() for d in kept)
    assert sweep_dead_tmp(tmp_path / "missing") == []


def test_the_cache_holds_the_served_version_only_whether_it_came_by_files_or_by_broadcast(setup):
    """From an object store each version is fetched into the server's cache: the copy of the
    version served before goes when a broadcast replaces it (it stayed for the life of the
    process), and when a failed load leaves no version served."""
    from shared.admin_api import BroadcastInit, BroadcastReceive
    from shared.broadcast import SendReady, write_handshake

    rundir, store, engine, manager, client = setup
    cached = lambda version: (store.cache / rundir.weights.relative(version)).is_dir()  # noqa: E731
    assert post(client, rundir, 1).json()["version"] == 1 and cached(1)
    group = dict(host="127.0.0.1", port=29500, generation=0, world_size=2, rank_offset=1, timeout_s=5)
    asyncio.run(manager.broadcast_init(BroadcastInit(**group)))
    for version in (3, 4):  # sent by broadcast: a directory with the send-ready handshake only
        write_handshake(
            rundir,
            version,
            Handshake.SEND_READY,
            SendReady(run_id=RUN_ID, version=version, tensors=[], bucket_bytes=1),
        )

    def receive(version: int):
        return asyncio.run(
            manager.broadcast_receive(
                BroadcastReceive(version=version, path=rundir.weights.relative(version))
            )
        )

    assert receive(3).version == 3 and not cached(1) and not cached(3)
    assert post(client, rundir, 2).json()["version"] == 2 and cached(2)
    engine.during_load = lambda spec: 1 / 0
    with pytest.raises(ZeroDivisionError):
        receive(4)
    assert manager.info.version == -1 and not cached(2)
