"""Delta versions end to end without vLLM: the trainer's `VersionWriter` publishes snapshots and
deltas into a run directory, and inference's `WeightManager` (over an engine whose worker reads
the files it is given, as vLLM's does) rebuilds every version exactly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from inference.admin import WeightManager
from inference.deltas import DeltaChain, work_dir
from inference.worker_extension import iter_safetensors
from shared.admin_api import LoadWeightsRequest
from shared.delta import changed_words
from shared.digest import digesting
from shared.metrics import MetricsWriter
from shared.rundir import INFERENCE, DeltaFiles, RunDir
from shared.tmpname import this_host
from trainer.versions import Metadata, VersionWriter

RUN_ID = "run-deltas"
SHAPES = {
    "model.embed_tokens.weight": (64, 16),
    "model.layers.0.mlp.weight": (16, 48),
    "model.norm.weight": (16,),
}


class Trainer:
    """fp32 master weights, a small update per step, published in bf16."""

    def __init__(self, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.master = {n: torch.randn(s, generator=self.gen) * 0.05 for n, s in SHAPES.items()}

    def step(self) -> dict[str, torch.Tensor]:
        for tensor in self.master.values():
            tensor += torch.randn(tensor.shape, generator=self.gen) * 1e-4
        return {n: t.to(torch.bfloat16) for n, t in self.master.items()}


class Engine:
    """vLLM's engine as far as a load goes: its one worker reads the directory it is given and
    reports each tensor's digest, as `triad_load_weights` does."""

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    async def collective_rpc(self, method: str, args=()) -> list:
        digests: dict[str, str] = {}
        self.loaded = dict(digesting(iter_safetensors(args[0]), digests))
        return [digests]

    async def reset_prefix_cache(self, reset_running_requests: bool) -> None: ...

    async def resume_generation(self) -> None: ...

    class engine_core:  # noqa: N801 (the attribute vLLM's engine has)
        @staticmethod
        async def pause_scheduler_async(mode: str, clear_cache: bool) -> None: ...


def publish(rundir: RunDir, versions: range, every: int, keep: int = 3) -> dict[int, dict[str, torch.Tensor]]:
    trainer, writer = Trainer(), VersionWriter(rundir, Metadata(rundir, lambda d: None), every, keep)
    states = {}
    for version in versions:
        states[version] = trainer.step()
        writer.write(version, RUN_ID, states[version], snapshot=False)
    return states


def manager_for(rundir: RunDir, tmp_path: Path) -> tuple[WeightManager, Engine]:
    engine = Engine()
    metrics = MetricsWriter(rundir.store, rundir.metrics.key(INFERENCE, "ab"))
    manager = WeightManager(engine, rundir, "/base", metrics)
    manager.deltas = DeltaChain(rundir, tmp_path / "work")
    return manager, engine


def load(manager: WeightManager, rundir: RunDir, version: int):
    return asyncio.run(
        manager.load(LoadWeightsRequest(version=version, path=rundir.weights.relative(version)))
    )


def snapshots_read(monkeypatch) -> list[int]:
    read: list[int] = []
    real = DeltaChain._snapshot

    def spy(self, version):
        read.append(version)
        return real(self, version)

    monkeypatch.setattr(DeltaChain, "_snapshot", spy)
    return read


def test_snapshots_every_k_versions_and_deltas_between_naming_their_base(tmp_path):
    rundir = RunDir(tmp_path / "run")
    publish(rundir, range(1, 31), every=10)
    markers = {v: rundir.weights.marker(v, RUN_ID) for v in rundir.weights.steps()}
    assert sorted(markers) == [28, 29, 30]  # keep 3: the newest snapshot (30) has no deltas after it yet
    publish(rundir := RunDir(tmp_path / "run2"), range(1, 18), every=10)
    markers = {v: rundir.weights.marker(v, RUN_ID) for v in rundir.weights.steps()}
    assert sorted(markers) == list(range(10, 18))  # snapshot 10 and every delta after it are kept
    assert getattr(markers[10], "delta_base", None) is None and rundir.tensor_files(10)
    for v in range(11, 18):
        assert markers[v].delta_base == v - 1 and not rundir.tensor_files(v)
        blob = DeltaFiles.file_at(rundir.weights.path(v)).read_bytes()
        changed, total = changed_words(blob)
        assert 0 < changed < total and len(blob) < rundir.tensor_bytes(10) / 2


def test_a_joiner_at_17_with_k_10_loads_snapshot_10_and_deltas_11_to_17_and_serves_17_exactly(
    tmp_path, monkeypatch
):
    rundir = RunDir(tmp_path / "run")
    states = publish(rundir, range(1, 18), every=10)
    read = snapshots_read(monkeypatch)
    manager, engine = manager_for(rundir, tmp_path)
    info = load(manager, rundir, 17)
    assert read == [10]
    assert info.version == 17 and info.digest == rundir.weights.marker(17, RUN_ID).digest
    for name, tensor in states[17].items():
        assert torch.equal(engine.loaded[name], tensor) and engine.loaded[name].dtype == torch.bfloat16


def test_a_follower_applies_each_delta_on_the_base_it_serves_without_the_snapshot(tmp_path, monkeypatch):
    rundir = RunDir(tmp_path / "run")
    states = publish(rundir, range(1, 18), every=10)
    read = snapshots_read(monkeypatch)
    manager, engine = manager_for(rundir, tmp_path)
    for version in (10, 11, 13, 14):  # 13 skips 12: deltas 12 and 13 on top of 11
        assert load(manager, rundir, version).digest == rundir.weights.marker(version, RUN_ID).digest
        assert all(torch.equal(engine.loaded[n], t) for n, t in states[version].items())
    assert read == []  # 10 was loaded as a snapshot itself, every later one from what was served
    assert len(list((tmp_path / "work").iterdir())) == 1  # only the served version is kept


def test_weights_that_are_not_the_named_base_are_never_patched(tmp_path, monkeypatch):
    rundir = RunDir(tmp_path / "run")
    states = publish(rundir, range(1, 14), every=10)
    manager, engine = manager_for(rundir, tmp_path)
    load(manager, rundir, 12)
    version, directory, _ = manager.deltas.held
    manager.deltas.held = (version, directory, "not the digest of version 12")
    read = snapshots_read(monkeypatch)
    assert load(manager, rundir, 13).digest == rundir.weights.marker(13, RUN_ID).digest
    assert read == [10]  # the served weights were not provably 12: rebuilt from the snapshot
    assert all(torch.equal(engine.loaded[n], t) for n, t in states[13].items())


def test_a_chain_whose_snapshot_is_gone_is_a_400_naming_the_version(tmp_path):
    rundir = RunDir(tmp_path / "run")
    publish(rundir, range(1, 14), every=10)
    rundir.weights.clear(10)
    manager, _ = manager_for(rundir, tmp_path)
    client_app = __import__("fastapi").FastAPI()
    from inference.admin import add_admin_routes

    add_admin_routes(client_app, manager, None)
    response = TestClient(client_app).post(
        "/admin/weights", json={"version": 13, "path": rundir.weights.relative(13)}
    )
    assert response.status_code == 400
    assert (
        "cannot rebuild version 13" in response.json()["detail"] and "version 10" in response.json()["detail"]
    )


@pytest.mark.parametrize("every", [1, 5])
def test_every_version_of_30_rebuilds_bit_for_bit_for_a_joiner(tmp_path, every):
    rundir = RunDir(tmp_path / "run")
    trainer = Trainer(seed=3)
    writer = VersionWriter(rundir, Metadata(rundir, lambda d: None), every, keep=3)
    for version in range(1, 31):
        state = trainer.step()
        writer.write(version, RUN_ID, state, snapshot=version % 7 == 0)  # checkpoints at 7, 14, ...
        manager, engine = manager_for(rundir, tmp_path / f"joiner-{version}")
        assert load(manager, rundir, version).digest == rundir.weights.marker(version, RUN_ID).digest
        assert all(torch.equal(engine.loaded[n], t) for n, t in state.items()), version
        snapshot = version % every == 0 or version % 7 == 0 or version == 1
        assert (getattr(rundir.weights.marker(version, RUN_ID), "delta_base", None) is None) == snapshot


def test_a_new_work_directory_removes_those_of_servers_gone(tmp_path: Path) -> None:
    """A server killed mid-run leaves its `triad-deltas-<pid>@<host>-*` directory (a rebuilt version of
    the model's size); the next one removes it, and keeps those of live servers and other machines."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"triad-deltas-{gone.pid}@{this_host()}-abc"
    live = tmp_path / f"triad-deltas-{os.getppid()}@{this_host()}-def"
    other = tmp_path / f"triad-other-{gone.pid}@{this_host()}-x"
    elsewhere = tmp_path / f"triad-deltas-{gone.pid}@another.host-ghi"  # a pid of another machine
    for d in (dead, live, other, elsewhere):
        (d / "rebuilt").mkdir(parents=True)
        (d / "rebuilt" / "tensors.bin").write_bytes(b"x" * 64)
    work = work_dir(tmp_path)
    assert not dead.exists()
    assert live.is_dir() and other.is_dir() and elsewhere.is_dir()
    assert work.is_dir() and work.name.startswith(f"triad-deltas-{os.getpid()}@{this_host()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other.name, elsewhere.name, work.name]
    )


def test_a_chain_makes_its_work_directory_only_when_it_rebuilds(tmp_path: Path, monkeypatch) -> None:
    """Every server (and every test) makes a `DeltaChain`; one that never rebuilds a delta leaves
    no directory behind in the system's temporary directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    chain = DeltaChain(RunDir(tmp_path / "run"))
    chain.served(3, None, None)
    assert list(tmp_path.glob("triad-deltas-*")) == []
    assert chain.work.parent == tmp_path and chain.work.name.startswith(
        f"triad-deltas-{os.getpid()}@{this_host()}-"
    )


def test_a_rebuild_streams_holding_about_one_tensor_not_whole_models(tmp_path, monkeypatch):
    """A joiner rebuilds version 3 from snapshot 1 and deltas 2 and 3 of an 8-tensor, 4 MiB model. With
    files of one tensor (`SHARD_BYTES`, 64 MiB for real models), the rebuild's own allocations (numpy arrays
    and bytes, as tracemalloc sees them) stay under three tensors (one tensor's applied words, its file's
    bytes, the deltas), where a rebuild of whole models held two models (measured: 8.3 MiB; streamed: 1.35
    MiB). Sparse updates keep the deltas themselves small."""
    import tracemalloc

    from inference import deltas

    shape, count = (512, 512), 8
    gen = torch.Generator().manual_seed(0)
    state = {f"layer.{i}.weight": torch.randn(shape, generator=gen).to(torch.bfloat16) for i in range(count)}
    rundir = RunDir(tmp_path / "run")
    writer = VersionWriter(rundir, Metadata(rundir, lambda d: None), 10, 3)
    for version in (1, 2, 3):
        state = {n: t.clone() for n, t in state.items()}
        for tensor in state.values():
            flat = tensor.view(-1)
            flat[torch.randint(0, flat.numel(), (flat.numel() // 100,), generator=gen)] += 1.0
        writer.write(version, RUN_ID, state, snapshot=version == 1)
    model_bytes = sum(t.numel() * t.element_size() for t in state.values())
    monkeypatch.setattr(deltas, "SHARD_BYTES", 512 * 512 * 2, raising=False)
    marker, blob = DeltaFiles(rundir.weights).read(3)
    chain = DeltaChain(rundir, tmp_path / "work")

    tracemalloc.start()
    try:
        rebuilt = chain.rebuild(3, marker, blob)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert dict(iter_safetensors(str(rebuilt))).keys() == state.keys()
    assert all(torch.equal(t, state[n]) for n, t in iter_safetensors(str(rebuilt)))
    assert model_bytes == 4 * 2**20
    assert peak < 3 * model_bytes / count, (
        f"peak {peak / 2**20:.2f} MiB for a {model_bytes / 2**20:.0f} MiB model"
    )


@pytest.mark.parametrize(("every", "kept"), [(1, set()), (4, {1, 2, 4, 5, 6})])
def test_rank_0_keeps_a_copy_of_a_version_only_when_the_next_can_be_a_delta(tmp_path, every, kept):
    """Deltas off, no version is held a second time in host memory; with K = 4 neither 3 nor 7's
    predecessor is (their successors are snapshots), and the deltas still rebuild."""
    rundir = RunDir(tmp_path / "run")
    trainer = Trainer()
    writer = VersionWriter(rundir, Metadata(rundir, lambda d: None), every, keep=3)
    held, deltas = set(), set()
    for version in range(1, 7):
        writer.write(version, RUN_ID, trainer.step(), snapshot=False)
        if writer.base is not None:
            assert writer.base.version == version
            held.add(version)
        if getattr(rundir.weights.marker(version, RUN_ID), "delta_base", None) is not None:
            deltas.add(version)
    assert held == kept
    assert deltas == ({2, 3, 5, 6} if every == 4 else set())
