"""A task's prompt: the leaf both the environment API (`orchestrator/environments.py`) and the
built-in environments (`orchestrator/envs/`) build on, so neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    text: str = ""
    answer: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None  # a chat prompt, OpenAI format

    @property
    def is_chat(self) -> bool:
        return self.messages is not None
