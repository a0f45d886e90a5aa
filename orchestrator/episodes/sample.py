"""One rollout as the trainer will see it: token ids, which of them were sampled, and their logprobs.

Token ids and logprobs are the server's own. A sample's version is the oldest
version any of its turns was sent to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.servers.client import Completion


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
    episode: int | None = None  # its episode's place in the group where an episode makes several
    # samples (an agent's calls); None: the sample is an episode of its own

    def add(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.input_ids += ids
        self.loss_mask += [sampled] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def served_by(self, url: str) -> None:
        if url not in self.servers:
            self.servers.append(url)

    def sampled_at(self, version: int) -> None:
        """A model turn was sent to a server serving `version`."""
        self.version = version if self.turns == 0 else min(self.version, version)

    def record_turn(self, c: Completion, server: str, version: int) -> None:
        """A model turn `server` sampled at `version`: its ids and logprobs, and whether it was cut."""
        self.sampled_at(version)
        self.served_by(server)
        self.add(c.token_ids, sampled=True, logprobs=c.logprobs)
        self.truncated, self.turns = c.truncated, self.turns + 1

    @property
    def completion_tokens(self) -> int:
        return sum(self.loss_mask)
