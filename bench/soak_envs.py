"""Environments that misbehave on purpose, for the fault soak (`bench/soak.py`).

Each wraps a built-in task and, on a seeded share of calls, makes its reward, respond or tool
hang past `orchestrator.environment.timeout_s`, raise, or return a megabyte where a short answer was
expected. What was injected is written, by kind, to the JSON file named by `TRIAD_SOAK_COUNTS`
after each fault, so a soak can check that the run counted every one. Loaded by the orchestrator
as `orchestrator.environment.name = "bench.soak_envs:faulty_addition"` (or `faulty_calculator`).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.envs.basic import Addition
from orchestrator.envs.calculator import ChatCalculator
from orchestrator.envs.calculator import calculate as exact_calculate
from orchestrator.prompt import Prompt

COUNTS_VAR = "TRIAD_SOAK_COUNTS"
MEGABYTE = "9" * 1_000_000


class Injector:
    """Which calls misbehave and how, seeded per process; counted by kind."""

    def __init__(self, share: float, seed: int, hang_s: float) -> None:
        self.share, self.rng, self.hang_s = share, random.Random(seed), hang_s
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def draw(self, where: str, kinds: tuple[str, ...]) -> str | None:
        with self.lock:
            if self.rng.random() >= self.share:
                return None
            kind = self.rng.choice(kinds)
            self.counts[f"{where}_{kind}"] += 1
            path = os.environ.get(COUNTS_VAR)
            if path:
                Path(path).write_text(json.dumps(self.counts, indent=1))
            return kind

    def misbehave(self, where: str, kinds: tuple[str, ...]) -> str | None:
        """Hang or raise here, or return "huge" for the caller to answer with a megabyte."""
        kind = self.draw(where, kinds)
        if kind == "hang":
            time.sleep(self.hang_s)
        elif kind == "raise":
            raise RuntimeError(f"soak: injected {where} error")
        return kind


INJECTOR = Injector(float(os.environ.get("TRIAD_SOAK_SHARE", "0.03")), 0, 30.0)


@dataclass(frozen=True)
class FaultyAddition:
    """The embedded default's addition, whose reward sometimes hangs, raises or returns a megabyte."""

    name: str = "addition"
    inner: Addition = field(default_factory=Addition)

    def sample(self, rng: random.Random) -> Prompt:
        return self.inner.sample(rng)

    def reward(self, prompt: Prompt, completion: str) -> Any:
        if INJECTOR.misbehave("reward", ("hang", "raise", "huge")) == "huge":
            return MEGABYTE
        return self.inner.reward(prompt, completion)


def calculate(expression: str) -> str:
    """Evaluate an integer arithmetic expression."""
    if INJECTOR.misbehave("tool", ("hang", "raise", "huge")) == "huge":
        return MEGABYTE
    return exact_calculate(expression)


@dataclass(frozen=True)
class FaultyCalculator:
    """The chat calculator, whose tool, respond and reward sometimes hang, raise or return a megabyte."""

    name: str = "calculator"
    max_turns: int = 3
    inner: ChatCalculator = field(default_factory=ChatCalculator)
    tools: ClassVar[tuple] = (calculate,)

    def sample(self, rng: random.Random) -> Prompt:
        return self.inner.sample(rng)

    def respond(self, prompt: Prompt, conversation: list[dict]) -> str | None:
        if INJECTOR.misbehave("respond", ("hang", "raise", "huge")) == "huge":
            return MEGABYTE
        return self.inner.respond(prompt, conversation)

    def reward(self, prompt: Prompt, conversation: list[dict]) -> Any:
        if INJECTOR.misbehave("reward", ("hang", "raise", "huge")) == "huge":
            return MEGABYTE
        return self.inner.reward(prompt, conversation)


faulty_addition = FaultyAddition
faulty_calculator = FaultyCalculator
