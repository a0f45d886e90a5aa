"""Agent episodes: any OpenAI-client program, trained through a per-episode proxy.

An agent environment has, instead of (or beside) chat prompts,

    async def run_agent(self, prompt, base_url: str, model: str) -> Any    # or a plain function
    def reward(self, prompt, episode: AgentEpisode) -> float               # or async

`run_agent` runs any program against `base_url` (an OpenAI-compatible
chat-completions endpoint with tools, served by the orchestrator for that
episode alone); `reward` scores the episode: what `run_agent` returned
(`episode.result`), every call with its reply (`episode.calls`) and the
conversation of the last call (`episode.conversation`).

How calls become samples: a call whose messages are the previous call's
messages, its reply as returned, and new messages (tool results, user turns)
*extends* it; a chain of calls that extend each other is one sample, whose ids
are the first call's rendered prompt, then for each call the sampled ids
(loss_mask true) and the rendered new messages (loss_mask false). A call that
does not extend the previous one (the agent rewrote or dropped history) starts a
new chain: a new sample. Every sample of an episode gets the episode's reward;
advantages are taken over the samples of the prompt's group.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import untrusted
from orchestrator.chat import ChatRenderer, check_messages
from orchestrator.pool import ServerPool
from orchestrator.rollout import Sample
from orchestrator.tools import ParsedTurn, assistant_message, parse_tool_calls
from shared.config import OrchestratorConfig
from shared.errors import TriadError

ASSISTANT_KEYS = ("role", "content", "tool_calls")


def normal(message: dict) -> dict:
    """A message as compared for chaining: its role, content ('' for none) and tool calls."""
    out = {"role": message.get("role"), "content": message.get("content") or ""}
    calls = [
        {"id": c.get("id"), "name": c.get("function", {}).get("name"), "args": _args(c)}
        for c in message.get("tool_calls") or []
    ]
    if calls:
        out["tool_calls"] = calls
    if message.get("role") == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def _args(call: dict) -> Any:
    raw = call.get("function", {}).get("arguments")
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw


@dataclass
class Call:
    messages: list[dict]
    reply: dict
    sampled: list[int]


@dataclass
class Chain:
    """Calls that extend each other, and the sample they make."""

    tools: list[dict] | None
    renderer: ChatRenderer
    sample: Sample = field(default_factory=Sample)
    last: Call | None = None

    def new_messages(self, messages: list[dict], tools: list[dict] | None) -> list[dict] | None:
        """The messages this call adds after the last call and its reply, or None if it does not extend."""
        if self.last is None or tools != self.tools:
            return None
        seen = [*self.last.messages, self.last.reply]
        if len(messages) <= len(seen):
            return None
        if [normal(m) for m in messages[: len(seen)]] != [normal(m) for m in seen]:
            return None
        return messages[len(seen) :]


@dataclass
class AgentEpisode:
    """What `reward` sees of an agent episode."""

    result: Any = None
    calls: list[Call] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)

    @property
    def conversation(self) -> list[dict]:
        last = self.calls[-1] if self.calls else None
        return [] if last is None else [*last.messages, last.reply]

    @property
    def samples(self) -> list[Sample]:
        return [c.sample for c in self.chains if c.sample.turns]


class EpisodeRecorder:
    """One episode's side of the proxy: turns each chat-completions call into token ids,
    samples it from the pool and records it."""

    def __init__(
        self,
        pool: ServerPool,
        oc: OrchestratorConfig,
        renderer_for: Callable[[list[dict] | None], ChatRenderer],
    ) -> None:
        self.pool, self.oc, self.renderer_for = pool, oc, renderer_for
        self.episode = AgentEpisode()
        self.closed = asyncio.Event()
        self.lock = asyncio.Lock()  # one call at a time: a chain is a sequence

    def close(self) -> None:
        self.closed.set()

    async def call(self, messages: list[dict], tools: list[dict] | None, max_tokens: int) -> dict | None:
        """The call's reply; None if the episode ended before it was done (the call is cancelled)."""
        work = asyncio.ensure_future(self.complete(messages, tools, max_tokens))
        ended = asyncio.ensure_future(self.closed.wait())
        await asyncio.wait({work, ended}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if not work.done():
            work.cancel()
            return None
        return None if work.cancelled() else work.result()

    async def complete(self, messages: list[dict], tools: list[dict] | None, max_tokens: int) -> dict:
        async with self.lock:
            chain = self.episode.chains[-1] if self.episode.chains else None
            new = chain.new_messages(messages, tools) if chain else None
            if new is None:
                chain = Chain(tools, self.renderer_for(tools))
                self.episode.chains.append(chain)
                ids = await chain.renderer.prompt(messages)
            else:
                ids = await chain.renderer.after_turn(chain.last.sampled, new)
            return await self._sample(chain, messages, ids, max_tokens)

    async def _sample(self, chain: Chain, messages: list[dict], ids: list[int], max_tokens: int) -> dict:
        """Sample the call; the chain's sample changes only once the reply is in, so a call
        cancelled by the end of its episode leaves it as it was."""
        sample = chain.sample
        (c,), server, version = await self.pool.complete(sample.input_ids + ids, 1, max_tokens=max_tokens)
        if self.closed.is_set():
            raise asyncio.CancelledError
        sample.add(ids, sampled=False)
        sample.version = version if sample.turns == 0 else min(sample.version, version)
        sample.served_by(server.url)
        sample.add(c.token_ids, sampled=True, logprobs=c.logprobs)
        sample.truncated, sample.turns = c.truncated, sample.turns + 1
        parsed = (
            parse_tool_calls(c.text)
            if chain.tools
            else ParsedTurn(content=c.text.strip(), calls=[], errors=[])
        )
        reply = assistant_message(parsed)
        sample.tool_calls += len(parsed.calls)
        sample.conversation = [*messages, reply]
        chain.last = Call(messages, reply, c.token_ids)
        self.episode.calls.append(chain.last)
        finish = "length" if c.truncated else ("tool_calls" if parsed.calls else "stop")
        prompt_tokens = len(sample.input_ids) - len(c.token_ids)
        return dict(message=reply, finish_reason=finish, prompt_tokens=prompt_tokens,
                    completion_tokens=len(c.token_ids))  # fmt: skip


async def run_agent(env, prompt, base_url: str, model: str, timeout: float) -> Any:
    """The environment's agent program, bounded by `timeout`; a plain function runs in a thread."""
    async with asyncio.timeout(timeout):
        return await untrusted.call(env.run_agent, prompt, base_url, model)


def check_tools(raw: Any) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in raw):
        raise TriadError("tools must be a list of OpenAI function tools ({'type': 'function', ...})")
    return raw


def check_request(body: Any, max_tokens: int) -> tuple[list[dict], list[dict] | None, int]:
    """(messages, tools, max_tokens) of a chat-completions body; TriadError naming what is wrong."""
    if not isinstance(body, dict):
        raise TriadError("the body must be a JSON object")
    if body.get("stream"):
        raise TriadError("stream is not supported by the training proxy")
    if body.get("n", 1) != 1:
        raise TriadError("n must be 1")
    messages = check_messages(body.get("messages"), "request")
    asked = body.get("max_completion_tokens")
    asked = body.get("max_tokens") if asked is None else asked
    asked = max_tokens if asked is None else asked
    if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
        raise TriadError(f"max_tokens must be a positive integer, got {asked!r}")
    return messages, check_tools(body.get("tools")), min(asked, max_tokens)
