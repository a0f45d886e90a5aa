"""A model turn through the server pool: its chat rendered, and its ids split into a message.

The chat template is the served model's own (`/v1/chat/completions/render`).
A sampled turn is split into content, reasoning and tool calls by the server's
own parsers (`/v1/chat/completions/derender`, set by `orchestrator.tool_parser`
and `orchestrator.reasoning_parser`), so every format vLLM parses works. A
server without derender (SGLang) gets triad's own Hermes parser of the text,
and only `tool_parser = "hermes"` is served that way.
"""

from __future__ import annotations

from orchestrator.chat import ChatRenderer
from orchestrator.client import Completion
from orchestrator.pool import Server, ServerPool
from orchestrator.tool_calls import ParsedTurn, parse_tool_calls, turn_from_message
from shared.errors import TriadError

HERMES = "hermes"


def pool_renderer(pool: ServerPool, tools: list[dict] | None, options: dict) -> ChatRenderer:
    """A renderer whose requests go to the pool's servers, with its retries."""

    async def render(messages: list[dict], generation_prompt: bool) -> list[int]:
        async def call(server: Server) -> list[int]:
            return await server.client.chat.render(messages, tools, generation_prompt, options)

        return (await pool.request(call, "rendering chat messages"))[0]

    return ChatRenderer(render)


class TurnParser:
    """Splits sampled turns of one environment (its tools fixed) into assistant messages."""

    def __init__(self, pool: ServerPool, tools: list[dict] | None, options: dict, tool_parser: str) -> None:
        self.pool, self.tools, self.options, self.tool_parser = pool, tools, options, tool_parser

    async def parse(self, c: Completion, prompt_ids: list[int], server: Server | None) -> ParsedTurn:
        """The turn `c` (sampled after `prompt_ids`) as content, reasoning and checked tool calls."""

        async def derender(s: Server) -> dict | None:
            messages = [{"role": "user", "content": "."}]  # the parsers read only tools and options
            return await s.client.chat.derender(
                c.token_ids, c.finish_reason, messages, self.tools, self.options, prompt_ids
            )

        message, _ = await self.pool.request(derender, "parsing a model turn", server)
        if message is not None:
            return turn_from_message(message)
        if not self.tools:
            return ParsedTurn(content=c.text.strip())
        if self.tool_parser not in (HERMES, "auto"):
            raise TriadError(
                "the inference server has no /v1/chat/completions/derender, so only Hermes tool calls "
                f"can be parsed, but orchestrator.tool_parser is {self.tool_parser!r}: serve the model with "
                "vLLM (`--enable-scale-out`)"
            )
        return parse_tool_calls(c.text)
