"""Chat prompts as token ids, faithful to what was sampled.

A chat prompt is rendered once with the served model's own chat template
(vLLM's `/v1/chat/completions/render` with `messages`, `tools` and
`orchestrator.chat.template_kwargs`). From then on an episode only ever
appends: the ids the model sampled, and the ids of what follows them. History
is never rendered again, so a template that rewrites earlier turns (Qwen3's
drops earlier `<think>` blocks and writes an empty one into the last assistant
message only) cannot change the tokens the model was conditioned on, and the
trainer sees exactly those.

What follows a sampled turn (the rest of its closing, the tool results or the
environment's user message, the next generation prompt) is found inside a
rendering of the whole exchange, not required to extend a shorter rendering:
the template renders a probe conversation (a user message, the assistant turn
with its tool calls, the new messages, the generation prompt) twice, with two
different marks where the assistant turn's text ends (its content, or the
arguments of its last tool call). Both renderings agree after the mark; that
common tail is what the template writes after the model's text. The sampled
turn ended on its end-of-turn token (`<|im_end|>`, `<|eot_id|>`, `</s>`...):
the tail is taken from just after that token's first place in it. A turn that
ended on a token the tail does not hold (gpt-oss ends a final answer with
`<|return|>`, which history writes as `<|end|>`) stands for the tail's first
token; in a tool-call turn's tail, whose first ids close the last call's
arguments, it stands for the template's end of turn (the first id of a content
turn's tail) instead. A template that does not render the assistant's text at all, or cannot
render the new messages, is refused with an error naming why.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.failures import EpisodeEnded
from shared.errors import TriadError

PROBE_USER = {"role": "user", "content": "."}
MARKS = ("A", "B")  # two texts that render to tokens differing in one place
Render = Callable[[list[dict], bool], Awaitable[list[int]]]  # (messages, generation prompt) -> ids


class TextNotRendered(TriadError):
    """The template does not render an assistant message's text: where a sampled turn ends in it
    cannot be told (at start: the template cannot serve the run; later: that turn's episode ends)."""


class ChatMessage(BaseModel):
    """One OpenAI-format message, as environments give them."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


def check_messages(messages: Any, where: str) -> list[dict]:
    """The messages as plain dicts; TriadError in one line naming the first bad one."""
    if not isinstance(messages, list | tuple) or not messages:
        raise TriadError(f"{where}: chat messages must be a non-empty list, got {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        try:
            checked = ChatMessage.model_validate(message)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "message"
            raise TriadError(f"{where}: message {i} is malformed ({field}: {first['msg']})") from None
        if checked.content is None and not checked.tool_calls:
            if checked.role != "assistant":
                raise TriadError(f"{where}: message {i} ({checked.role}) has neither content nor tool_calls")
            checked.content = ""  # an empty reply, as OpenAI clients (verifiers') echo one back: null
        out.append(checked.model_dump(exclude_none=True))
    return out


def probe_turn(turn: dict, mark: str) -> dict:
    """The assistant message `turn` with `mark` where its text ends: the arguments of its last tool
    call, or its content. Its tool calls keep their ids and names, which tool results refer to."""
    calls = turn.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": mark}
    probe_calls = [dict(c, function=dict(c["function"])) for c in calls]
    probe_calls[-1]["function"]["arguments"] = json.dumps({"triad": mark})
    return {"role": "assistant", "content": "", "tool_calls": probe_calls}


def common_tail(a: list[int], b: list[int]) -> list[int] | None:
    """The ids after the one place where `a` and `b` differ; None if they are equal."""
    if a == b:
        return None
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :] if n else []


def following(sampled: list[int], ended_on_token: bool, tail: list[int]) -> list[int]:
    """The ids of `tail` that follow a sampled turn: after the place of its last token in the tail;
    with no such place, the turn's end-of-turn token stands for the tail's first token."""
    if not ended_on_token or not sampled:
        return tail
    end = sampled[-1]
    at = tail.index(end) if end in tail else 0
    return tail[at + 1 :]


class ChatRenderer:
    """Renders one environment's chat (its tools fixed) through a server's chat template."""

    def __init__(self, render: Render) -> None:
        self.render = render

    async def prompt(self, messages: list[dict]) -> list[int]:
        return await self.render(messages, True)

    async def tail(self, turn: dict, new_messages: list[dict]) -> list[int]:
        """What the template writes after the text of the assistant message `turn` when
        `new_messages` and a generation prompt follow it."""
        a, b = await asyncio.gather(
            *(self.render([PROBE_USER, probe_turn(turn, mark), *new_messages], True) for mark in MARKS)
        )
        tail = common_tail(a, b)
        if tail is None:
            where = "its tool calls' arguments" if turn.get("tool_calls") else "its content"
            raise TextNotRendered(
                f"the chat template does not render an assistant message's text ({where}): triad cannot tell "
                "where a sampled turn ends in it"
            )
        return tail

    async def after_turn(
        self, sampled: list[int], ended_on_token: bool, turn: dict, new_messages: list[dict]
    ) -> list[int]:
        """The ids that follow the sampled assistant turn `turn` (`sampled` its ids): the rest of its
        closing, then `new_messages` and the generation prompt for the next turn. A turn the template
        does not render the text of (gpt-oss's with two calls) ends its episode (EpisodeEnded)."""
        try:
            tail = await self.tail(turn, new_messages)
        except TextNotRendered as e:
            raise EpisodeEnded(str(e), "render") from None
        if ended_on_token and sampled and sampled[-1] not in tail and turn.get("tool_calls"):
            # a tool-call turn ended on another end token (Qwen's <|endoftext|>, Llama's <|eom_id|>):
            # its calls' closing was sampled, and what follows starts after the template's end of turn
            end = (await self.tail({"role": "assistant", "content": MARKS[0]}, new_messages))[0]
            if end in tail:
                return tail[tail.index(end) + 1 :]
        return following(sampled, ended_on_token, tail)
