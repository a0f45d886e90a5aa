"""From accepted groups to batch rows and step metrics: plain code, no asyncio, no I/O.

Rewards are shaped (DAPO's overlong penalty, if configured), advantages are
group-relative over the shaped rewards, truncated samples may be masked out, and
every row follows the Parquet schema of `shared/batch.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.batches.advantages import group_advantages, overlong_penalty
from orchestrator.batches.staleness import lag
from orchestrator.environments import Prompt
from orchestrator.episodes.text import Sample
from shared.config import OrchestratorConfig


@dataclass
class Group:
    group_id: str
    prompt: Prompt
    samples: list[Sample]
    draw: int = -1  # the producer's draw number (`draws.py`); -1: not drawn (an evaluation's)

    @property
    def version(self) -> int:
        return min(s.version for s in self.samples)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def sample_metrics(sample: Sample) -> dict[str, float]:
    """The row's `metrics` JSON: the environment's reward and turns, tool use where there was any,
    and the environment's own metrics (`env/<key>`)."""
    out = {"env_reward": sample.reward, "turns": sample.turns}
    if sample.tool_calls:
        out |= {"tool_calls": sample.tool_calls, "tool_errors": sample.tool_errors}
    return out | {f"env/{key}": value for key, value in sample.metrics.items()}


class BatchBuilder:
    """Rows and statistics of one batch, as the orchestrator's config says."""

    def __init__(self, oc: OrchestratorConfig, env_name: str, turn_budget: int) -> None:
        self.shaping, self.env_name = oc.shaping, env_name
        self.token_budget = oc.sampling.max_tokens * turn_budget  # the most tokens a sample may sample

    def shaped_reward(self, sample: Sample) -> float:
        if self.shaping.overlong != "penalty":
            return sample.reward
        buffer, penalty = self.shaping.overlong_buffer, self.shaping.overlong_penalty
        return sample.reward + overlong_penalty(sample.completion_tokens, self.token_budget, buffer, penalty)

    def loss_mask(self, sample: Sample) -> list[bool]:
        if self.shaping.overlong == "mask" and sample.truncated:
            return [False] * len(sample.loss_mask)
        return sample.loss_mask

    def rows(self, step: int, batch: list[Group]) -> list[dict[str, Any]]:
        rows = []
        for group in batch:
            shaped = [self.shaped_reward(s) for s in group.samples]
            advantages = group_advantages(shaped, self.shaping.advantage)
            for i, (s, reward, adv) in enumerate(zip(group.samples, shaped, advantages, strict=True)):
                rows.append(
                    dict(
                        sample_id=f"{group.group_id}-{i}",
                        group_id=group.group_id,
                        step=step,
                        policy_version=s.version,
                        server=" ".join(s.servers),
                        input_ids=s.input_ids,
                        loss_mask=self.loss_mask(s),
                        logprobs=s.logprobs,
                        advantage=adv,
                        reward=reward,
                        truncated=s.truncated,
                        env=self.env_name,
                        metrics=json.dumps(sample_metrics(s)),
                    )
                )
        return rows

    def stats(self, step: int, batch: list[Group], rows: list[dict[str, Any]]) -> dict[str, float]:
        """Reward, advantage, lag and size statistics of batch `step`."""
        samples = [s for g in batch for s in g.samples]
        env_rewards = [s.reward for s in samples]
        advantages = [r["advantage"] for r in rows]
        adv_mean = _mean(advantages)
        lags = [lag(step, r["policy_version"]) for r in rows]
        return {
            "reward_mean": _mean(env_rewards),
            f"reward/{self.env_name}": _mean(env_rewards),
            "advantage_mean": adv_mean,
            "advantage_std": _mean([(a - adv_mean) ** 2 for a in advantages]) ** 0.5,
            "advantage_abs_mean": _mean([abs(a) for a in advantages]),
            "lag_mean": _mean(lags),
            "lag_max": max(lags),
            "truncated_frac": _mean([float(s.truncated) for s in samples]),
            "turns_mean": _mean([s.turns for s in samples]),
            "tool_calls_mean": _mean([s.tool_calls for s in samples]),
            "tool_errors_mean": _mean([s.tool_errors for s in samples]),
            "samples": len(rows),
            "tokens": sum(len(r["input_ids"]) for r in rows),
            "completion_tokens": sum(s.completion_tokens for s in samples),
            **env_metric_means(samples),
        }


def env_metric_means(samples: list[Sample]) -> dict[str, float]:
    """`env/<key>`: the mean of each of the environment's own metrics over the samples that have it."""
    values: dict[str, list[float]] = {}
    for sample in samples:
        for key, value in sample.metrics.items():
            values.setdefault(key, []).append(value)
    return {f"env/{key}": _mean(v) for key, v in sorted(values.items())}
