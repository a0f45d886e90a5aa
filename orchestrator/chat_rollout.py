"""A chat episode: the model's turns, its tool calls run, the environment's replies, as tokens.

The prompt is rendered once with the model's chat template; each model turn is
sampled by continuing from the exact ids so far (`/v1/completions` with token
ids), and what follows it — tool results, an environment's user message, the
next generation prompt — is appended as ids the model did not sample
(`loss_mask` false, logprob 0). The trainer therefore sees exactly the ids the
sampler was conditioned on and sampled (see `orchestrator/chat.py`).

Tool calls are parsed in the Hermes/Qwen `<tool_call>{json}</tool_call>` format
(`orchestrator.tool_parser`) and run by the environment's tools, each bounded by
`orchestrator.env_timeout_s`; a malformed call, an unknown tool, an error or a
timeout goes back to the model as a tool message and is in the conversation the
reward sees. The episode ends when the model makes no tool call and the
environment has no reply, on a truncated turn, or after `max_turns` model turns.
"""

from __future__ import annotations

import asyncio
import random
from typing import Protocol

from orchestrator.chat import ChatRenderer, check_messages
from orchestrator.environments import Environment, Prompt, env_tools, max_turns, respond, score
from orchestrator.pool import Server, ServerPool
from orchestrator.rollout import Sample
from orchestrator.tools import ParsedTurn, ToolRunner, assistant_message, parse_tool_calls
from shared.config import OrchestratorConfig
from shared.errors import TriadError

PARSERS = {"hermes": parse_tool_calls}


class Episodes(Protocol):
    """Chat or agent episodes of one environment."""

    async def start(self, prompt: Prompt) -> None: ...

    async def group(self, prompt: Prompt, size: int) -> list[Sample]: ...

    async def stop(self) -> None: ...


def episodes_for(env: Environment, pool: ServerPool, oc: OrchestratorConfig) -> Episodes | None:
    """Agent episodes for an environment with `run_agent`; chat episodes by config, for an
    environment with tools or one whose prompts are chat; None for plain text rollouts."""
    if hasattr(env, "run_agent"):
        from orchestrator.proxy import AgentRollouts

        return AgentRollouts(env, pool, oc)
    if oc.chat or env_tools(env) or env.sample(random.Random(0)).is_chat:
        return ChatRollouts(env, pool, oc)
    return None


def pool_renderer(pool: ServerPool, tools: list[dict] | None, options: dict) -> ChatRenderer:
    """A renderer whose requests go to the pool's servers, with its retries."""

    async def render(messages: list[dict], generation_prompt: bool) -> list[int]:
        async def call(server: Server) -> list[int]:
            return await server.client.tokenize_chat(messages, tools, generation_prompt, options)

        return (await pool.request(call, "rendering chat messages"))[0]

    async def tokenize(text: str) -> list[int]:
        return (await pool.request(lambda server: server.client.tokenize(text), "tokenizing"))[0]

    return ChatRenderer(render, tokenize)


def text_of(conversation: list[dict]) -> str:
    """A conversation as text, for environments that score text."""
    return "\n".join(m.get("content") or "" for m in conversation)


class ChatRollouts:
    """Chat episodes of one environment (its tools and template options fixed)."""

    def __init__(self, env: Environment, pool: ServerPool, oc: OrchestratorConfig) -> None:
        self.env, self.pool, self.oc = env, pool, oc
        self.runner = ToolRunner(env_tools(env), oc.env_timeout_s)
        self.renderer = pool_renderer(pool, self.runner.schemas or None, oc.chat_template_kwargs)
        self.where = f"environment {env.name!r}"

    def messages(self, prompt: Prompt) -> list[dict]:
        """The prompt as checked chat messages (a text prompt becomes one user message)."""
        if prompt.is_chat:
            return check_messages(prompt.messages, f"{self.where}: prompt")
        return [{"role": "user", "content": prompt.text}]

    async def start(self, prompt: Prompt) -> None:
        """Render one prompt and the template's turn closing: a template that cannot serve
        (none at all, or one that rewrites history when messages are added) fails here, at start."""
        try:
            await self.renderer.prompt(self.messages(prompt))
            await self.renderer.after_turn([], [{"role": "user", "content": "."}])
        except TriadError as e:
            if str(e).startswith(self.where):
                raise
            raise TriadError(f"{self.where}: {e}") from None

    async def stop(self) -> None:
        return None

    async def group(self, prompt: Prompt, size: int) -> list[Sample]:
        """`size` scored episodes of `prompt`."""
        samples = list(await asyncio.gather(*(self.episode(prompt) for _ in range(size))))
        seen = [s.conversation if prompt.is_chat else s.completion for s in samples]
        rewards = await asyncio.gather(*(score(self.env, prompt, x, self.oc.env_timeout_s) for x in seen))
        for sample, reward in zip(samples, rewards, strict=True):
            sample.reward = reward
        return samples

    def parse(self, text: str) -> ParsedTurn:
        if not self.runner.names:
            return ParsedTurn(content=text.strip(), calls=[], errors=[])
        return PARSERS[self.oc.tool_parser](text)

    async def replies(self, prompt: Prompt, parsed: ParsedTurn, sample: Sample) -> list[dict]:
        """What follows a model turn: the results of its tool calls, or the environment's user message."""
        if parsed.calls or parsed.errors:
            results = await self.runner.run_turn(parsed)
            sample.tool_calls += len(parsed.calls) + len(parsed.errors)
            sample.tool_errors += sum(r["content"].startswith("error: ") for r in results)
            return results
        if not hasattr(self.env, "respond"):
            return []
        seen = sample.conversation if prompt.is_chat else text_of(sample.conversation)
        reply = await respond(self.env, prompt, seen, self.oc.env_timeout_s)
        return [] if reply is None else [{"role": "user", "content": reply}]

    async def episode(self, prompt: Prompt) -> Sample:
        sample, server = Sample(), None
        sample.add(await self.renderer.prompt(self.messages(prompt)), sampled=False)
        for turn in range(max(max_turns(self.env), 1)):
            (c,), server, version = await self.pool.complete(sample.input_ids, 1, prefer=server)
            sample.server = server.url
            sample.version = version if turn == 0 else min(sample.version, version)
            sample.add(c.token_ids, sampled=True, logprobs=c.logprobs)
            sample.truncated, sample.turns = c.truncated, turn + 1
            parsed = self.parse(c.text)
            sample.conversation.append(assistant_message(parsed))
            if c.truncated or turn + 1 == max_turns(self.env):
                break
            new = await self.replies(prompt, parsed, sample)
            if not new:
                break
            sample.conversation += new
            sample.add(await self.renderer.after_turn(c.token_ids, new), sampled=False)
        sample.completion = text_of(sample.conversation)
        return sample
