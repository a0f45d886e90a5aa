"""The orchestrator's scheduling, retries and staleness, against fake OpenAI-compatible servers."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import threading
import time
import types

import pyarrow.parquet as pq
import pytest

import orchestrator.servers.client as client_module
from orchestrator.batches.builder import Group
from orchestrator.batches.stats import GuardWaits
from orchestrator.environments import Prompt, load_environment
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.text import single_turn
from orchestrator.failures import Failures
from orchestrator.loop import Orchestrator, first_user_error, to_thread_to_completion
from orchestrator.servers.backends.admin_routes import TriadAdmin
from orchestrator.servers.backends.base import DigestMismatch
from orchestrator.servers.client import Completion, InferenceClient, ServerUnreachable
from orchestrator.servers.health import watch_health
from orchestrator.servers.pool import RolloutFailed, Server, ServerPool
from shared.admin_api import WeightsInfo
from shared.batch import publish_batch
from shared.config import load_config
from shared.digest import version_digest
from shared.errors import TriadError, WaitTimeout
from shared.net import free_port
from shared.rundir import ORCHESTRATOR, TRAINER, RunDir
from shared.waiting import async_wait_for
from tests.fake_openai import FakeServer
from tests.unit.test_liveness import peer_process


class FakeBackend:
    """Loads instantly; what a server 'serves' is its `Server.version`."""

    kind, updates, lists_prompts = "fake", True, True

    def __init__(self) -> None:
        self.loads: list[int] = []
        self.version, self.path = 0, "base"
        self.digests: list[dict[str, str] | None] = []  # what each next load reports loading
        self.loaded: dict[str, str] | None = None

    async def current(self) -> WeightsInfo:
        digest = None if self.loaded is None else version_digest(self.loaded)
        return WeightsInfo(
            version=self.version, path=self.path, base_path="base", digest=digest, tensor_digests=self.loaded
        )

    async def load(self, version: int, path: str) -> WeightsInfo:
        self.loads.append(version)
        self.version, self.path = version, path
        if self.digests:
            self.loaded = self.digests.pop(0)
        return await self.current()

    def model(self, version: int) -> str | None:
        return None


def make(tmp_path, urls: list[str], *sets: str) -> Orchestrator:
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            "orchestrator.batch_size=4",
            "orchestrator.group_size=2",
            "orchestrator.servers.retry_backoff_s=0.01",
            *sets,
        ],
    )
    run = RunDir(tmp_path).ensure_run({})
    oc = cfg.orchestrator
    servers = [
        Server(InferenceClient(url, None, oc.servers.request_timeout_s), FakeBackend()) for url in urls
    ]
    for server in servers:
        server.client.model = "fake"
    env = load_environment(oc.environment.name, oc.environment.args)
    return Orchestrator(cfg, run.run_id, ServerPool(servers, oc), env)


async def close(orch: Orchestrator) -> None:
    for server in orch.pool.servers:
        await server.client.close()


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def set_version(orch: Orchestrator, version: int) -> None:
    for server in orch.pool.servers:
        server.version = version


def test_producer_keeps_max_inflight_groups_busy_and_no_more(tmp_path):
    """Requests are held at the server and released one at a time: each time one returns with its
    groups, the producer starts as many new ones while the others are still held. So it keeps
    max_inflight groups generating (a producer that waited for each group, or for a whole batch,
    would not start them), and never more (peak). The first six go as one request (coalesced)."""
    with FakeServer() as fake:
        fake.state.gate = threading.Semaphore(0)

        async def six_busy(before: int, done: asyncio.Task | None = None) -> bool | None:
            await asyncio.sleep(0)
            refilled = fake.state.prompts > before and fake.state.inflight == 6
            return refilled or (done is not None and done.done()) or None

        async def run() -> int:
            orch = make(
                tmp_path,
                [fake.url],
                "orchestrator.max_inflight=6",
                "max_steps=50",
                "max_async_level=100",
                "weights.keep=200",
            )

            async def assemble() -> None:
                for step in range(1, 9):  # 8 x batch_size 4 = 32 groups
                    await orch.assemble(step)

            producer, assembler = asyncio.create_task(orch.produce()), asyncio.create_task(assemble())
            await async_wait_for(lambda: six_busy(0), "the first six groups to start", 10, poll=0.005)
            assert fake.state.requests == 1  # the six first requests as one
            releases = 0
            while not assembler.done():
                before = fake.state.prompts
                fake.state.gate.release()
                releases += 1
                what = f"new groups to start after release {releases}, with 6 generating"
                await async_wait_for(lambda b=before: six_busy(b, assembler), what, 10, poll=0.005)
            await stop(producer)
            fake.state.gate.release(100)  # the requests the stopped producer left
            assert orch.pending <= 6
            await close(orch)
            return releases

        releases = asyncio.run(run())
    assert fake.state.peak == 6
    assert releases < 32  # requests returned several groups each


def test_generation_waits_for_fresh_weights(tmp_path):
    """With eta = 0 nothing for batch 2 starts until version 1 is served."""
    with FakeServer() as fake:

        async def run() -> None:
            orch = make(
                tmp_path, [fake.url], "orchestrator.max_inflight=100", "max_steps=10", "max_async_level=0"
            )
            producer = asyncio.create_task(orch.produce())
            await orch.assemble(1)
            await asyncio.sleep(0.2)
            assert fake.state.prompts == 4  # batch 1 only: batch 2 needs version 1
            set_version(orch, 1)
            await orch.notify()
            await orch.assemble(2)
            await stop(producer)
            await close(orch)

        asyncio.run(run())


def test_the_eta_guards_wait_is_recorded_in_the_steps_row(tmp_path):
    """η = 0, 10 slots: once batch 1's 4 groups have started, batch 2's wait for version 1. The
    guard's clock is a fake one that only the test moves: 3 s pass once batch 1 is written (10
    slots free), then version 1 comes; batch 2's 4 groups start and batch 3's wait for version 2
    (6 slots free) while 7 s pass; batch 2's row has both waits, batch 1's none."""
    with FakeServer() as fake:
        clock = [100.0]

        async def run() -> list[dict]:
            orch = make(
                tmp_path, [fake.url], "orchestrator.max_inflight=10", "max_steps=10", "max_async_level=0"
            )
            orch.counters.guard = GuardWaits(clock=lambda: clock[0])
            producer = asyncio.create_task(orch.produce())
            last = time.monotonic()
            batch, dropped, filtered = await orch.assemble(1)
            await orch.finish_step(1, batch, dropped, filtered, last, time.monotonic())
            clock[0] += 3.0
            set_version(orch, 1)
            await orch.notify()

            async def started() -> bool | None:
                return fake.state.prompts == 8 or None

            await async_wait_for(started, "batch 2's groups to start", 10, poll=0.005)
            clock[0] += 7.0
            batch, dropped, filtered = await orch.assemble(2)
            await orch.finish_step(2, batch, dropped, filtered, last, time.monotonic())
            await stop(producer)
            await close(orch)
            return orch.rundir.metrics.rows(ORCHESTRATOR)

        rows = asyncio.run(run())
    assert [r["guard_wait_s"] for r in rows] == [0.0, 3.0 + 7.0]
    assert [r["guard_idle_slot_s"] for r in rows] == [0.0, 3.0 * 10 + 7.0 * 6]


def test_a_failing_server_is_retried_elsewhere_then_taken_out(tmp_path, caplog):
    with FakeServer() as bad, FakeServer() as good:
        bad.state.mode = "fail"

        async def run() -> list[Group]:
            orch = make(
                tmp_path,
                [bad.url, good.url],
                "orchestrator.servers.max_failures=2",
                "max_steps=10",
                "orchestrator.max_inflight=1",
            )
            producer = asyncio.create_task(orch.produce())
            batch, _, _ = await orch.assemble(1)
            await stop(producer)
            assert [s.healthy for s in orch.pool.servers] == [False, True]
            await close(orch)
            return batch

        with caplog.at_level(logging.WARNING, logger="triad.orchestrator"):
            batch = asyncio.run(run())
    assert len(batch) == 4 and bad.state.requests == 2  # then no more requests go there
    (message,) = [r.getMessage() for r in caplog.records if "out of rotation" in r.getMessage()]
    assert bad.url in message and "2 failed requests in a row" in message and "500" in message


def test_tokenize_and_render_requests_are_retried_like_rollouts(tmp_path):
    """A transient failure of /tokenize (a dropped keep-alive connection, a 500) is retried on a
    server; when every attempt fails it is a RolloutFailed (its group is dropped), not a run-ending
    error. It once ended a whole tiny-tools run."""
    with FakeServer() as flaky:
        flaky.state.tokenize_failures = 2

        async def run() -> None:
            orch = make(
                tmp_path,
                [flaky.url],
                "orchestrator.servers.max_retries=3",
                "orchestrator.servers.retry_backoff_s=0",
                "orchestrator.servers.max_failures=9",
            )
            ids, server = await orch.pool.request(lambda s: s.client.tokenize("ab"), "tokenizing")
            assert ids == [97, 98] and server.url == flaky.url and server.failures == 0
            flaky.state.tokenize_failures = 10
            with pytest.raises(RolloutFailed, match="tokenizing failed 4 times; the last error: .*500"):
                await orch.pool.request(lambda s: s.client.tokenize("ab"), "tokenizing")
            await close(orch)

        asyncio.run(run())
    assert flaky.state.tokenize_failures == 6  # 4 attempts of the second request, none more


def test_a_server_that_times_out_is_taken_out(tmp_path, caplog):
    with FakeServer() as slow, FakeServer() as good:
        slow.state.mode = "hang"

        async def run() -> None:
            orch = make(
                tmp_path,
                [slow.url, good.url],
                "orchestrator.servers.max_failures=1",
                "orchestrator.servers.request_timeout_s=0.3",
                "orchestrator.max_inflight=1",
            )
            completions, server, _ = await orch.pool.complete("1+1=", 2)
            assert server.url == good.url and len(completions) == 2
            assert not orch.pool.servers[0].healthy
            await close(orch)

        with caplog.at_level(logging.WARNING, logger="triad.orchestrator"):
            asyncio.run(run())
    assert any("timed out" in r.getMessage() and slow.url in r.getMessage() for r in caplog.records)


def test_when_every_server_fails_the_group_is_dropped_then_the_run_stops(tmp_path):
    with FakeServer() as bad:
        bad.state.mode = "fail"

        async def run() -> None:
            orch = make(
                tmp_path,
                [bad.url],
                "orchestrator.servers.max_failures=2",
                "orchestrator.servers.max_retries=1",
                "orchestrator.servers.ready_timeout_s=0.3",
            )
            with pytest.raises(RolloutFailed, match="failed 2 times.*500"):
                await orch.pool.complete("1+1=", 2)
            with pytest.raises(TriadError, match=f"no inference server healthy for 0.3 s.*{bad.url}.*500"):
                await orch.pool.complete("1+1=", 2)
            await close(orch)

        asyncio.run(run())
    assert bad.state.requests == 2


def test_the_run_stops_after_max_failed_groups_in_a_row_naming_the_last_cause(tmp_path):
    """Every group failing (a server that answers 500 but stays in rotation) used to loop for ever."""
    with FakeServer() as bad:
        bad.state.mode = "fail"

        async def run() -> BaseException:
            orch = make(
                tmp_path,
                [bad.url],
                "orchestrator.max_failed_groups=5",
                "orchestrator.servers.max_retries=0",
                "orchestrator.servers.max_failures=1000",
                "orchestrator.max_inflight=1",
            )
            try:
                async with asyncio.timeout(10):
                    await orch.produce()
            except BaseExceptionGroup as group:
                return first_user_error(group)
            finally:
                await close(orch)
            raise AssertionError("produce() returned")

        error = asyncio.run(run())
    assert isinstance(error, TriadError) and "\n" not in str(error)
    last = "5 groups failed in a row (orchestrator.max_failed_groups); the last, of cause 'server' ("
    assert str(error).startswith(last)
    assert "500" in str(error) and bad.state.requests == 5


def test_a_group_that_succeeds_restarts_the_count_of_failures_in_a_row():
    failures = Failures(limit=3)
    server, reward = RolloutFailed("completion failed"), RolloutFailed("reward raised KeyError", "reward")
    for _ in range(2):
        failures.group_failed(server)
    failures.succeeded()
    failures.group_failed(server)
    failures.group_failed(reward)
    failures.episode_truncated("respond")
    with pytest.raises(
        TriadError, match="^3 groups failed in a row .*; the last, of cause 'reward' .*: reward raised"
    ):
        failures.group_failed(reward)
    assert failures.take() == {  # per step, by cause
        "groups_failed": 5,
        "groups_failed_reward": 2,
        "groups_failed_server": 3,
        "episodes_truncated_respond": 1,
    }
    assert failures.take() == {"groups_failed": 0}


def test_a_server_that_comes_back_is_given_current_weights_before_serving(tmp_path):
    with FakeServer() as fake:

        async def run() -> None:
            orch = make(tmp_path, [fake.url], "orchestrator.servers.health_interval_s=0.05")
            server = orch.pool.servers[0]
            realigned: list[int] = []

            async def realign(s: Server) -> None:
                realigned.append(s.version)
                s.version = s.backend.version = 7

            watcher = asyncio.create_task(watch_health(orch.pool, realign))
            await asyncio.sleep(0.15)  # answers its health checks
            fake.state.healthy = False
            await asyncio.sleep(0.3)
            assert not server.healthy and "its /health answered 503; it last answered " in server.why_out
            assert re.search(r"answered 0 s ago \(at \d\d:\d\d:\d\d UTC\)$", server.why_out)
            server.version = 3  # what it served before it went away
            fake.state.healthy = True
            await asyncio.sleep(0.3)
            assert server.healthy and server.version == 7 and realigned == [3]
            await stop(watcher)
            await close(orch)

        asyncio.run(run())


def test_a_server_whose_health_is_slow_stays_in_while_its_requests_finish(tmp_path, monkeypatch):
    """A busy server's API process can take longer than a probe to answer /health (the chat soak of
    2026-11-27: 100 requests on 2 cores): it stays in rotation while its requests progress (each
    streamed chunk counts, so a generation longer than the bound does too), and is taken out
    once none did for `request_timeout_s`."""
    monkeypatch.setattr(client_module, "HEALTH_TIMEOUT_S", 0.05)
    with FakeServer() as fake:

        async def run() -> None:
            orch = make(
                tmp_path,
                [fake.url],
                "orchestrator.servers.health_interval_s=0.05",
                "orchestrator.servers.request_timeout_s=0.6",
            )
            server = orch.pool.servers[0]

            async def realign(s: Server) -> None:
                pass

            fake.state.health_delay = 0.2
            watcher = asyncio.create_task(watch_health(orch.pool, realign))
            for _ in range(8):  # 0.5 s of slow probes, a request finished every 0.06 s
                await orch.pool.complete("1+1=", 1)
                await asyncio.sleep(0.05)
            assert server.healthy
            fake.state.answer, fake.state.token_delay = "2" * 32, 0.04  # 32 streamed tokens: 1.3 s
            started = time.monotonic()
            await orch.pool.complete("1+1=", 1)
            assert time.monotonic() - started > 1.0 and server.healthy
            await asyncio.sleep(0.9)  # no request progressed for longer than the bound
            assert not server.healthy and "its /health does not answer in 0.05 s" in server.why_out
            await stop(watcher)
            await close(orch)

        asyncio.run(run())


def test_a_version_after_the_checkpoint_held_from_before_is_reloaded_on_connect(tmp_path):
    """After a trainer rewind a server may hold version 3 of the discarded lineage while the
    resumed trainer has published a new version 3 at the same path: the next orchestrator
    keeps only checkpointed versions as they are (it used to keep both)."""

    async def run(checkpoint: int) -> tuple[list[int], int]:
        orch = make(tmp_path / str(checkpoint), ["http://127.0.0.1:9"])
        rundir = RunDir(tmp_path / str(checkpoint))
        for v in (1, 2, 3):
            rundir.weights.write_marker(v, orch.run_id, version=v, files=True)
        rundir.checkpoints.write_marker(checkpoint, orch.run_id)
        server = orch.pool.servers[0]
        server.backend.version, server.backend.path = 3, rundir.weights.relative(3)
        server.version = 3  # as the orchestrator before the rewind left it
        await orch.weights.connect()
        await orch.weights.align(server)  # later (the health watcher): what this orchestrator loaded is kept
        await close(orch)
        return server.backend.loads, server.version

    assert asyncio.run(run(checkpoint=2)) == ([3], 3)
    assert asyncio.run(run(checkpoint=3)) == ([], 3)


class UnreachableBackend(FakeBackend):
    """Answers like the real client while `down`: no connection (a restart, a DNS blip)."""

    down = True

    async def current(self) -> WeightsInfo:
        if self.down:
            raise ServerUnreachable("GET http://inference:8000/admin/weights failed: ConnectError()")
        return await super().current()


def test_a_server_that_does_not_answer_on_connect_is_taken_out_and_realigned_when_back(tmp_path):
    """An orchestrator restarting after a trainer rewind used to stop the run when a server
    did not answer at that moment; the server is taken out and the health watcher gives it
    the run's newest weights once it answers. An answer that is an error still stops the run."""
    with FakeServer() as fake:

        async def run() -> None:
            orch = make(tmp_path, [fake.url], "orchestrator.servers.health_interval_s=0.05")
            rundir = RunDir(tmp_path)
            for v in (1, 2):
                rundir.weights.write_marker(v, orch.run_id, version=v, files=True)
            server = orch.pool.servers[0]
            server.backend = backend = UnreachableBackend()

            async def back_in_rotation() -> bool | None:
                return server.healthy or None

            await orch.weights.connect()
            assert not server.healthy and "ConnectError" in server.why_out and backend.loads == []
            watcher = asyncio.create_task(watch_health(orch.pool, orch.weights.align))
            backend.down = False
            await async_wait_for(back_in_rotation, "the server back in rotation", timeout=10, poll=0.02)
            assert (server.version, backend.loads) == (2, [2])
            await stop(watcher)

            backend.current = refuse  # answers, with an error: not a server to wait for
            with pytest.raises(TriadError, match="answered 500"):
                await orch.weights.connect()
            await close(orch)

        asyncio.run(run())


async def refuse() -> WeightsInfo:
    raise TriadError("GET http://inference:8000/admin/weights answered 500: boom")


def test_the_admin_client_tells_no_answer_from_an_error_answer(tmp_path):
    with FakeServer() as fake:

        async def run() -> None:
            closed = InferenceClient(f"http://127.0.0.1:{free_port()}", None, 5)
            answering = InferenceClient(fake.url, None, 5)
            try:
                with pytest.raises(ServerUnreachable, match="GET http://127.0.0.1:.*/admin/weights failed"):
                    await TriadAdmin(closed, 5).current()
                with pytest.raises(TriadError, match="answered 404") as raised:  # the fake: no admin routes
                    await TriadAdmin(answering, 5).load(1, "some/path")
                assert not isinstance(raised.value, ServerUnreachable)
            finally:
                await closed.close()
                await answering.close()

        asyncio.run(run())


class AnsweringAdmin:
    """The admin routes of a server whose POST /admin/weights answers `serves` once loaded; a
    GET is a test failure (the POST's answer is the served version)."""

    def __init__(self, serves: int) -> None:
        self.serves, self.posts = serves, []

    async def load_weights(self, version: int, path: str, timeout: float) -> WeightsInfo:
        self.posts.append((version, path))
        return WeightsInfo(version=self.serves, path=f"published/v{self.serves}", base_path="base")

    async def weights(self) -> WeightsInfo:
        raise AssertionError("a GET /admin/weights after the POST: a second round trip per version")


def test_a_triad_load_is_checked_against_the_posts_answer_in_one_round_trip():
    client = types.SimpleNamespace(admin=AnsweringAdmin(serves=3), base_url="http://127.0.0.1:8000")
    assert asyncio.run(TriadAdmin(client, 5).load(3, "published/v3")).version == 3
    assert client.admin.posts == [(3, "published/v3")]


def test_a_server_that_answers_another_version_than_it_was_told_to_load_stops_the_load():
    client = types.SimpleNamespace(admin=AnsweringAdmin(serves=2), base_url="http://127.0.0.1:8000")
    told = "was told to load version 3 but serves version 2 from 'published/v2'"
    with pytest.raises(TriadError, match=told):
        asyncio.run(TriadAdmin(client, 5).load(3, "published/v3"))
    assert client.admin.posts == [(3, "published/v3")]


def test_a_group_that_went_stale_in_the_queue_is_dropped_and_counted(tmp_path):
    """Groups made by version 0 wait in the queue while the trainer moves on: batch 4 drops them."""
    with FakeServer() as fake:

        async def run() -> tuple[list[Group], int, int]:
            orch = make(
                tmp_path, [fake.url], "max_async_level=1", "max_steps=10", "orchestrator.max_inflight=3"
            )
            orch.step = 4  # as if batches 1-3 were taken; their groups were generated at version 0
            orch.pending = 3
            for _ in range(3):
                await orch.generate_group(orch.draws.draw())
            set_version(orch, 3)  # the bound for batch 4 is version 2
            producer = asyncio.create_task(orch.produce())
            out = await orch.assemble(4)
            await stop(producer)
            await close(orch)
            return out

        batch, dropped, _ = asyncio.run(run())
    assert [g.version for g in batch] == [3, 3, 3, 3] and dropped == 3 * 2


def samples(rewards: list[float], version: int = 0) -> list[Sample]:
    out = []
    for r in rewards:
        s = single_turn(Completion([1, 2], [3], [-0.5], "x", False), version, "http://a")
        s.reward = r
        out.append(s)
    return out


def test_dynamic_sampling_skips_equal_reward_groups(tmp_path):
    sets = ("orchestrator.shaping.dynamic_sampling=true", "orchestrator.batch_size=2")
    orch = make(tmp_path, ["http://127.0.0.1:9"], *sets)

    async def run():
        for rewards in ([1, 1], [0, 1], [0, 0], [1, 0]):
            orch.pending += 1
            await orch.queue.put(Group("g", Prompt("1+1=", "2"), samples(rewards)))
        return await orch.assemble(1)

    batch, dropped, filtered = asyncio.run(run())
    assert [g.rewards for g in batch] == [[0, 1], [1, 0]] and filtered == 2 and dropped == 0


def test_overlong_mask_and_penalty(tmp_path):
    long = Sample(
        input_ids=[1] * 10,
        loss_mask=[False] * 2 + [True] * 8,
        logprobs=[0.0] * 10,
        truncated=True,
        reward=1.0,
    )
    short = Sample(input_ids=[1] * 4, loss_mask=[False] * 2 + [True] * 2, logprobs=[0.0] * 4, reward=1.0)
    group = Group("g", Prompt("p", "a"), [long, short])
    mask = 'orchestrator.shaping.overlong="mask"'
    masked = make(tmp_path, ["http://127.0.0.1:9"], mask).builder.rows(1, [group])
    assert masked[0]["loss_mask"] == [False] * 10 and masked[1]["loss_mask"] == short.loss_mask
    penalised = make(
        tmp_path,
        ["http://127.0.0.1:9"],
        'orchestrator.shaping.overlong="penalty"',
        "orchestrator.sampling.max_tokens=8",
        "orchestrator.shaping.overlong_buffer=4",
    )
    penalised = penalised.builder.rows(1, [group])
    assert [r["reward"] for r in penalised] == [0.0, 1.0]  # 8 tokens: the full penalty of 1
    assert penalised[0]["advantage"] < 0 < penalised[1]["advantage"]


def test_published_batch_has_advantages_versions_and_marker(tmp_path):
    orch = make(tmp_path, ["http://127.0.0.1:9"], "max_async_level=1", "max_steps=10")
    group = Group("g", Prompt("1+1=", "2"), samples([1.0, 0.0], version=3))
    publish_batch(orch.rundir, orch.run_id, 4, orch.builder.rows(4, [group]), orch.oc.sampling.temperature)
    table = pq.read_table(RunDir(tmp_path).batch_file(4)).to_pylist()
    assert [r["advantage"] for r in table] == pytest.approx([1.0, -1.0], abs=1e-5)  # grpo on rewards 1, 0
    assert table[0]["input_ids"] == [1, 2, 3] and table[0]["loss_mask"] == [False, False, True]
    assert table[0]["logprobs"] == pytest.approx([0.0, 0.0, -0.5])
    marker = RunDir(tmp_path).rollouts.marker(4, orch.run_id)
    assert marker.min_policy_version == 3 and marker.samples == 2 and marker.temperature == 1.0


def test_resumes_after_the_newest_batch(tmp_path):
    orch = make(tmp_path, ["http://127.0.0.1:9"])
    rows = orch.builder.rows(1, [Group("g", Prompt("1+1=", "2"), samples([1.0]), 2)])
    position = {"next": 6, "open": [3, 5]}  # draws 3 and 5 were in flight when batch 1 was written
    publish_batch(
        orch.rundir, orch.run_id, 1, rows, orch.oc.sampling.temperature, draws=position, prompt_draws=[2]
    )
    for step in (1, 2):  # killed after logging step 2, before its batch's DONE
        orch.metrics.log(step, reward_mean=0.5)
    again = make(tmp_path, ["http://127.0.0.1:9"])
    assert again.first_step == 2 and again.step == 2
    assert [r["step"] for r in again.rundir.metrics.rows("orchestrator")] == [1]
    assert [again.draws.draw().number for _ in range(3)] == [3, 5, 6]  # those in flight first, then on


def test_weights_stall_counts_only_time_stalled_on_weights(tmp_path):
    """Generation time is not waiting for the trainer: the clock starts when nothing else is left
    (and here no trainer ever published a heartbeat)."""
    with FakeServer() as fake:
        fake.state.delay = 0.6

        async def run() -> float:
            orch = make(
                tmp_path,
                [fake.url],
                "max_async_level=0",
                "max_steps=10",
                "orchestrator.weights_stall_s=0.4",
            )
            producer = asyncio.create_task(orch.produce())
            await orch.assemble(1)  # its groups took 0.6 s, longer than the weights timeout
            done = asyncio.get_running_loop().time()
            with pytest.raises(ExceptionGroup) as caught:  # raised inside the producer's TaskGroup
                await producer
            (timeout,) = caught.value.subgroup(WaitTimeout).exceptions
            assert str(timeout).startswith("no heartbeat from the trainer in ")
            assert orch.rundir.weights.describe_marker(1) in str(timeout)
            waited = asyncio.get_running_loop().time() - done
            await close(orch)
            return waited

        waited = asyncio.run(run())
    assert 0.35 < waited < 1.5


def test_a_slow_trainer_that_makes_progress_is_waited_for_a_killed_one_is_named(tmp_path):
    """Weights that take longer than the stall bound come while the trainer makes progress;
    after a kill -9 of the trainer the producer stops within the bound, naming it."""
    with FakeServer() as fake, peer_process(tmp_path, TRAINER) as trainer:

        async def run() -> tuple[float, BaseException]:
            sets = ("max_async_level=0", "max_steps=10", "orchestrator.weights_stall_s=1")
            orch = make(tmp_path, [fake.url], *sets)
            producer = asyncio.create_task(orch.produce())
            await orch.assemble(1)
            await asyncio.sleep(3)  # stalled on weights for three times the bound
            assert not producer.done()
            set_version(orch, 1)
            await orch.notify()
            await orch.assemble(2)
            trainer.send_signal(signal.SIGKILL)
            killed = asyncio.get_running_loop().time()
            with pytest.raises(ExceptionGroup) as caught:
                await producer
            waited = asyncio.get_running_loop().time() - killed
            await close(orch)
            (stalled,) = caught.value.subgroup(WaitTimeout).exceptions
            return waited, stalled

        waited, stalled = asyncio.run(run())
    assert 1 < waited < 3
    assert str(stalled).startswith(f"the trainer (host {os.uname().nodename}, pid {trainer.pid}, renewed ")
    assert "made no progress for 1 s; its last: phase rolling out, samples_finished " in str(stalled)
    assert "(orchestrator.weights_stall_s); waited for " in str(stalled)


def test_frozen_backend_paces_rollouts_by_the_trainer_and_skips_the_staleness_drop(tmp_path):
    from orchestrator.servers.backends.frozen import Frozen

    orch = make(tmp_path, ["http://127.0.0.1:9"], "max_async_level=0", "max_steps=10")
    orch.pool.servers[0].backend = Frozen()
    orch2 = Orchestrator(orch.cfg, orch.run_id, orch.pool, orch.env)
    assert orch2.weights.frozen and orch2.weights.served_version == 0
    orch2.weights.trainer_version = 5
    assert orch2.weights.served_version == 5
    old = Group("g", Prompt("1+1=", "2"), samples([1.0, 0.0], version=0))
    assert orch2.accepts(old, step=9, filtered=0) is None


PUBLISHED = {"model.embed_tokens.weight": "aa", "model.norm.weight": "bb"}
FLIPPED = {"model.embed_tokens.weight": "aa", "model.norm.weight": "b0"}


def publish_with_digests(orch: Orchestrator, version: int, files: bool = True) -> None:
    RunDir(orch.cfg.run_dir).weights.write_marker(
        version,
        orch.run_id,
        version=version,
        files=files,
        digest=version_digest(PUBLISHED),
        tensor_digests=PUBLISHED,
    )


@pytest.mark.parametrize(
    ("reported", "loads", "error"),
    [
        ([PUBLISHED], [1], None),  # verified at once
        ([FLIPPED, PUBLISHED], [1, 1], None),  # a bad read, then good: loaded once more
        ([FLIPPED, FLIPPED], [1, 1], "serves version 1 from .* also after a reload: .*'model.norm.weight'"),
        ([None], [1], None),  # a backend that reports none (SGLang): not verifiable, logged
    ],
)
def test_a_load_is_checked_against_the_published_digests(tmp_path, reported, loads, error):
    async def run() -> None:
        orch = make(tmp_path, ["http://127.0.0.1:9"])
        publish_with_digests(orch, 1)
        server = orch.pool.servers[0]
        server.backend.digests = list(reported)
        try:
            if error is None:
                await orch.weights.load(server, 1)
                assert server.version == 1 and server.healthy
            else:
                with pytest.raises(DigestMismatch, match=f"http://127.0.0.1:9 {error}"):
                    await orch.weights.load(server, 1)
            assert server.backend.loads == loads
        finally:
            await close(orch)

    asyncio.run(run())


@pytest.mark.parametrize("files", [False, True])
def test_a_broadcast_version_with_other_bytes_stops_or_reloads_from_files(tmp_path, files):
    async def run() -> None:
        orch = make(tmp_path, ["http://127.0.0.1:9"])
        publish_with_digests(orch, 1, files=files)
        server = orch.pool.servers[0]
        server.version = server.backend.version = 1  # as a broadcast receive leaves it
        server.backend.loaded, server.backend.digests = FLIPPED, [PUBLISHED]
        try:
            if files:  # a checkpointed version also has files: reloaded from them, then verified
                await orch.weights.check_received(server, 1, files)
                assert server.backend.loads == [1]
            else:
                named = (
                    "no files to reload: first differing tensor 'model.norm.weight' \\(published bb, loaded"
                )
                with pytest.raises(DigestMismatch, match=named):
                    await orch.weights.check_received(server, 1, files)
                assert server.backend.loads == []
        finally:
            await close(orch)

    asyncio.run(run())


def test_a_server_that_does_not_answer_the_broadcast_check_is_taken_out_unchecked(tmp_path):
    async def run() -> None:
        orch = make(tmp_path, ["http://127.0.0.1:9"])
        publish_with_digests(orch, 1, files=False)
        server = orch.pool.servers[0]
        server.backend = UnreachableBackend()
        server.version = 1  # as a broadcast receive leaves it
        await orch.weights.check_received(server, 1, files=False)
        assert (server.healthy, server.version) == (False, -1) and "check version 1" in server.why_out
        await close(orch)

    asyncio.run(run())


def test_the_follower_reads_a_new_versions_marker_once_on_its_way_to_the_servers(tmp_path):
    """Finding a version and checking each server's load share one read of its marker: in an
    object store each read is a round trip in the hand-off (there were three, one more for every
    server), and the loaded bytes are still compared with the trainer's digests."""

    async def run() -> None:
        orch = make(tmp_path, ["http://127.0.0.1:9", "http://127.0.0.1:10"])
        store = orch.rundir.store
        reads: list[str] = []
        read_bytes = store.read_bytes

        def counted(key: str) -> bytes:
            reads.append(key)
            return read_bytes(key)

        store.read_bytes = counted
        done_2 = orch.rundir.weights.key(2, RunDir.marker_name())
        reads_when_loaded: list[int] = []

        class Counting(FakeBackend):
            async def load(self, version: int, path: str) -> WeightsInfo:
                reads_when_loaded.append(reads.count(done_2))
                return await super().load(version, path)

        for server in orch.pool.servers:
            server.backend = Counting()
            server.backend.digests = [FLIPPED, PUBLISHED]  # a bad read first: checked, loaded again
        following = asyncio.create_task(orch.weights.follow())
        try:
            publish_with_digests(orch, 2)
            async with asyncio.timeout(10):
                while orch.weights.served_version < 2:
                    await asyncio.sleep(0.01)
        finally:
            await stop(following)
            await close(orch)
        assert reads_when_loaded == [1, 1, 1, 1]  # two servers, each loaded twice
        assert [s.backend.loads for s in orch.pool.servers] == [[2, 2], [2, 2]]

    asyncio.run(run())


def test_rollouts_of_a_new_version_may_start_before_the_pruning_it_allows(tmp_path):
    """The producer is told of a version as soon as the servers serve it; the batches it lets go
    are pruned after (in an object store the pruning's marker reads and removals took 0.5-1 s a
    version from moto, all of it between the load and the next rollouts)."""
    events: list[str] = []

    async def run() -> None:
        orch = make(tmp_path, ["http://127.0.0.1:9"])

        async def changed() -> None:
            events.append("producer told")

        def prune(version: int) -> None:
            time.sleep(0.2)
            events.append(f"pruned up to {version}")

        orch.weights.on_change, orch.weights.on_version = changed, prune
        following = asyncio.create_task(orch.weights.follow())
        try:
            publish_with_digests(orch, 1)
            async with asyncio.timeout(10):
                while len(events) < 2:
                    await asyncio.sleep(0.01)
        finally:
            await stop(following)
            await close(orch)

    asyncio.run(run())
    assert events == ["producer told", "pruned up to 1"]


STORE_CALL_S = 1.0


def test_slow_store_calls_do_not_stall_the_event_loop(tmp_path):
    """Marker polls, batch and metrics writes go through threads: with every store call taking
    STORE_CALL_S, the event loop (generation, health checks) still runs every few milliseconds.
    A store call on the loop would hold it for STORE_CALL_S; the bound on the longest gap is half
    of that, well above what a busy machine's scheduling adds (0.15 s was seen under load)."""

    async def run() -> None:
        orch = make(tmp_path, ["http://127.0.0.1:9"], "max_steps=10")
        store = orch.rundir.store
        for name in ("children", "read_bytes", "exists", "append", "write_bytes"):
            fast = getattr(store, name)

            def slow(*args, _fast=fast, **kwargs):
                time.sleep(STORE_CALL_S)
                return _fast(*args, **kwargs)

            setattr(store, name, slow)
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        following = asyncio.create_task(orch.weights.follow())
        await asyncio.sleep(0.05)  # the ticker runs before the step: a stall in it is a gap
        group = Group("g", Prompt("1+1=", "2"), samples([1.0, 0.0]))
        await orch.finish_step(1, [group], 0, 0, time.monotonic() - 1.0, time.monotonic())
        await asyncio.sleep(2 * STORE_CALL_S)  # a few slow polls of weights/
        await stop(following)
        await stop(ticking)
        await close(orch)
        assert RunDir(tmp_path).rollouts.marker(1, orch.run_id) is not None
        assert len(gaps) > 50 and max(gaps) < STORE_CALL_S / 2, max(gaps)

    asyncio.run(run())


def test_a_cancelled_batch_write_finishes_before_the_cancellation_reaches_the_run():
    """A rewound run discards the batches after the checkpoint only once no write is in flight
    (before, the discard raced the abandoned thread: a killed-trainer test saw a marker vanish
    under it, and a batch written after the discard would have survived it)."""
    events: list[str] = []

    def write() -> str:
        time.sleep(0.3)
        events.append("written")
        return "batch"

    async def main() -> None:
        task = asyncio.create_task(to_thread_to_completion(write))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        events.append("cancelled")
        assert await to_thread_to_completion(write) == "batch"

    asyncio.run(main())
    assert events == ["written", "cancelled", "written"]


def test_with_no_server_healthy_to_load_the_last_version_the_run_stops_naming_it(tmp_path):
    """After the last batch the orchestrator waits for the servers to serve the trainer's last
    version; once the trainer has published it and the only server is out, the wait is on that
    server and ends as a wait for a server does, naming it."""

    async def run() -> tuple[float, TriadError]:
        sets = ("max_steps=3", "orchestrator.servers.ready_timeout_s=1")
        orch = make(tmp_path, ["http://127.0.0.1:9"], *sets)
        server = orch.pool.servers[0]
        server.version = 2
        orch.pool.take_out(server, "connection refused")
        orch.weights.trainer_version = 3
        started = asyncio.get_running_loop().time()
        with pytest.raises(TriadError) as caught:
            await asyncio.wait_for(orch.weights.wait_for_version(3), 10)
        waited = asyncio.get_running_loop().time() - started
        await close(orch)
        return waited, caught.value

    waited, error = asyncio.run(run())
    assert 1 <= waited < 3
    assert str(error) == (
        "no inference server healthy for 1 s "
        "(http://127.0.0.1:9: connection refused; it has not answered yet)"
    )


def test_a_guard_held_while_no_server_can_load_published_weights_names_the_servers_not_the_trainer(tmp_path):
    """The η guard holds the producer for version 1, which the trainer has published; the only
    server is out: the run stops within `servers.ready_timeout_s` (and a wake-up) naming the
    server, not after `weights_stall_s` blaming a trainer that did its part."""
    with FakeServer() as fake:

        async def run() -> tuple[float, BaseException]:
            sets = (
                "max_async_level=0",
                "max_steps=10",
                "orchestrator.servers.ready_timeout_s=1",
                "orchestrator.weights_stall_s=600",
            )
            orch = make(tmp_path, [fake.url], *sets)
            producer = asyncio.create_task(orch.produce())
            await orch.assemble(1)
            orch.pool.take_out(orch.pool.servers[0], "/health did not answer")
            orch.weights.trainer_version = 1
            started = asyncio.get_running_loop().time()
            with pytest.raises(ExceptionGroup) as caught:
                await asyncio.wait_for(producer, 30)
            waited = asyncio.get_running_loop().time() - started
            await close(orch)
            (error,) = caught.value.subgroup(TriadError).exceptions
            return waited, error

        waited, error = asyncio.run(run())
    assert 1 <= waited < 5
    assert str(error).startswith(f"no inference server healthy for 1 s ({fake.url}: /health did not answer; ")


def test_the_no_healthy_server_clock_restarts_when_a_server_comes_back(tmp_path):
    """A wait on the servers starts the clock when it first finds none healthy; a server that
    comes back (through the health watcher, with no such wait polling meanwhile) restarts it, so
    a later outage is given its whole `servers.ready_timeout_s`, not the rest of an old one."""
    with FakeServer() as fake:

        async def run() -> None:
            sets = ("orchestrator.servers.health_interval_s=0.05", "orchestrator.servers.ready_timeout_s=0.5")
            orch = make(tmp_path, [fake.url], *sets)
            server = orch.pool.servers[0]

            async def realign(s: Server) -> None:
                return None

            orch.pool.take_out(server, "connection refused")
            orch.pool.check_some_healthy()  # the clock starts
            watcher = asyncio.create_task(watch_health(orch.pool, realign))
            await asyncio.sleep(0.6)  # back, and up longer than the bound
            assert server.healthy
            await stop(watcher)
            orch.pool.take_out(server, "connection refused")
            orch.pool.check_some_healthy()  # a new outage: its own clock
            await asyncio.sleep(0.1)
            orch.pool.check_some_healthy()  # 0.1 s into it: no error
            await asyncio.sleep(0.5)
            with pytest.raises(TriadError, match=r"^no inference server healthy for 0.5 s "):
                orch.pool.check_some_healthy()
            await close(orch)

        asyncio.run(run())
