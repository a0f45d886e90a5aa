"""A model turn through the server pool: its chat rendered, and its ids split into a message.

The chat template is the served model's own (`/v1/chat/completions/render`).
A sampled turn is split into content, reasoning and tool calls by the server's
own parsers (`/v1/chat/completions/derender`, set by `inference.tool_parser`
and `inference.reasoning_parser`), so every format vLLM parses works. A
server without derender (SGLang) gets triad's own Hermes parser of the text,
and only `tool_parser = "hermes"` is served that way.
"""

from __future__ import annotations

from orchestrator.episodes.render import PROBE_USER, ChatRenderer
from orchestrator.episodes.tool_calls import ParsedTurn, parse_tool_calls, probe_call, turn_from_message
from orchestrator.servers.client import Completion
from orchestrator.servers.pool import Server, ServerPool
from shared.errors import TriadError

HERMES = "hermes"
PROBE_REASONING = "Let me think this over first."


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

    async def derender(
        self, token_ids: list[int], finish_reason: str, prompt_ids: list[int], server: Server | None
    ) -> dict | None:
        async def call(s: Server) -> dict | None:
            messages = [PROBE_USER]  # the parsers read only tools and options
            return await s.client.chat.derender(
                token_ids, finish_reason, messages, self.tools, self.options, prompt_ids
            )

        return (await self.pool.request(call, "parsing a model turn", server))[0]

    async def check(self, renderer: ChatRenderer, tool: str | None) -> None:
        """The template's own rendering of a reply (its reasoning, and a call of `tool`) must come back
        split by the server's parsers: a server started with parsers that do not fit the model fails here."""
        reply: dict = {"role": "assistant", "content": "Done.", "reasoning_content": PROBE_REASONING}
        if tool is not None:
            reply = {**reply, "tool_calls": [probe_call(tool)]}
        prompt = await renderer.prompt([PROBE_USER])
        full = await renderer.render([PROBE_USER, reply], False)
        if full[: len(prompt)] != prompt:  # the template rewrites a last reply (Qwen3, thinking off)
            return
        message = await self.derender(full[len(prompt) :], "stop", prompt, None)
        if message is None:
            return
        content = message.get("content") or ""
        if PROBE_REASONING in content:
            raise TriadError(
                "the server's reasoning parser does not split this model's reasoning from its answer: set "
                "inference.reasoning_parser (vLLM's --reasoning-parser) to one that fits the model"
            )
        names = [(c.get("function") or {}).get("name") for c in message.get("tool_calls") or []]
        if tool is not None and names and names != [tool]:
            raise TriadError(
                f"the server's tool parser ({self.tool_parser}) reads this model's call of {tool!r} back as "
                f"calls of {names!r}: every call would be answered as an unknown tool; set "
                "inference.tool_parser (vLLM's --tool-call-parser) to one that reads the tool's name"
            )
        if tool is not None and not names and tool in content:
            raise TriadError(
                f"the server's tool parser does not read this model's tool calls back (it left a call of "
                f"{tool!r} in the text): set inference.tool_parser (vLLM's --tool-call-parser) to one "
                "that fits the model's chat template"
            )

    async def parse(self, c: Completion, prompt_ids: list[int], server: Server | None) -> ParsedTurn:
        """The turn `c` (sampled after `prompt_ids`) as content, reasoning and checked tool calls. A turn
        that ended on its end-of-turn token is parsed without it, as vLLM's chat route parses a reply:
        derender keeps special tokens' text, and `<|im_end|>` is no part of the answer."""
        ids = c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids
        if not ids:  # the model ended its turn at once: an empty reply
            return ParsedTurn(content="")
        message = await self.derender(ids, c.finish_reason, prompt_ids, server)
        if message is not None:
            return turn_from_message(message)
        if not self.tools:
            return ParsedTurn(content=c.text.strip())
        if self.tool_parser not in (HERMES, "auto"):
            raise TriadError(
                "the inference server has no /v1/chat/completions/derender, so only Hermes tool calls "
                f"can be parsed, but inference.tool_parser is {self.tool_parser!r}: serve the model with "
                "vLLM (`--enable-scale-out`)"
            )
        return parse_tool_calls(c.text)
