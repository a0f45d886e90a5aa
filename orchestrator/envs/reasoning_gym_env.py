"""reasoning-gym's procedural tasks as a triad environment (`pip install 'triad[reasoning-gym]'`).

    [orchestrator.environment]
    name = "reasoning_gym:basic_arithmetic"                     # one task
    args = { config = { max_digits = 2 } }                      # the task's own config
    name = "reasoning_gym"                                      # or a weighted mixture
    args = { tasks = { leg_counting = 1, basic_arithmetic = 3 }, config = { leg_counting = {...} } }

Items come from the library's generator (`reasoning_gym.create_dataset`), scored by
the dataset's own `score_answer` on the answer the library's `extract_answer` finds
in `<answer>` tags (`answer_tag = false`: the whole reply is the answer). Training
draws item indices in [0, size) of seed `seed`; the held-out set is items
[0, eval_size) of seed `seed + size`. The generators seed item i of seed s with
s + i, so the two never share a generator seed.

Prompts are chat (the task's system prompt and the question) unless `chat = false`,
which gives a text prompt for base models.
"""

from __future__ import annotations

import random
from typing import Any

from orchestrator.draws import Indexed
from orchestrator.envs.extras import require
from orchestrator.prompt import Prompt
from shared.errors import TriadError

NO_SYSTEM_PROMPT = "none"


def _library() -> Any:
    return require("reasoning_gym", "reasoning-gym", "reasoning-gym", "environment 'reasoning_gym'")


def reply_text(completion: str | list[dict]) -> str:
    """A text completion as is; of a conversation, the last assistant message's content."""
    if isinstance(completion, str):
        return completion
    replies = [m for m in completion if m.get("role") == "assistant"]
    return str(replies[-1].get("content") or "") if replies else ""


class ReasoningGym:
    """One reasoning-gym task, or a weighted composite of several."""

    def __init__(
        self,
        task: str | None = None,
        tasks: dict[str, float] | None = None,
        config: dict[str, Any] | None = None,
        chat: bool = True,
        system_prompt: str = "default",
        answer_tag: bool = True,
        seed: int = 0,
        size: int = 1_000_000,
        eval_size: int = 64,
    ) -> None:
        if (task is None) == (tasks is None):
            raise TriadError(
                "reasoning_gym: give one task ('reasoning_gym:<task>') or "
                "orchestrator.environment.args.tasks, not both"
            )
        if size < 1 or eval_size < 1:
            raise TriadError(f"reasoning_gym: size ({size}) and eval_size ({eval_size}) must be positive")
        self.library = _library()
        self.name = f"reasoning_gym:{task}" if task else "reasoning_gym"
        self.chat, self.answer_tag, self.size = chat, answer_tag, size
        self.system = self._system_prompt(system_prompt)
        self.train = self._dataset(task, tasks, config or {}, seed, size)
        self.held_out = self._dataset(task, tasks, config or {}, seed + size, eval_size)

    def _system_prompt(self, name: str) -> str:
        prompts = self.library.utils.SYSTEM_PROMPTS
        if name == NO_SYSTEM_PROMPT:
            return ""
        if name not in prompts:
            known = [*sorted(prompts), NO_SYSTEM_PROMPT]
            raise TriadError(f"reasoning_gym: system_prompt {name!r} is not one of {known}")
        return prompts[name]

    def _dataset(
        self, task: str | None, tasks: dict[str, float] | None, config: dict, seed: int, size: int
    ) -> Any:
        lib = self.library
        known = sorted(lib.factory.DATASETS)
        names = [task] if task else list(tasks or {})
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise TriadError(f"reasoning_gym: unknown task(s) {unknown or names}; tasks are {known}")
        try:
            if task:
                return lib.create_dataset(task, **config, seed=seed, size=size)
            stray = sorted(set(config) - set(names))
            if stray:
                raise TriadError(f"reasoning_gym: config for {stray}, which are not in tasks {names}")
            specs = [
                lib.composite.DatasetSpec(n, float(w), dict(config.get(n, {})))
                for n, w in (tasks or {}).items()
            ]
            return lib.create_dataset("composite", datasets=specs, seed=seed, size=size)
        except (TypeError, ValueError, AssertionError) as e:
            raise TriadError(f"reasoning_gym: bad config for {names}: {e or type(e).__name__}") from None

    def prompt_of(self, split: str, index: int) -> Prompt:
        entry = (self.train if split == "train" else self.held_out)[index]
        meta = {"split": split, "index": str(index), "task": str(entry["metadata"]["source_dataset"])}
        question = entry["question"]
        if self.chat:
            system = [{"role": "system", "content": self.system}] if self.system else []
            messages = [*system, {"role": "user", "content": question}]
            return Prompt(messages=messages, answer=str(entry["answer"]), meta=meta)
        text = f"{self.system}\n{question}\n" if self.system else f"{question}\n"
        return Prompt(text=text, answer=str(entry["answer"]), meta=meta)

    def sample(self, rng: random.Random) -> Prompt:
        return self.prompt_of("train", rng.randrange(self.size))

    def dataset(self) -> Indexed:
        """The training split, each entry once per epoch (made when drawn)."""
        return Indexed(self.size, lambda i: self.prompt_of("train", i))

    def eval_prompts(self) -> list[Prompt]:
        return [self.prompt_of("eval", i) for i in range(len(self.held_out))]

    def answer_of(self, completion: str | list[dict]) -> str | None:
        text = reply_text(completion)
        return self.library.utils.extract_answer(text) if self.answer_tag else text.strip()

    def reward(self, prompt: Prompt, completion: str | list[dict]) -> float:
        dataset = self.train if prompt.meta["split"] == "train" else self.held_out
        entry = dataset[int(prompt.meta["index"])]
        return float(dataset.score_answer(self.answer_of(completion), entry))
