"""Reverse-text and addition: procedural single-turn tasks with verifiable rewards."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from orchestrator.prompt import Prompt


def positional_match(prediction: str, target: str) -> float:
    """Share of positions where the two strings agree, over the longer length."""
    longest = max(len(prediction), len(target))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(prediction, target, strict=False)) / longest


@dataclass(frozen=True)
class ReverseText:
    """Reverse a short lowercase word; partial credit per matching position."""

    name: str = "reverse"
    min_len: int = 3
    max_len: int = 5

    def format(self, word: str) -> Prompt:
        return Prompt(text=f"reverse {word}: ", answer=word[::-1])

    def sample(self, rng: random.Random) -> Prompt:
        n = rng.randint(self.min_len, self.max_len)
        return self.format("".join(rng.choices(string.ascii_lowercase, k=n)))

    def reward(self, prompt: Prompt, completion: str) -> float:
        return positional_match(completion.strip(), prompt.answer)


@dataclass(frozen=True)
class Addition:
    """Add two single digits: "3+5=" -> "8"; reward 1 for the exact answer, else 0."""

    name: str = "addition"
    max_digit: int = 9

    def sample(self, rng: random.Random) -> Prompt:
        a, b = rng.randint(0, self.max_digit), rng.randint(0, self.max_digit)
        return Prompt(text=f"{a}+{b}=", answer=str(a + b))

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion.strip() == prompt.answer else 0.0
