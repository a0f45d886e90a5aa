"""Text rollouts: a text prompt sent as is (base models), single- or multi-turn.

The prompt is tokenised once by the server, each later model turn continues from
the exact token ids so far, and an environment message is tokenised by the
server's `/tokenize` and appended with `loss_mask = false` and logprob 0. A
single-turn group is one request with `n` samples. Chat prompts (and text
prompts with `orchestrator.chat`) are `chat_rollout.ChatRollouts`' instead.
"""

from __future__ import annotations

import asyncio

from orchestrator.client import Completion, RequestRejected
from orchestrator.environments import Environment, Prompt, max_turns, respond, score
from orchestrator.pool import RolloutFailed, ServerPool
from orchestrator.sample import Sample
from shared.config import OrchestratorConfig
from shared.errors import TriadError


def single_turn(c: Completion, version: int, server: str) -> Sample:
    sample = Sample(completion=c.text, truncated=c.truncated, version=version, turns=1, servers=[server])
    sample.add(c.prompt_ids, sampled=False)
    sample.add(c.token_ids, sampled=True, logprobs=c.logprobs)
    return sample


async def episode(env: Environment, prompt: Prompt, pool: ServerPool, env_timeout: float) -> Sample:
    """Model and environment take turns until the environment ends it or `max_turns`."""
    sample, server = Sample(), None
    request: str | list[int] = prompt.text
    for turn in range(max_turns(env)):
        try:
            (c,), server, version = await pool.complete(request, 1, prefer=server)
        except RequestRejected as e:  # the conversation outgrew the model's context: data, not config
            if turn == 0:
                raise RolloutFailed(f"environment {env.name!r}: the server refused a prompt: {e}") from None
            sample.truncated = True
            break
        if turn == 0:
            sample.add(c.prompt_ids, sampled=False)
        sample.sampled_at(version)
        sample.served_by(server.url)
        sample.add(c.token_ids, sampled=True, logprobs=c.logprobs)
        sample.completion += c.text
        sample.truncated, sample.turns = c.truncated, turn + 1
        if turn + 1 == max_turns(env):
            break
        reply = await respond(env, prompt, sample.completion, env_timeout)
        if reply is None:
            break
        ids, server = await pool.request(
            lambda s, text=reply: s.client.tokenize(text), "tokenizing a reply", server
        )
        sample.add(ids, sampled=False)
        sample.completion += reply
        request = sample.input_ids
    return sample


class TextRollouts:
    """Text episodes of one environment."""

    def __init__(self, env: Environment, pool: ServerPool, oc: OrchestratorConfig) -> None:
        self.env, self.pool, self.oc = env, pool, oc

    async def start(self, prompt: Prompt) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def group(self, prompt: Prompt, size: int) -> list[Sample]:
        """`size` scored samples of `prompt` (one request with `size` samples if single-turn)."""
        if prompt.is_chat:
            raise TriadError(
                f"environment {self.env.name!r} gave a chat prompt, but chat rollouts are not set up"
            )
        timeout = self.oc.env_timeout_s
        if max_turns(self.env) == 1:
            completions, server, version = await self.pool.complete(prompt.text, size)
            samples = [single_turn(c, version, server.url) for c in completions]
        else:
            samples = list(
                await asyncio.gather(*(episode(self.env, prompt, self.pool, timeout) for _ in range(size)))
            )
        rewards = await asyncio.gather(*(score(self.env, prompt, s.completion, timeout) for s in samples))
        for sample, reward in zip(samples, rewards, strict=True):
            sample.reward = reward
        return samples
