"""Episodes against a fake OpenAI server: a conversation that outgrows the model's context, tool
results capped, and the agent proxy's failures, ids and exposure (issue 32, items 4, 5 and 7)."""

from __future__ import annotations

import asyncio
import socket
import time

import openai
import pytest

from orchestrator.environments import Prompt
from orchestrator.episodes.agent_proxy import AgentProxy
from orchestrator.episodes.agents import AgentRollouts, EpisodeRecorder
from orchestrator.episodes.text import TextRollouts
from orchestrator.episodes.tool_calls import ParsedTurn, ToolCall
from orchestrator.episodes.tools import ToolRunner
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import RolloutFailed, Server, ServerPool
from shared.config import load_config
from shared.errors import TriadError
from shared.net import free_port
from tests.fake_openai import FakeServer

REPLY = "x" * 30


class Chatty:
    """A multi-turn text environment whose every reply is 30 ids long."""

    name = "chatty"
    max_turns = 5

    def sample(self, rng):
        return Prompt(text="1+1=", answer="2")

    def reward(self, prompt, completion):
        return 1.0

    def respond(self, prompt, completion):
        return REPLY


def pool_of(fake: FakeServer, *sets: str) -> tuple[ServerPool, InferenceClient]:
    cfg = load_config(
        None, ["orchestrator.sampling.max_tokens=32", "orchestrator.servers.max_retries=0", *sets]
    )
    client = InferenceClient(fake.url, None, 10)
    return ServerPool([Server(client, Frozen())], cfg.orchestrator), client


def test_a_conversation_that_outgrows_the_context_ends_truncated_and_max_tokens_is_clamped():
    with FakeServer() as fake:
        fake.state.max_model_len = 40

        async def run():
            pool, client = pool_of(fake)
            await client.wait_ready(10, None)
            try:
                return await TextRollouts(Chatty(), pool, pool.oc).group(Chatty().sample(None), 1)
            finally:
                await client.close()

        (sample,) = asyncio.run(run())
    # 4 ids of prompt + "2", 30 of reply: the second turn may sample 40 - 35 = 5; the third has no room
    assert fake.state.max_tokens_asked == [32, 5]
    assert sample.truncated and sample.turns == 2
    assert len(sample.input_ids) == 4 + 1 + 30 + 1 + 30


def test_a_prompt_over_the_context_drops_its_group_not_the_run():
    with FakeServer() as fake:
        fake.state.max_model_len = 3

        async def run():
            pool, client = pool_of(fake)
            await client.wait_ready(10, None)
            try:
                await TextRollouts(Chatty(), pool, pool.oc).group(Chatty().sample(None), 1)
            finally:
                await client.close()

        refused = "chatty': .* rejected a rollout request: .*maximum context length is 3"
        with pytest.raises(RolloutFailed, match=refused) as e:
            asyncio.run(run())
    assert e.value.cause == "generate"


def test_a_tool_result_is_capped_and_says_so():
    def big() -> str:
        """A big result."""
        return "y" * 100

    turn = ParsedTurn("", [ToolCall("c", "big", {})])
    (message,) = asyncio.run(ToolRunner([big], 5, max_result_chars=10).run_turn(turn))
    assert message["content"] == "y" * 10 + "... [90 characters cut]"


class Agent:
    """Two calls per episode through the proxy; the episode fails if a call does."""

    name = "agent"

    def __init__(self) -> None:
        self.errors: list[Exception] = []

    def sample(self, rng):
        return Prompt(text="1+1=", answer="2")

    async def run_agent(self, prompt, base_url, model):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)
        messages = [{"role": "user", "content": prompt.text}]
        try:
            for _ in range(2):
                reply = await client.chat.completions.create(model=model, messages=messages)
                message = reply.choices[0].message.model_dump(exclude_none=True)
                messages += [message, {"role": "user", "content": "?"}]
        except openai.APIStatusError as e:
            self.errors.append(e)
            raise
        finally:
            await client.close()

    def reward(self, prompt, episode):
        return 1.0


def agent_group(fake: FakeServer, agent: Agent, *sets: str):
    async def run():
        pool, client = pool_of(fake, *sets)
        await client.wait_ready(10, None)
        rollouts = AgentRollouts(agent, pool, pool.oc, "auto")
        await rollouts.start(agent.sample(None))
        try:
            return await rollouts.group(agent.sample(None), 1)
        finally:
            await rollouts.stop()
            await client.close()

    return asyncio.run(run())


def test_an_agent_episode_whose_call_failed_on_the_server_is_not_trained():
    with FakeServer() as fake:
        fake.state.fail_after = 1  # the first call is answered, the second fails (a 502 to the agent)
        agent = Agent()
        with pytest.raises(RolloutFailed, match="an agent episode's call failed"):
            agent_group(fake, agent)
    assert [e.status_code for e in agent.errors] == [502]


def test_a_request_the_server_refuses_reaches_the_agent_as_a_400_and_the_episode_counts():
    with FakeServer() as fake:
        fake.state.max_model_len = 30  # the first call fits; the second call's conversation does not
        agent = Agent()
        (sample,) = agent_group(fake, agent)
    assert [e.status_code for e in agent.errors] == [400]  # as vLLM, the fake's render refuses it first
    assert "render answered 400: " in str(agent.errors[0]) and "maximum context length is 30" in str(
        agent.errors[0]
    )
    assert sample.turns == 1 and sample.reward == 1.0


def test_episode_ids_are_unguessable():
    cfg = load_config(None, [])
    proxy = AgentProxy(cfg.orchestrator)
    ids = {proxy.open(EpisodeRecorder(None, cfg.orchestrator, "auto")) for _ in range(50)}
    assert len(ids) == 50 and all(len(i) >= 20 for i in ids)


def test_a_proxy_port_in_use_is_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        port = holder.getsockname()[1]
        proxy = AgentProxy(load_config(None, [f"orchestrator.agents.proxy_port={port}"]).orchestrator)
        with pytest.raises(TriadError) as e:
            asyncio.run(proxy.start())
    held = "[Errno 98] Address already in use"
    assert str(e.value) == f"orchestrator.agents.proxy_port: cannot listen on 127.0.0.1:{port}: {held}"


def test_a_proxy_off_loopback_needs_a_token_and_then_asks_for_it():
    with pytest.raises(TriadError, match="not loopback.*no orchestrator.agents.proxy_token"):
        AgentProxy(load_config(None, ["orchestrator.agents.proxy_host=0.0.0.0"]).orchestrator)
    cfg = load_config(None, ["orchestrator.agents.proxy_token=s3cret"])
    proxy = AgentProxy(cfg.orchestrator)

    async def run():
        await proxy.start()
        try:
            episode = proxy.open(EpisodeRecorder(None, cfg.orchestrator, "auto"))
            url = proxy.base_url(episode)
            wrong = openai.AsyncOpenAI(base_url=url, api_key="nope", max_retries=0, timeout=10)
            with pytest.raises(openai.AuthenticationError):
                await wrong.models.list()
            right = openai.AsyncOpenAI(base_url=url, api_key="s3cret", max_retries=0, timeout=10)
            assert [m.id for m in (await right.models.list()).data] == ["model"]
        finally:
            await proxy.stop()

    asyncio.run(run())


def pools_of(*fakes: FakeServer, sets: tuple[str, ...] = ()) -> tuple[ServerPool, list[InferenceClient]]:
    cfg = load_config(
        None, ["orchestrator.sampling.max_tokens=32", "orchestrator.servers.max_retries=0", *sets]
    )
    clients = [InferenceClient(fake.url, None, 10) for fake in fakes]
    return ServerPool([Server(c, Frozen()) for c in clients], cfg.orchestrator), clients


def run_group(agent, size: int, *fakes: FakeServer, sets: tuple[str, ...] = ()):
    """`size` episodes of the agent through a proxy against the fakes: the samples, or the error."""

    async def run():
        pool, clients = pools_of(*fakes, sets=sets)
        for client in clients:
            await client.wait_ready(10, None)
        rollouts = AgentRollouts(agent, pool, pool.oc, "auto")
        await rollouts.start(agent.sample(None))
        try:
            return await rollouts.group(agent.sample(None), size)
        finally:
            await rollouts.stop()
            for client in clients:
                await client.close()

    return asyncio.run(run())


class KeyedAgent(Agent):
    """Two calls per episode with the api_key it is given."""

    async def run_agent(self, prompt, base_url, model, api_key):
        self.keys = [*getattr(self, "keys", []), api_key]
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=10)
        try:
            for _ in range(2):
                await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "1+1="}]
                )
        finally:
            await client.close()


def test_the_proxy_token_reaches_the_agent_as_its_api_key():
    agent = KeyedAgent()
    with FakeServer() as fake:
        samples = run_group(agent, 2, fake, sets=("orchestrator.agents.proxy_token=s3cret",))
    assert agent.keys == ["s3cret", "s3cret"] and len(samples) == 4 and not agent.errors


def test_an_agent_that_cannot_take_the_token_is_refused_at_start():
    cfg = load_config(None, ["orchestrator.agents.proxy_token=s3cret"])
    with pytest.raises(
        TriadError, match="proxy_token is set but run_agent takes no api_key: make it run_agent"
    ):
        AgentRollouts(Agent(), None, cfg.orchestrator, "auto")
    AgentRollouts(Agent(), None, load_config(None, []).orchestrator, "auto")  # no token: old signature


def test_options_the_proxy_does_not_honour_get_a_400_that_names_them():
    cfg = load_config(None, [])
    proxy = AgentProxy(cfg.orchestrator)

    class Answers:
        async def call(self, messages, tools, max_tokens):
            return {
                "message": {"role": "assistant", "content": "2"},
                "finish_reason": "stop",
                "prompt_tokens": 1,
                "completion_tokens": 1,
            }

        def close(self):
            pass

    async def run():
        await proxy.start()
        try:
            client = openai.AsyncOpenAI(
                base_url=proxy.base_url(proxy.open(Answers())), api_key="x", max_retries=0
            )
            messages = [{"role": "user", "content": "1+1="}]
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model="m", messages=messages, stop=["\n"], response_format={"type": "json_object"}
                )
            assert refused.value.body["message"] == (
                "unsupported by the training proxy: response_format, stop; sampling follows the run's "
                "settings (orchestrator.sampling.temperature, max_tokens): leave them out"
            )
            with pytest.raises(
                openai.BadRequestError, match="unsupported by the training proxy: tool_choice;"
            ):
                await client.chat.completions.create(model="m", messages=messages, tool_choice="required")
            done = await client.chat.completions.create(  # what the proxy does anyway is accepted
                model="m", messages=messages, tool_choice="auto", top_p=1, temperature=0.3, stop=None
            )
            assert done.choices[0].message.content == "2"
            await client.close()
        finally:
            await proxy.stop()

    asyncio.run(run())


class BlockingAgent(Agent):
    """An `async def` that calls its proxy with a blocking (sync) client, then blocks for `sleep` s."""

    def __init__(self, sleep: float = 0) -> None:
        super().__init__()
        self.sleep = sleep

    async def run_agent(self, prompt, base_url, model):
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=5)
        messages = [{"role": "user", "content": prompt.text}]
        try:
            for _ in range(2):
                reply = client.chat.completions.create(model=model, messages=messages)
                messages += [
                    reply.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "?"},
                ]
        except openai.APIError as e:
            self.errors.append(e)
            raise
        finally:
            client.close()
        time.sleep(self.sleep)
        await asyncio.sleep(0)


def test_an_async_agent_that_blocks_does_not_stall_its_own_proxy():
    agent = BlockingAgent()
    with FakeServer() as fake:
        (sample,) = run_group(agent, 1, fake)
    assert not agent.errors and sample.turns == 2 and sample.reward == 1.0


def test_the_agent_timeout_fires_on_an_async_agent_that_blocks():
    agent = BlockingAgent(sleep=4)
    with FakeServer() as fake:
        started = time.monotonic()
        (sample,) = run_group(agent, 1, fake, sets=("orchestrator.agents.timeout_s=1",))
        took = time.monotonic() - started
    assert took < 3.5 and sample.turns == 2  # scored as it stood at the bound, not when the agent woke


class LoadedAgent(Agent):
    """Three calls; after the first, another request is in flight on the server that answered it."""

    def __init__(self, pool_clients: list[InferenceClient]) -> None:
        super().__init__()
        self.clients = pool_clients

    async def run_agent(self, prompt, base_url, model):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)
        messages = [{"role": "user", "content": prompt.text}]
        try:
            for turn in range(3):
                reply = await client.chat.completions.create(model=model, messages=messages)
                messages += [
                    reply.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "?"},
                ]
                if turn == 0:
                    self.clients[0].inflight += 1  # another episode's request, say
        finally:
            await client.close()


def test_the_calls_of_an_episode_prefer_the_server_that_answered_the_last():
    with FakeServer() as a, FakeServer() as b:

        async def run():
            pool, clients = pools_of(a, b)
            for client in clients:
                await client.wait_ready(10, None)
            agent = LoadedAgent(clients)
            rollouts = AgentRollouts(agent, pool, pool.oc, "auto")
            await rollouts.start(agent.sample(None))
            try:
                return await rollouts.group(agent.sample(None), 1)
            finally:
                await rollouts.stop()
                for client in clients:
                    await client.close()

        (sample,) = asyncio.run(run())
        assert sample.turns == 3 and (a.state.requests, b.state.requests) == (3, 0)
