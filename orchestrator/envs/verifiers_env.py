"""An installed `verifiers` environment as a triad environment (`pip install 'triad[verifiers]'`).

    [orchestrator.environment]
    name = "verifiers:my-env"          # the module my_env, with load_environment(**args)
    args = { num_train_examples = 500 }

Its dataset gives the prompts (each prompt is a row index). For each episode its
own rollout logic (`Environment.run_rollout`: single-turn, multi-turn, tools,
whatever the environment does) talks to the orchestrator's agent proxy through
verifiers' OpenAI chat-completions client, so every model call is sampled from
triad's servers and recorded with its exact token ids (`orchestrator/episodes/agents.py`).
Its rubric scores the rollout: `reward` is the rubric's weighted sum, and each
rubric function's value is one of the sample's `metrics` (`env/<function>` in
triad's metrics). Evaluation uses the environment's eval dataset if it has one.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from orchestrator.draws import Indexed
from orchestrator.envs.extras import require
from orchestrator.prompt import Prompt
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")


def _library() -> Any:
    return require("verifiers", "verifiers", "verifiers", "environment 'verifiers:...'")


class VerifiersEnv:
    """Prompts from a verifiers environment's dataset; rollouts and scores by the environment."""

    def __init__(self, env_id: str, **env_args: Any) -> None:
        if not env_id:
            raise TriadError("verifiers: name the environment, env = 'verifiers:<environment id>'")
        vf = _library()
        self.name, self.vf = f"verifiers:{env_id}", vf
        try:
            self.env = vf.load_environment(env_id, **env_args)
            self.train = self.env.get_dataset()
            self.held_out = self.env.get_eval_dataset() if self.env.eval_dataset_source else None
        except Exception as e:  # verifiers wraps a missing module or a bad argument in its own errors
            raise TriadError(f"{self.name}: cannot load it: {type(e).__name__}: {e}") from None
        if len(self.train) == 0:
            raise TriadError(f"{self.name}: its dataset is empty")

    def prompt_of(self, split: str, index: int) -> Prompt:
        row = (self.train if split == "train" else self.held_out)[index]
        messages = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        return Prompt(
            messages=messages, answer=str(row.get("answer") or ""), meta={"split": split, "index": str(index)}
        )

    def sample(self, rng: random.Random) -> Prompt:
        return self.prompt_of("train", rng.randrange(len(self.train)))

    def dataset(self) -> Indexed:
        """The training dataset, each row once per epoch (made when drawn)."""
        return Indexed(len(self.train), lambda i: self.prompt_of("train", i))

    def eval_prompts(self) -> list[Prompt]:
        if self.held_out is None:
            log.warning(
                "verifiers environment %s has no eval dataset: evaluation uses its training prompts",
                self.name,
            )
            return [self.prompt_of("train", i) for i in range(len(self.train))]
        return [self.prompt_of("eval", i) for i in range(len(self.held_out))]

    async def run_agent(self, prompt: Prompt, base_url: str, model: str, api_key: str) -> dict:
        """The environment's own rollout and rubric, its model calls sent to `base_url`."""
        import openai

        row = (self.train if prompt.meta["split"] == "train" else self.held_out)[int(prompt.meta["index"])]
        client = self.vf.OpenAIChatCompletionsClient(openai.AsyncOpenAI(base_url=base_url, api_key=api_key))
        try:
            output = await self.env.run_rollout(dict(row), client, model, dict(self.env.sampling_args))
        finally:
            await client.close()
        if output.get("error"):
            log.warning("%s: the rollout ended with an error: %s", self.name, output["error"])
        return dict(output)

    def reward(self, prompt: Prompt, episode: Any) -> float:
        """The rubric's reward; an episode whose rollout raised or timed out scores 0."""
        result = episode.result
        return float(result["reward"] or 0.0) if isinstance(result, dict) else 0.0

    def metrics(self, prompt: Prompt, episode: Any) -> dict[str, float]:
        """Each rubric function's value for the episode."""
        result = episode.result
        if not isinstance(result, dict):
            return {}
        return {k: float(v) for k, v in (result.get("metrics") or {}).items() if isinstance(v, int | float)}
