"""Evaluation on a held-out set: pass@1 and pass@k, without blocking training.

For each prompt `k` episodes are run; with `c` of them correct (reward >= 1),
pass@1 = c / k and pass@k = 1 - C(k - c, k) / C(k, k), i.e. 1 if any is correct.
An episode is counted once however many samples it made (an agent's calls), and
one that made none, or was dropped (`orchestrator.partial_groups`), is not correct.
The general unbiased estimator (Chen et al., 2021) for n >= k samples is
1 - C(n - c, k) / C(n, k); `pass_at_k` computes it.
"""

from __future__ import annotations

import asyncio
import logging
from math import comb

from orchestrator.environments import Environment, Prompt, eval_prompts
from orchestrator.episodes import UNSEEDED, Episodes, Sample, Seeds
from orchestrator.servers.pool import RolloutFailed, ServerPool
from shared.config import TriadConfig
from shared.metrics import MetricsWriter

log = logging.getLogger("triad.orchestrator")
SOLVED = 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def episode_rewards(group: list[Sample]) -> list[float]:
    """Each episode's reward once: an agent's episode makes a sample per call, and they share it;
    any other sample is an episode of its own."""
    by_episode = {
        ("episode", s.episode) if s.episode is not None else ("sample", i): s.reward
        for i, s in enumerate(group)
    }
    return list(by_episode.values())


async def evaluate(
    prompts: list[Prompt], k: int, episodes: Episodes, seeds: Seeds = UNSEEDED
) -> dict[str, float]:
    """Held-out prompt i's requests are seeded below `seeds.at("eval", i)`: the same at every evaluation."""
    groups = await asyncio.gather(
        *(episodes.group(p, k, seeds.at("eval", i)) for i, p in enumerate(prompts)), return_exceptions=True
    )
    scored = [g for g in groups if not isinstance(g, BaseException)]
    for g in groups:
        if isinstance(g, BaseException) and not isinstance(g, RolloutFailed):
            raise g
    if not scored:
        return {"eval_failed_prompts": float(len(prompts))}
    outcomes = [episode_rewards(g) for g in scored]
    correct = [sum(r >= SOLVED for r in rewards) for rewards in outcomes]
    rewards = [r for group in outcomes for r in group]
    return {
        "eval_reward_mean": sum(rewards) / len(rewards),
        "eval_pass@1": sum(pass_at_k(k, c, 1) for c in correct) / len(correct),
        f"eval_pass@{k}": sum(pass_at_k(k, c, k) for c in correct) / len(correct),
        "eval_prompts": float(len(scored)),
        "eval_failed_prompts": float(len(prompts) - len(scored)),
    }


async def evaluate_and_log(
    step: int,
    prompts: list[Prompt],
    pool: ServerPool,
    k: int,
    writer: MetricsWriter,
    episodes: Episodes,
    seeds: Seeds,
) -> None:
    versions = sorted({s.version for s in pool.healthy()})
    result = await evaluate(prompts, k, episodes, seeds)
    await asyncio.to_thread(writer.log, step, policy_versions=versions, **result)  # off the event loop
    summary = ", ".join(f"{name} {value:.3f}" for name, value in result.items())
    log.info("eval after step %d: %s", step, summary)


class EvalSchedule:
    """Held-out evaluation after every `orchestrator.eval.every` steps and after the last one,
    each in its own task beside the next steps (none with `every = 0`)."""

    def __init__(
        self,
        cfg: TriadConfig,
        env: Environment,
        pool: ServerPool,
        writer: MetricsWriter,
        episodes: Episodes,
        seeds: Seeds,
    ) -> None:
        oc = cfg.orchestrator
        self.every, self.k, self.max_steps = oc.eval.every, oc.eval.k, cfg.max_steps
        self.held_out = eval_prompts(env, oc.eval.size) if oc.eval.every else []
        self.pool, self.writer, self.episodes, self.seeds = pool, writer, episodes, seeds

    def after(self, step: int, tasks: asyncio.TaskGroup) -> None:
        if self.every and (step % self.every == 0 or step == self.max_steps):
            evaluation = evaluate_and_log(
                step, self.held_out, self.pool, self.k, self.writer, self.episodes, self.seeds
            )
            tasks.create_task(evaluation)
