"""Which prompt each group gets: a sequence of draws that is a pure function of the seed, resumable.

Draw k is the k-th prompt the producer asks for (k = 0, 1, ...). Its prompt depends on
(seed, k) alone:

- an environment with a dataset (`dataset()`: a sequence of N prompts) gives, in epoch
  e = k // N, position i = k % N, the prompt at index perm(seed, e)[i], perm(seed, e) a
  seeded shuffle of range(N): each prompt once per epoch;
- any other environment draws procedurally: `sample(random.Random(f"{seed}-draw-{k}"))`.

A draw is *consumed* once its group is taken into a batch, dropped as too stale, skipped
for equal rewards, or failed; until then it is *open* (generating, queued). Each batch's
marker records the draws its groups came from (`prompt_draws`, in batch order) and the
position after it (`draws`: the next new draw and the open ones). A restart resumes from
the newest batch's position: it draws the open draws again first, oldest first, then goes
on with new ones. So every draw is consumed exactly once across kills and restarts, by
the lineage of published batches: none skipped, none repeated (a group in flight at the
kill was never published, and is drawn again).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.prompt import Prompt
from shared.errors import TriadError
from shared.rundir import RunDir

log = logging.getLogger("triad.orchestrator")


@dataclass(frozen=True)
class Draw:
    number: int  # k
    prompt: Prompt
    epoch: int | None = None  # dataset draws: k // N and the dataset index drawn
    index: int | None = None


@dataclass
class Position:
    """Where the draws stand: the next new draw, and the earlier ones not yet consumed."""

    next: int = 0
    open: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"next": self.next, "open": sorted(self.open)}

    @staticmethod
    def from_json(raw: Any, where: str) -> Position:
        if not (
            isinstance(raw, dict)
            and isinstance(raw.get("next"), int)
            and isinstance(raw.get("open"), list)
            and all(isinstance(k, int) and 0 <= k < raw["next"] for k in raw["open"])
        ):
            expected = "{'next': int, 'open': [draws before next]}"
            raise TriadError(f"{where}: 'draws' must be {expected}, got {raw!r}")
        return Position(raw["next"], sorted(set(raw["open"])))


class Indexed(Sequence[Prompt]):
    """A dataset of `size` prompts made on demand by `prompt_at(index)` (a library's split, say)."""

    def __init__(self, size: int, prompt_at: Callable[[int], Prompt]) -> None:
        self.size, self.prompt_at = size, prompt_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Prompt:  # type: ignore[override]
        if not 0 <= index < self.size:
            raise IndexError(index)
        return self.prompt_at(index)


def dataset_of(env: Any) -> Sequence[Prompt] | None:
    """The environment's training dataset, or None if it draws procedurally."""
    if not hasattr(env, "dataset"):
        return None
    items = env.dataset()
    if len(items) == 0:
        raise TriadError(f"environment {env.name!r}: dataset() is empty")
    return items


class Draws:
    """The producer's draws, from a position; counts what is open to record each batch's position."""

    def __init__(self, env: Any, seed: int | str, position: Position) -> None:
        self.env, self.seed = env, seed
        self.dataset = dataset_of(env)
        self.next = position.next
        self.again = sorted(position.open)  # drawn before the restart, never consumed
        self.outstanding: set[int] = set()  # drawn by this producer, not yet consumed
        self._perm: tuple[int, list[int]] | None = None

    @property
    def size(self) -> int | None:
        return None if self.dataset is None else len(self.dataset)

    def draw(self) -> Draw:
        number = self.again.pop(0) if self.again else self._new()
        self.outstanding.add(number)
        return self.at(number)

    def _new(self) -> int:
        number, self.next = self.next, self.next + 1
        return number

    def at(self, number: int) -> Draw:
        """Draw `number`'s prompt: a pure function of (seed, number)."""
        if self.dataset is None:
            return Draw(number, self.env.sample(random.Random(f"{self.seed}-draw-{number}")))
        epoch, position = divmod(number, len(self.dataset))
        index = self.permutation(epoch)[position]
        return Draw(number, self.dataset[index], epoch, index)

    def permutation(self, epoch: int) -> list[int]:
        if self._perm is None or self._perm[0] != epoch:
            order = list(range(len(self.dataset or ())))
            random.Random(f"{self.seed}-epoch-{epoch}").shuffle(order)
            self._perm = (epoch, order)
        return self._perm[1]

    def consumed(self, number: int) -> None:
        self.outstanding.discard(number)

    def position(self) -> Position:
        """What a restart resumes from: the next new draw, and every earlier one not consumed."""
        return Position(self.next, sorted(self.outstanding | set(self.again)))

    def marker_fields(self, drawn: list[int]) -> dict[str, Any]:
        """What a batch's marker records: its groups' draws, and the position after it."""
        return {"draws": self.position().to_json(), "prompt_draws": drawn}

    def metrics(self) -> dict[str, float]:
        """`epoch`, for the step's row (none for a procedural environment)."""
        done = self.epochs_done()
        return {} if done is None else {"epoch": done}

    def epochs_done(self) -> float | None:
        """Dataset epochs whose every draw is consumed, as a fraction (1.5: half-way into the second)."""
        if self.dataset is None:
            return None
        first_open = min(self.outstanding | set(self.again), default=self.next)
        return round(first_open / len(self.dataset), 4)


def resume_position(rundir: RunDir, run_id: str, step: int) -> Position:
    """Where the draws stand after batch `step` (its marker's `draws`); the start for step 0."""
    if step == 0:
        return Position()
    marker = rundir.rollouts.marker(step, run_id)
    where = rundir.rollouts.describe_marker(step)
    raw = getattr(marker, "draws", None) if marker is not None else None
    if raw is None:
        log.warning(
            "batch %d records no prompt position (%s; written before triad recorded one): "
            "the prompts are drawn from the start again",
            step,
            where,
        )
        return Position()
    return Position.from_json(raw, where)
