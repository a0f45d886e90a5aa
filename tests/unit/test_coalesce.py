"""First rollout requests asked for together share one HTTP request: the waiting room
(`orchestrator/servers/coalesce.py`) and the pool's use of it against the fake vLLM server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.calls import RequestRejected
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.coalesce import Coalescer
from orchestrator.servers.pool import Server, ServerPool
from shared.config import load_config
from tests.fake_openai import FakeServer, encode

T = TypeVar("T")


class Recorder:
    """A `send` that records each call's key and items and answers each item doubled."""

    def __init__(self, parts: int = 1) -> None:
        self.calls: list[tuple[object, list[int]]] = []
        self.parts = parts
        self.coalescer: Coalescer[str, int, int] = Coalescer(self.send, lambda: self.parts)

    async def send(self, key: object, items: list[int]) -> list[int | BaseException]:
        self.calls.append((key, items))
        await asyncio.sleep(0.01)
        return [ValueError(f"item {i}") if i < 0 else 2 * i for i in items]


def test_items_asked_in_one_turn_go_together_by_key():
    async def run() -> tuple[list, list]:
        r = Recorder()
        asks = [r.coalescer.ask("a", 1), r.coalescer.ask("b", 2), r.coalescer.ask("a", 3)]
        answers = await asyncio.gather(*asks)
        later = await r.coalescer.ask("a", 4)  # a later turn: a call of its own
        return r.calls, [*answers, later]

    calls, answers = asyncio.run(run())
    assert calls == [("a", [1, 3]), ("b", [2]), ("a", [4])]
    assert answers == [2, 4, 6, 8]


def test_items_are_split_into_parts_and_each_items_own_failure_is_its_own():
    async def run() -> tuple[list, list]:
        r = Recorder(parts=2)
        answers = await asyncio.gather(
            *(r.coalescer.ask("k", i) for i in (1, -2, 3, 4, 5)), return_exceptions=True
        )
        return r.calls, answers

    calls, answers = asyncio.run(run())
    assert calls == [("k", [1, 3, 5]), ("k", [-2, 4])]
    assert answers[0] == 2 and answers[2:] == [6, 8, 10]
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "item -2"


def test_a_send_that_raises_fails_every_item_of_its_list():
    async def send(key: object, items: list[int]) -> list[int | BaseException]:
        raise RuntimeError("server gone")

    async def run() -> list:
        c: Coalescer[str, int, int] = Coalescer(send, lambda: 1)
        return await asyncio.gather(c.ask("k", 1), c.ask("k", 2), return_exceptions=True)

    answers = asyncio.run(run())
    assert [str(a) for a in answers] == ["server gone", "server gone"]


def test_a_cancelled_caller_leaves_the_others_and_a_list_nobody_waits_for_is_cancelled():
    started, finished = [], []

    async def send(key: object, items: list[int]) -> list[int | BaseException]:
        started.append(items)
        await asyncio.sleep(0.2)
        finished.append(items)
        return list(items)

    async def run() -> int:
        c: Coalescer[str, int, int] = Coalescer(send, lambda: 1)
        one, two = asyncio.ensure_future(c.ask("k", 1)), asyncio.ensure_future(c.ask("k", 2))
        await asyncio.sleep(0.05)
        one.cancel()
        kept = await two  # the other caller's answer still comes
        alone = asyncio.ensure_future(c.ask("k", 3))
        await asyncio.sleep(0.05)
        alone.cancel()
        await asyncio.sleep(0.3)
        assert not c.sending  # its send was cancelled with it
        return kept

    assert asyncio.run(run()) == 2
    assert started == [[1, 2], [3]] and finished == [[1, 2]]


def on_pool(urls: list[str], body: Callable[[ServerPool], Awaitable[T]]) -> T:
    """`body` run against a pool of the servers at `urls`, each ready (its /v1/models read)."""
    cfg = load_config(
        None, ["orchestrator.sampling.max_tokens=4", "orchestrator.servers.retry_backoff_s=0.01"]
    )

    async def run() -> T:
        clients = [InferenceClient(url, None, 10) for url in urls]
        try:
            for client in clients:
                await client.wait_ready(10, None)
            return await body(ServerPool([Server(c, Frozen()) for c in clients], cfg.orchestrator))
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    return asyncio.run(run())


def test_a_batch_of_first_requests_is_one_request_and_each_prompt_gets_its_own_samples():
    prompts = ["1+1=", "2+2=", "3+3="]
    with FakeServer() as fake:
        answers = on_pool([fake.url], lambda pool: asyncio.gather(*(pool.complete(p, 2) for p in prompts)))
    assert fake.state.requests == 1 and fake.state.prompts == 3
    for prompt, (completions, _, version) in zip(prompts, answers, strict=True):
        assert [c.prompt_ids for c in completions] == [encode(prompt)] * 2 and version == 0


def test_requests_that_differ_in_sampling_or_prefer_a_server_are_not_coalesced():
    async def body(pool: ServerPool) -> None:
        (server,) = pool.servers
        await asyncio.gather(
            pool.complete("1+1=", 2, seed=1),
            pool.complete("2+2=", 2, seed=2),
            pool.complete("3+3=", 2, max_tokens=3),
            pool.complete("4+4=", 1),
            pool.complete("5+5=", 2, prefer=server),
        )

    with FakeServer() as fake:
        on_pool([fake.url], body)
    assert fake.state.requests == 5 and sorted(fake.state.max_tokens_asked) == [3, 4, 4, 4, 4]


def test_two_servers_each_get_one_request_with_half_the_prompts():
    with FakeServer() as a, FakeServer() as b:
        on_pool([a.url, b.url], lambda pool: asyncio.gather(*(pool.complete(f"{i}+1=", 2) for i in range(6))))
    assert (a.state.requests, a.state.prompts, b.state.requests, b.state.prompts) == (1, 3, 1, 3)


def test_a_refused_batch_is_asked_prompt_by_prompt_so_only_the_long_one_fails():
    """vLLM refuses a whole request for one prompt over its context; the fake does too."""
    prompts = ["1+1=", "x" * 40, "2+2="]

    async def body(pool: ServerPool) -> tuple[list, dict]:
        answers = await asyncio.gather(*(pool.complete(p, 2) for p in prompts), return_exceptions=True)
        return answers, pool.take_requests()

    with FakeServer() as fake:
        fake.state.max_model_len = 24
        answers, counts = on_pool([fake.url], body)
    assert isinstance(answers[1], RequestRejected) and "maximum context length" in str(answers[1])
    assert [c.prompt_ids for c in answers[0][0]] == [encode("1+1=")] * 2
    assert [c.prompt_ids for c in answers[2][0]] == [encode("2+2=")] * 2
    assert fake.state.requests == 4  # the batch, then each prompt alone
    assert counts["requests_failed_http_400"] == 2  # the batch's refusal and the long prompt's


def test_a_failed_batch_counts_once_and_is_retried_whole():
    async def body(pool: ServerPool) -> tuple[list, dict]:
        answers = await asyncio.gather(*(pool.complete(f"{i}+1=", 2) for i in range(4)))
        return answers, pool.take_requests()

    with FakeServer() as fake:
        fake.state.spoiled_route, fake.state.busy = "/v1/completions", [(500, None)]  # the first answers 500
        answers, counts = on_pool([fake.url], body)
    assert all(len(completions) == 2 for completions, _, _ in answers) and len(answers) == 4
    assert counts["requests_failed"] == 1 and counts["requests_failed_http_500"] == 1
    assert fake.state.requests == 2 and fake.state.prompts == 4  # the 500 came before its prompts were read


@pytest.mark.parametrize("prompts", [[[49, 43, 49, 61]], [[49, 43], [50, 43]]])
def test_token_id_prompts_coalesce_as_lists_of_lists(prompts):
    with FakeServer() as fake:
        answers = on_pool([fake.url], lambda pool: asyncio.gather(*(pool.complete(p, 1) for p in prompts)))
    assert fake.state.requests == 1 and [a[0][0].prompt_ids for a in answers] == prompts


def test_prompts_a_server_leaves_unequal_room_ask_alone_each_with_its_own_room():
    """One request shares one max_tokens. A server with less context than when the prompts were
    grouped (one that joined since, or took a retry) must not cut every prompt to the shortest room."""
    short, long = [49, 43, 49, 61], [49] * 10  # room 4 and 2 in a context of 12

    async def body(pool: ServerPool) -> list:
        return await pool.complete_many([short, long], 1, None, 4, None)

    with FakeServer() as fake:
        fake.state.max_model_len = 12
        answers = on_pool([fake.url], body)
    assert fake.state.requests == 2 and sorted(fake.state.max_tokens_asked) == [2, 4]
    assert [a[0][0].prompt_ids for a in answers] == [short, long]
