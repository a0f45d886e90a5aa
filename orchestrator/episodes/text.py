"""Text rollouts: a text prompt sent as is (base models), single- or multi-turn.

The prompt is tokenised once by the server, each later model turn continues from
the exact token ids so far, and an environment message is tokenised by the
server's `/tokenize` and appended with `loss_mask = false` and logprob 0. A
single-turn group is one request with `n` samples. An episode that cannot go on
is dropped or ends truncated as `failures.py` says. Chat prompts (and text
prompts with `orchestrator.chat.text_prompts`) are `chat.ChatRollouts`' instead.
"""

from __future__ import annotations

from orchestrator.environments import Environment, Prompt, group_rewards, max_turns, respond
from orchestrator.episodes.run import finished_episodes, run_episode
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.seeds import UNSEEDED, Seeds
from orchestrator.failures import Failures
from orchestrator.servers.client import Completion
from orchestrator.servers.pool import ServerPool
from shared.config import OrchestratorConfig
from shared.errors import TriadError


def single_turn(c: Completion, version: int, server: str) -> Sample:
    sample = Sample(completion=c.text)
    sample.add(c.prompt_ids, sampled=False)
    sample.record_turn(c, server, version)
    return sample


async def turns(
    env: Environment, prompt: Prompt, pool: ServerPool, env_timeout: float, sample: Sample, seeds: Seeds
) -> None:
    """Model and environment take turns, filling `sample`, until the environment ends it or `max_turns`."""
    server = None
    request: str | list[int] = prompt.text
    for turn in range(max_turns(env)):
        (c,), server, version = await pool.complete(request, 1, prefer=server, seed=seeds.at(turn).value)
        if turn == 0:
            sample.add(c.prompt_ids, sampled=False)
        sample.record_turn(c, server.url, version)
        sample.completion += c.text
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


class TextRollouts:
    """Text episodes of one environment."""

    def __init__(
        self, env: Environment, pool: ServerPool, oc: OrchestratorConfig, failures: Failures | None = None
    ) -> None:
        self.env, self.pool, self.oc = env, pool, oc
        self.failures = failures or Failures(oc.max_failed_groups)
        self.where = f"environment {env.name!r}"

    async def start(self, prompt: Prompt) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def episode(self, prompt: Prompt, seeds: Seeds = UNSEEDED) -> Sample:
        sample = Sample()
        work = turns(self.env, prompt, self.pool, self.oc.environment.timeout_s, sample, seeds)
        return await run_episode(
            sample, work, self.oc.environment.episode_timeout_s, self.where, self.failures
        )

    async def single_turn_group(self, prompt: Prompt, size: int, seeds: Seeds) -> list[Sample]:
        """One request with `size` samples (seeded once: the server seeds sample i with seed + i); an
        episode with no turn: a refused or late one drops the group."""
        sample = Sample()  # stays without a turn: whatever ends it drops the group
        samples: list[Sample] = []

        async def request() -> None:
            completions, server, version = await self.pool.complete(prompt.text, size, seed=seeds.value)
            samples.extend(single_turn(c, version, server.url) for c in completions)

        await run_episode(sample, request(), self.oc.environment.episode_timeout_s, self.where, self.failures)
        return samples

    async def group(self, prompt: Prompt, size: int, seeds: Seeds = UNSEEDED) -> list[Sample]:
        """`size` scored samples of `prompt` (one request with `size` samples if single-turn)."""
        if prompt.is_chat:
            raise TriadError(f"{self.where} gave a chat prompt, but chat rollouts are not set up")
        if max_turns(self.env) == 1:
            samples = await self.single_turn_group(prompt, size, seeds)
        else:
            episodes = [self.episode(prompt, seeds.at(i)) for i in range(size)]
            samples = await finished_episodes(episodes, self.oc.partial_groups, self.failures)
        seen = [s.completion for s in samples]
        rewards = await group_rewards(self.env, prompt, seen, self.oc.environment.timeout_s)
        for sample, reward in zip(samples, rewards, strict=True):
            sample.reward = reward
        return samples
