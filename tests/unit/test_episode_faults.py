"""No sample, model output, environment call or server answer ends the run (issue 47, scopes 1 and 4):
an episode that cannot go on is dropped with its group before its first turn and ends truncated
after it, each counted by cause; a straggler is bounded; partial groups are an option."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from orchestrator.environments import Prompt
from orchestrator.episodes.chat import ChatRollouts
from orchestrator.episodes.text import TextRollouts
from orchestrator.failures import RolloutFailed
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient, RequestRejected
from orchestrator.servers.pool import Server, ServerPool
from shared.config import load_config
from shared.rundir import ORCHESTRATOR
from tests.fake_openai import FakeServer
from tests.unit.test_orchestrator import close, make, stop

CONTEXT = 400  # the fake server's max_model_len
KINDS = ("too_long", "reward_raises", "respond_raises", "respond_hangs", "respond_1mb", "fine")


class Faulty:
    """A chat environment whose prompts cycle through KINDS: a prompt over the context, a reward that
    raises, a respond that raises, hangs past env_timeout_s or returns 1 MB, and a fine one."""

    name, max_turns = "faulty", 3

    def __init__(self) -> None:
        self.drawn = 0

    def sample(self, rng) -> Prompt:
        kind = KINDS[self.drawn % len(KINDS)]
        self.drawn += 1
        content = "x" * CONTEXT if kind == "too_long" else kind
        return Prompt(answer="2", meta={"kind": kind}, messages=[{"role": "user", "content": content}])

    def reward(self, prompt: Prompt, conversation: list[dict]) -> float:
        if prompt.meta["kind"] == "reward_raises":
            raise KeyError("no score")
        return float(len(conversation))

    async def respond(self, prompt: Prompt, conversation: list[dict]) -> str:
        kind = prompt.meta["kind"]
        if kind == "respond_raises":
            raise ValueError("odd output")
        if kind == "respond_hangs":
            await asyncio.sleep(30)
        if kind == "respond_1mb":
            return "y" * 2**20
        return "again"


def test_a_run_whose_samples_and_environment_fail_in_every_way_reaches_its_last_step(tmp_path, caplog):
    """Before: the render's 400 for the over-long prompt escaped the producer and ended the run
    (`RequestRejected: POST .../v1/chat/completions/render answered 400`)."""
    steps = 4
    with FakeServer() as fake:
        fake.state.max_model_len = CONTEXT

        async def run() -> list[dict]:
            orch = make(
                tmp_path,
                [fake.url],
                f"max_steps={steps}",
                "max_async_level=100",
                "orchestrator.environment.timeout_s=0.2",
                "orchestrator.max_inflight=4",
                "weights.keep=200",
                "orchestrator.max_failed_groups=5",
                'orchestrator.environment.name="tests.unit.test_episode_faults:Faulty"',
            )
            orch.pool.servers[0].client.max_model_len = CONTEXT
            producer = asyncio.create_task(orch.produce())
            try:
                last = time.monotonic()
                for step in range(1, steps + 1):
                    async with asyncio.timeout(30):
                        batch, dropped, filtered = await orch.assemble(step)
                    await orch.finish_step(step, batch, dropped, filtered, last, time.monotonic())
            finally:
                await stop(producer)
                await close(orch)
            return orch.rundir.metrics.rows(ORCHESTRATOR)

        with caplog.at_level(logging.INFO, logger="triad.orchestrator"):
            rows = asyncio.run(run())
    assert [r["step"] for r in rows] == list(range(1, steps + 1))

    def total(key: str) -> int:
        return sum(r.get(key, 0) for r in rows)

    # of every 6 groups drawn: 2 dropped (render at turn 0, reward), 3 truncated after turn 1
    assert total("groups_failed_render") >= 2 and total("groups_failed_reward") >= 2
    assert total("groups_failed") == total("groups_failed_render") + total("groups_failed_reward")
    assert total("episodes_truncated_respond") >= 2 * 2 * 2  # raises and hangs, 2 episodes a group
    assert total("episodes_truncated_render") >= 2 * 2  # 1 MB pushes the next render past the context
    assert "Traceback" not in caplog.text
    drops = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped a group")]
    assert {m.split("(")[1].split(")")[0] for m in drops} == {"render", "reward"}


def pool_of(fake: FakeServer, *sets: str) -> ServerPool:
    cfg = load_config(None, ["orchestrator.servers.retry_backoff_s=0.01", *sets])
    client = InferenceClient(fake.url, None, 10)
    client.model = "fake"
    return ServerPool([Server(client, Frozen())], cfg.orchestrator)


class Chat:
    name, max_turns = "chat", 3

    def __init__(self, respond=None) -> None:
        if respond is not None:
            self.respond = respond

    def sample(self, rng) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": "hi"}])

    def reward(self, prompt, conversation) -> float:
        return 1.0


def rollout(env, fake: FakeServer, size: int, *sets: str):
    async def run():
        pool = pool_of(fake, *sets)
        rollouts = ChatRollouts(env, pool, pool.oc, "auto")
        try:
            return await rollouts.group(env.sample(None), size), rollouts.failures.take()
        finally:
            await pool.servers[0].client.close()

    return asyncio.run(run())


def test_a_respond_that_fails_after_the_first_turn_ends_the_episode_truncated_with_its_turns_kept():
    """Before: the respond's exception went up through the group and ended the run."""

    def respond(prompt, conversation):
        if len(conversation) >= 3:  # after the second model turn
            raise RuntimeError("lost its state")
        return "more"

    with FakeServer() as fake:
        samples, counts = rollout(Chat(respond), fake, 2)
    for sample in samples:
        assert sample.turns == 2 and sample.truncated
        assert [m["role"] for m in sample.conversation] == ["assistant", "user", "assistant"]
        assert sample.input_ids[-1:] == [ord("2")]  # the last sampled turn's ids end the sample
    assert counts == {"groups_failed": 0, "episodes_truncated_respond": 2}


def test_a_straggler_episode_ends_truncated_at_episode_timeout_s():
    async def slow(prompt, conversation):
        await asyncio.sleep(30)

    with FakeServer() as fake:
        started = time.monotonic()
        samples, counts = rollout(
            Chat(slow),
            fake,
            2,
            "orchestrator.environment.episode_timeout_s=0.3",
            "orchestrator.environment.timeout_s=60",
        )
    assert time.monotonic() - started < 10
    assert [(s.turns, s.truncated) for s in samples] == [(1, True), (1, True)]
    assert counts == {"groups_failed": 0, "episodes_truncated_timeout": 2}


def test_an_episode_past_its_bound_before_its_first_turn_drops_its_group():
    with FakeServer() as fake:
        fake.state.delay = 5
        with pytest.raises(
            RolloutFailed, match=r"ran past orchestrator.environment.episode_timeout_s \(0.2 s\)"
        ) as e:
            rollout(Chat(), fake, 2, "orchestrator.environment.episode_timeout_s=0.2")
    assert e.value.cause == "timeout"


def test_a_text_group_with_a_prompt_over_the_context_is_dropped_not_the_run():
    """Before: the single-turn request's 400 escaped as RequestRejected and ended the run."""

    class Long:
        name = "long"

        def sample(self, rng):
            return Prompt(text="x" * 100)

        def reward(self, prompt, completion):
            return 1.0

    with FakeServer() as fake:
        fake.state.max_model_len = 50

        async def run():
            pool = pool_of(fake)
            try:
                return await TextRollouts(Long(), pool, pool.oc).group(Long().sample(None), 2)
            finally:
                await pool.servers[0].client.close()

        with pytest.raises(RolloutFailed, match="environment 'long': .* rejected a rollout request") as e:
            asyncio.run(run())
    assert e.value.cause == "generate"


@pytest.mark.parametrize("partial, trained", [(False, None), (True, 2)])
def test_partial_groups_train_on_their_finished_episodes_when_the_option_is_on(partial, trained):
    """Of 3 episodes, one is refused at its first turn (its prompt render answers 400 once)."""
    with FakeServer() as fake:
        fake.state.max_model_len = CONTEXT
        env = Chat()
        refused = {"n": 0}

        async def run():
            pool = pool_of(fake, f"orchestrator.partial_groups={str(partial).lower()}")
            rollouts = ChatRollouts(env, pool, pool.oc, "auto")
            render = rollouts.renderer.render

            async def refuse_first(messages, generation_prompt):
                if refused["n"] == 0:
                    refused["n"] += 1
                    messages = [{"role": "user", "content": "x" * CONTEXT}]
                return await render(messages, generation_prompt)

            rollouts.renderer.render = refuse_first
            try:
                return await rollouts.group(env.sample(None), 3), rollouts.failures.take()
            finally:
                await pool.servers[0].client.close()

        if trained is None:
            with pytest.raises(RolloutFailed, match="answered 400: .*maximum context length") as e:
                asyncio.run(run())
            assert e.value.cause == "render"
            return
        samples, counts = asyncio.run(run())
    assert len(samples) == trained and all(s.turns == 1 for s in samples)
    assert counts == {"groups_failed": 0, "episodes_dropped_render": 1}


@pytest.mark.parametrize("finish", ["abort", None])
def test_a_sample_the_server_did_not_finish_is_a_failed_request_and_retried(finish):
    """Before: `abort` or a missing finish_reason counted as a finished turn ("stop")."""
    with FakeServer() as fake:
        fake.state.finish_reasons = [finish]
        samples, counts = rollout(Chat(), fake, 1)
    assert fake.state.requests == 2 and samples[0].turns == 1 and not samples[0].truncated
    assert samples[0].input_ids[-1] == ord("2") and counts == {"groups_failed": 0}


def test_prompt_ids_that_differ_from_those_sent_are_a_named_server_error():
    """Before: the server's prompt_token_ids were never compared with the ids sent."""
    with FakeServer() as fake:
        fake.state.prompt_ids_cut = 10
        with pytest.raises(
            RolloutFailed, match=r"prompt_token_ids differ from the \d+ ids sent, at index \d+"
        ):
            rollout(Chat(), fake, 1, "orchestrator.servers.max_retries=1")
    assert fake.state.requests == 2


@pytest.mark.parametrize("route", ["/v1/chat/completions/render", "/v1/completions"])
def test_busy_answers_and_cut_bodies_are_retried_and_retry_after_is_honoured(route):
    """Before: a cut body escaped as json's JSONDecodeError (a traceback that ended the run), and a 429
    from render was a refusal that ended it (`... render answered 429`)."""
    with FakeServer() as fake:
        fake.state.spoiled_route, fake.state.busy, fake.state.cut_bodies = route, [(429, 1.0), (503, None)], 2
        started = time.monotonic()
        samples, counts = rollout(
            Chat(lambda p, c: "more"),
            fake,
            1,
            "orchestrator.servers.max_retries=4",
            "orchestrator.servers.max_failures=9",
        )
    assert time.monotonic() - started >= 1.0  # the 429's Retry-After, over the 0.01 s backoff
    assert samples[0].turns == 3 and not samples[0].truncated and counts == {"groups_failed": 0}
    spoiled = 4  # answers before the first good one: 429, 503, two cut bodies
    renders = 1 + 2 * 2  # the prompt, then two renderings after each of the first two turns
    assert (fake.state.requests, fake.state.renders) == (
        (3, renders + spoiled) if "render" in route else (3 + spoiled, renders)
    )


@pytest.mark.parametrize("status", [400, 422])  # a first 404 says the server has no render route
def test_a_refused_render_is_not_retried(status):
    with FakeServer() as fake:
        fake.state.busy = [(status, None)]
        with pytest.raises(RolloutFailed, match=f"render answered {status}") as e:
            rollout(Chat(), fake, 1)
    assert e.value.cause == "render" and fake.state.renders == 1


def test_a_404_from_render_after_it_answered_is_a_refusal_not_a_switch_to_tokenize():
    """Before: one 404 set has_render False for the rest of the run."""
    with FakeServer() as fake:
        pool = pool_of(fake)
        client = pool.servers[0].client

        async def run():
            try:
                await client.chat.render([{"role": "user", "content": "a"}], None, True, {})
                fake.state.busy = [(404, None)]
                with pytest.raises(RequestRejected, match="render answered 404"):
                    await client.chat.render([{"role": "user", "content": "b"}], None, True, {})
                return await client.chat.render([{"role": "user", "content": "c"}], None, True, {})
            finally:
                await client.close()

        ids = asyncio.run(run())
    assert client.chat.has_render is True and fake.state.renders == 3
    assert bytes(ids) == b"user: c\nassistant: "
