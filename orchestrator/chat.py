"""Chat prompts as token ids, faithful to what was sampled.

A chat prompt is rendered once with the served model's own chat template
(vLLM's `/tokenize` with `messages`, `tools` and `orchestrator.chat_template_kwargs`).
From then on an episode only ever appends: the ids the model sampled, and the
ids of what the environment adds (tool results, user messages), rendered on
their own. History is never rendered again, so a template that rewrites
earlier turns (Qwen3's drops earlier `<think>` blocks) cannot change the tokens
the model was conditioned on, and the trainer sees exactly those.

The ids the environment adds after a model turn are the template's closing of
an assistant message (what of it the model did not sample, e.g. the newline after
`<|im_end|>`), then the new messages and the generation prompt as the template
renders them after a fixed probe conversation (`PROBE`). A template for which
that is not a clean suffix is refused with an error naming it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import TriadError

PROBE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
Render = Callable[[list[dict], bool], Awaitable[list[int]]]  # (messages, generation prompt) -> ids
Tokenize = Callable[[str], Awaitable[list[int]]]


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


def find_last(haystack: list[int], needle: list[int]) -> int:
    """Index of the last occurrence of `needle` in `haystack`, or -1."""
    for i in range(len(haystack) - len(needle), -1, -1):
        if haystack[i : i + len(needle)] == needle:
            return i
    return -1


class ChatRenderer:
    """Renders one environment's chat (its tools fixed) through a server's chat template."""

    def __init__(self, render: Render, tokenize: Tokenize) -> None:
        self.render, self.tokenize = render, tokenize
        self._closing: list[int] | None = None
        self._probe: list[int] | None = None

    async def prompt(self, messages: list[dict]) -> list[int]:
        return await self.render(messages, True)

    async def closing(self) -> list[int]:
        """The tokens the template writes after an assistant message's content (e.g. `<|im_end|>`, `\\n`)."""
        if self._closing is None:
            rendered = await self.render(PROBE, False)
            content = await self.tokenize(PROBE[-1]["content"])
            at = find_last(rendered, content)
            if at < 0:
                raise TriadError("the chat template does not render an assistant message's content as is")
            self._probe, self._closing = rendered, rendered[at + len(content) :]
        return self._closing

    async def after_turn(self, sampled: list[int], new_messages: list[dict]) -> list[int]:
        """The ids that follow a sampled assistant turn: the rest of its closing, then `new_messages`
        and the generation prompt for the next turn."""
        closing = await self.closing()
        done = next((n for n in range(len(closing), 0, -1) if sampled[-n:] == closing[:n]), 0)
        full = await self.render(PROBE + new_messages, True)
        if full[: len(self._probe)] != self._probe:
            raise TriadError(
                "the chat template renders a conversation differently once messages are added after it: "
                "triad cannot append environment messages as tokens without re-rendering history"
            )
        return closing[done:] + full[len(self._probe) :]
