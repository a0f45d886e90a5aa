"""One prompt's group of rollouts, single- or multi-turn, as the trainer will see it.

Token ids and logprobs are the server's own: the prompt is tokenised once by
the server, each later model turn continues from the exact token ids so far, and
an environment message is tokenised by the server's `/tokenize` and appended
with `loss_mask = false` and logprob 0. A sample's version is the oldest
version any of its turns was sent to. Chat prompts (and text prompts with
`orchestrator.chat`) go through `chat_rollout.ChatRollouts` instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.client import Completion
from orchestrator.environments import Environment, Prompt, max_turns, respond, score
from orchestrator.pool import ServerPool
from shared.errors import TriadError

if TYPE_CHECKING:
    from orchestrator.chat_rollout import Episodes


@dataclass
class Sample:
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    completion: str = ""  # the conversation after the prompt, as text
    truncated: bool = False
    version: int = 0
    turns: int = 0
    reward: float = 0.0
    conversation: list[dict[str, Any]] = field(default_factory=list)  # chat: the messages after the prompt
    tool_calls: int = 0
    tool_errors: int = 0
    servers: list[str] = field(default_factory=list)  # the URLs of the servers that sampled it
    metrics: dict[str, float] = field(default_factory=dict)  # the environment's own, e.g. per rubric function

    def add(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.input_ids += ids
        self.loss_mask += [sampled] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def served_by(self, url: str) -> None:
        if url not in self.servers:
            self.servers.append(url)

    @property
    def completion_tokens(self) -> int:
        return sum(self.loss_mask)


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
        (c,), server, version = await pool.complete(request, 1, prefer=server)
        if turn == 0:
            sample.add(c.prompt_ids, sampled=False)
            sample.version = version
        sample.version = min(sample.version, version)
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


async def rollout_group(
    env: Environment, prompt: Prompt, pool: ServerPool, group_size: int, env_timeout: float,
    episodes: Episodes | None = None,
) -> list[Sample]:  # fmt: skip
    """`group_size` scored samples of one prompt (one request with n samples if single-turn text);
    with `episodes` (chat or agent episodes), theirs."""
    if episodes is not None:
        return await episodes.group(prompt, group_size)
    if prompt.is_chat:
        raise TriadError(f"environment {env.name!r} gave a chat prompt, but chat rollouts are not set up")
    if max_turns(env) == 1:
        completions, server, version = await pool.complete(prompt.text, group_size)
        samples = [single_turn(c, version, server.url) for c in completions]
    else:
        samples = list(
            await asyncio.gather(*(episode(env, prompt, pool, env_timeout) for _ in range(group_size)))
        )
    rewards = await asyncio.gather(*(score(env, prompt, s.completion, env_timeout) for s in samples))
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    return samples
