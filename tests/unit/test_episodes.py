"""Episodes against a fake OpenAI server: a conversation that outgrows the model's context, tool
results capped, and the agent proxy's failures, ids and exposure (issue 32, items 4, 5 and 7)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from orchestrator.agents import AgentRollouts, EpisodeRecorder
from orchestrator.backends import Frozen
from orchestrator.client import InferenceClient
from orchestrator.environments import Prompt
from orchestrator.pool import RolloutFailed, Server, ServerPool
from orchestrator.proxy import AgentProxy
from orchestrator.rollout import TextRollouts
from orchestrator.tool_calls import ParsedTurn, ToolCall
from orchestrator.tools import ToolRunner
from shared.config import load_config
from shared.errors import TriadError
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
    cfg = load_config(None, ["orchestrator.max_tokens=32", "orchestrator.max_retries=0", *sets])
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
        rollouts = AgentRollouts(agent, pool, pool.oc)
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
    ids = {proxy.open(EpisodeRecorder(None, cfg.orchestrator)) for _ in range(50)}
    assert len(ids) == 50 and all(len(i) >= 20 for i in ids)


def test_a_proxy_off_loopback_needs_a_token_and_then_asks_for_it():
    with pytest.raises(TriadError, match="not loopback.*no orchestrator.proxy_token"):
        AgentProxy(load_config(None, ["orchestrator.proxy_host=0.0.0.0"]).orchestrator)
    cfg = load_config(None, ["orchestrator.proxy_token=s3cret"])
    proxy = AgentProxy(cfg.orchestrator)

    async def run():
        await proxy.start()
        try:
            episode = proxy.open(EpisodeRecorder(None, cfg.orchestrator))
            url = proxy.base_url(episode)
            wrong = openai.AsyncOpenAI(base_url=url, api_key="nope", max_retries=0, timeout=10)
            with pytest.raises(openai.AuthenticationError):
                await wrong.models.list()
            right = openai.AsyncOpenAI(base_url=url, api_key="s3cret", max_retries=0, timeout=10)
            assert [m.id for m in (await right.models.list()).data] == ["model"]
        finally:
            await proxy.stop()

    asyncio.run(run())
