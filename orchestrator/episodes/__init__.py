"""How an environment's episodes are run: one protocol, one strategy per kind of rollout.

- `TextRollouts` (`text.py`): text prompts sent as is;
- `ChatRollouts` (`chat.py`): chat prompts, tools and replies as tokens;
- `AgentRollouts` (`agents.py`): any OpenAI-client program through a per-episode proxy.

The loop and evaluation import this module alone.
"""

from __future__ import annotations

import random
from typing import Protocol

from orchestrator.environments import Environment, Prompt, env_tools
from orchestrator.episodes.agents import AgentRollouts
from orchestrator.episodes.chat import ChatRollouts
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.seeds import UNSEEDED, Seeds
from orchestrator.episodes.text import TextRollouts
from orchestrator.failures import Failures
from orchestrator.servers.pool import ServerPool
from shared.config import OrchestratorConfig


class Episodes(Protocol):
    """The episodes of one environment."""

    async def start(self, prompt: Prompt) -> None:
        """Check, once before the run, that `prompt`'s episodes can be served; fail with one line if not."""

    async def group(self, prompt: Prompt, size: int, seeds: Seeds = UNSEEDED) -> list[Sample]:
        """`size` episodes of `prompt`, scored (an agent episode may make several samples); episode
        i's requests seeded below `seeds.at(i)`."""

    async def stop(self) -> None: ...


def episodes_for(
    env: Environment, pool: ServerPool, oc: OrchestratorConfig, tool_parser: str, failures: Failures
) -> Episodes:
    """Agent episodes for an environment with `run_agent`; chat episodes by config, for an
    environment with tools or one whose prompts are chat; text episodes otherwise. `tool_parser`:
    the servers' (`inference.tool_parser`); episodes cut short are counted in `failures`."""
    if hasattr(env, "run_agent"):
        return AgentRollouts(env, pool, oc, tool_parser)
    if oc.chat.text_prompts or env_tools(env) or env.sample(random.Random(0)).is_chat:
        return ChatRollouts(env, pool, oc, tool_parser, failures)
    return TextRollouts(env, pool, oc, failures)
