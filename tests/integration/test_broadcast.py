"""Weights by broadcast (Gloo on CPU): trainer rank 0 -> two inference servers, no files read.

1. The test plays the orchestrator's part of the handshake against a real 2-rank
   trainer and two real servers: after each of 4 updates both servers' logprobs
   equal those of `transformers` loading the same version from files (the
   trainer also writes them), and training moved them; each server's digest of
   what it received equals the trainer's. The last update's first bucket is
   corrupted on the way (failpoint): the orchestrator's check finds the tensor,
   reloads one server from the files, and stops on the other as it would
   without files.
2. A real run (orchestrator, trainer, two servers) in which one server is
   killed during an update (between the orchestrator's answer and the trainer's
   send, which a failpoint holds open for a few seconds): the update falls back
   to files, it is logged, and the run finishes on the other server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from shared.admin_api import ADMIN_PREFIX, BROADCAST_INIT_ROUTE, BROADCAST_RECEIVE_ROUTE
from shared.broadcast import Receiving, SendReady, plan_buckets, read_handshake, write_handshake
from shared.digest import first_difference
from shared.faults import FAILPOINT_VAR, TRAINER_CORRUPT_BUCKET, TRAINER_HOLD_BROADCAST
from shared.rundir import Handshake, RunDir
from shared.waiting import wait_for
from tests.helpers import REPO, Server, free_port, trainer_cmd, triad_cmd
from tests.integration.test_trainer import make_batches, sequence_logprobs, vllm_prompt_logprobs

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 4
TOKEN = "broadcast-test-token"
SEQUENCES = [[5, 17, 3, 99, 42, 7, 7, 120], [200, 1, 64, 64, 31], [9, 250, 13, 77, 2, 18, 40]]


def served_logprobs(url: str) -> list[list[float]]:
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    return vllm_prompt_logprobs(url, model, SEQUENCES)


def files_logprobs(weights_dir: Path | str) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    return sequence_logprobs(
        AutoModelForCausalLM.from_pretrained(weights_dir, dtype=torch.float32), SEQUENCES
    )


def admin_post(server: Server, route: str, body: dict, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(server.url + ADMIN_PREFIX + route, json=body, headers=headers, timeout=120)


def gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True))


def wait_while_running(
    present: Callable[[], bool], what: str, proc: subprocess.Popen, timeout: float = 180
) -> None:
    """Wait until `present()`; fail at once if the trainer `proc` exits first."""

    def check() -> bool | None:
        if present():
            return True
        assert proc.poll() is None, f"the trainer exited ({proc.returncode}) before {what}"
        return None

    wait_for(check, what, timeout, poll=0.05)


def start_servers(run_dir: Path, model: str, names: list[str], extra: tuple[str, ...] = ()) -> list[Server]:
    servers = [Server(run_dir, model, run_dir.parent / f"{n}.log", *extra) for n in names]
    for s in servers:
        s.wait_healthy()
    return servers


def check_corrupted_broadcast(run_dir: Path, run_id: str, receivers: list[Server], version: int, tensor: str):
    """The orchestrator's check of a received version: server a is reloaded from the version's
    files and then verified; for server b, told there are no files, the run stops naming it."""
    from orchestrator.servers.backends.admin_routes import TriadAdmin
    from orchestrator.servers.backends.base import DigestMismatch
    from orchestrator.servers.client import InferenceClient
    from orchestrator.servers.pool import Server as PoolServer
    from orchestrator.servers.pool import ServerPool
    from orchestrator.weights.follower import WeightFollower
    from shared.config import load_config

    async def run() -> None:
        cfg = load_config(None, [f"run_dir={run_dir}"])
        clients = [InferenceClient(s.url, TOKEN, 120) for s in receivers]
        pool = ServerPool(
            [PoolServer(c, TriadAdmin(c, 120), version=version) for c in clients], cfg.orchestrator
        )
        follower = WeightFollower(cfg, RunDir(run_dir), run_id, pool, asyncio.sleep)
        try:
            await follower.check_received(pool.servers[0], version, files=True)
            info = await pool.servers[0].backend.current()
            assert info.digest == RunDir(run_dir).weights.marker(version, run_id).digest
            with pytest.raises(
                DigestMismatch, match=f"{receivers[1].url} received version {version} by broadcast"
            ):
                await follower.check_received(pool.servers[1], version, files=False)
        finally:
            for c in clients:
                await c.close()

    asyncio.run(run())


def test_broadcast_reaches_two_servers_exactly(tmp_path, tiny_model):
    run_dir = tmp_path / "run"
    rundir = RunDir(run_dir)
    run_id = rundir.ensure_run({}).run_id
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    port = free_port()
    token = (f'inference.admin_token="{TOKEN}"',)  # the store admits only peers holding it
    receivers = start_servers(run_dir, tiny_model, ["a", "b"], token)
    sets = [
        *token,
        f"run_dir={run_dir}",
        f"model={tiny_model}",
        f"max_steps={STEPS}",
        "trainer.optim.lr=1e-3",
        'weights.transport="broadcast"',
        f"weights.broadcast.port={port}",
        "weights.broadcast.timeout_s=60",
        "trainer.checkpoint.every=1",
        "weights.keep=10",
        "weights.broadcast.bucket_mb=0.5",
    ]
    log = open(tmp_path / "trainer.log", "wb")  # noqa: SIM115
    corrupt = {**os.environ, FAILPOINT_VAR: f"{TRAINER_CORRUPT_BUCKET}:{STEPS}"}
    trainer = subprocess.Popen(
        trainer_cmd(*[f"--set={s}" for s in sets], nproc=2),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=corrupt,
    )
    try:
        for i, s in enumerate(receivers):
            init = dict(
                host="127.0.0.1", port=port, generation=7, world_size=3, rank_offset=1 + i, timeout_s=60
            )
            r = admin_post(s, BROADCAST_INIT_ROUTE, init, TOKEN)
            assert r.status_code == 200 and r.json()["workers"] == 1, r.text
        before = files_logprobs(tiny_model)
        for version in range(1, STEPS + 1):
            wait_while_running(
                lambda v=version: rundir.has_handshake(v, Handshake.SEND_READY),
                f"{Handshake.SEND_READY} for version {version}",
                trainer,
            )
            ready = read_handshake(rundir, version, Handshake.SEND_READY, SendReady, run_id)
            assert ready is not None and len({t.dtype for t in ready.tensors}) == 1
            receiving = Receiving(run_id=run_id, version=version, generation=7, world_size=3)
            write_handshake(rundir, version, Handshake.RECEIVING, receiving)
            body = {"version": version, "path": rundir.weights.relative(version)}
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                answers = list(
                    pool.map(lambda s, b=body: admin_post(s, BROADCAST_RECEIVE_ROUTE, b, TOKEN), receivers)
                )
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            wait_while_running(
                lambda v=version: rundir.weights.has_marker(v),
                rundir.weights.describe_marker(version),
                trainer,
            )
            marker = rundir.weights.marker(version, run_id)
            assert marker is not None and marker.files  # checkpoint.every=1: files too, to compare with
            if version == STEPS:
                first = ready.tensors[plan_buckets(ready.tensors, ready.bucket_bytes)[0][0]].name
                for a in answers:
                    assert first_difference(marker.tensor_digests, a.json()["tensor_digests"]) == first
                check_corrupted_broadcast(run_dir, run_id, receivers, version, first)
            else:
                for a in answers:
                    assert (
                        a.json()["digest"] == marker.digest
                        and a.json()["tensor_digests"] == marker.tensor_digests
                    )
            expected = files_logprobs(rundir.weights.path(version))
            for s in receivers if version < STEPS else receivers[:1]:
                assert gap(served_logprobs(s.url), expected) < 1e-3, (version, s.url)
        assert trainer.wait(timeout=120) == 0
        assert "admits only peers holding the run's admin token" in (tmp_path / "trainer.log").read_text()
        assert gap(before, expected) > 1e-2  # training moved the weights: the comparison can fail
        sent = [r for r in rundir.metrics.rows("inference") if r.get("transport") == "broadcast"]
        assert len(sent) == 2 * STEPS
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for s in receivers:
            s.stop()


def test_a_server_killed_during_an_update_falls_back_to_files(tmp_path, tiny_model):
    run_dir = tmp_path / "run"
    steps, port = 6, free_port()
    servers = start_servers(run_dir, tiny_model, ["a", "b"])
    sets = [
        f"run_dir={run_dir}",
        f"model={tiny_model}",
        f"max_steps={steps}",
        "trainer.checkpoint.every=0",
        'weights.transport="broadcast"',
        f"weights.broadcast.port={port}",
        "weights.broadcast.timeout_s=10",
        f'orchestrator.servers.urls=["{servers[0].url}", "{servers[1].url}"]',
        "orchestrator.batch_size=4",
        "orchestrator.group_size=4",
        "orchestrator.sampling.max_tokens=4",
        "orchestrator.servers.health_interval_s=1",
        "orchestrator.servers.retry_backoff_s=0.2",
    ]
    flags = [f"--set={s}" for s in sets]
    commands = {
        "orchestrator": triad_cmd("orchestrator", *flags),
        "trainer": trainer_cmd(*flags),
    }
    logs = {n: open(tmp_path / f"{n}.out", "wb") for n in commands}  # noqa: SIM115
    # the trainer holds its send of version 3 for HOLD_S once the orchestrator has answered: the
    # send took milliseconds, and a kill that came after it was not seen by the trainer
    held = {**os.environ, FAILPOINT_VAR: f"{TRAINER_HOLD_BROADCAST}:3"}
    env = {"orchestrator": os.environ, "trainer": held}
    procs = {
        n: subprocess.Popen(cmd, cwd=REPO, stdout=logs[n], stderr=subprocess.STDOUT, env=env[n])
        for n, cmd in commands.items()
    }
    rundir = RunDir(run_dir)
    try:
        wait_while_running(
            lambda: rundir.has_handshake(3, Handshake.RECEIVING),
            "an update in flight",
            procs["trainer"],
            timeout=300,
        )
        servers[1].kill()  # while version 3 is being handed over: before the trainer sends it
        codes = {n: p.wait(timeout=400) for n, p in procs.items()}
        text = {n: (tmp_path / f"{n}.out").read_text(errors="replace") for n in logs}
        assert codes == {"orchestrator": 0, "trainer": 0}, text
        assert "broadcast of version 3 failed on 1 server(s): falling back to files" in text["orchestrator"]
        assert "broadcast of version 3 failed" in text["trainer"] and "writing files" in text["trainer"]
        trained = [r["step"] for r in rundir.metrics.rows("trainer")]
        assert trained == list(range(1, steps + 1))
        # a new generation without the dead server carried the later updates
        lines = text["orchestrator"].splitlines()
        generations = [line for line in lines if "broadcast group generation" in line]
        assert len(generations) == 2 and servers[1].url not in generations[1], generations
        loads = rundir.metrics.rows("inference")
        broadcast = sorted(r["version"] for r in loads if r.get("transport") == "broadcast")
        assert broadcast[:4] == [1, 1, 2, 2], loads  # both servers, before the kill: no files at all
        assert [v for v in broadcast if v > 3] == list(range(4, steps + 1)), loads  # the survivor
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for s in servers:
            s.stop()
