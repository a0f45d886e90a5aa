"""Agent episodes: any OpenAI-client program, trained through a per-episode proxy.

An agent environment has, instead of (or beside) chat prompts,

    async def run_agent(self, prompt, base_url: str, model: str, api_key: str) -> Any  # or plain
    def reward(self, prompt, episode: AgentEpisode) -> float               # or async

`run_agent` runs any program against `base_url` (an OpenAI-compatible
chat-completions endpoint with tools, served by the orchestrator for that
episode alone) with `api_key` as its key (`orchestrator.agents.proxy_token`; a
`run_agent` without that parameter is refused at start when a token is set).
Each episode runs in a thread of its own, an `async def` on an event loop of
that thread's own (`env_calls.py`): a blocking call in it cannot stall the loop
that serves the proxy, and `orchestrator.agents.timeout_s` fires. The calls of an
episode prefer the server that answered its last call, whose cache holds the
conversation so far. `reward` scores the episode: what `run_agent` returned
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
import inspect
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from orchestrator import env_calls
from orchestrator.environments import env_metrics, group_rewards
from orchestrator.episodes.agent_proxy import AgentProxy
from orchestrator.episodes.render import ChatRenderer
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.seeds import UNSEEDED, Seeds
from orchestrator.episodes.tool_calls import assistant_message
from orchestrator.episodes.turns import TurnParser, pool_renderer
from orchestrator.servers.client import RequestRejected
from orchestrator.servers.pool import RolloutFailed, Server, ServerPool
from shared.config import OrchestratorConfig
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")

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
    ended_on_token: bool = True


@dataclass
class Chain:
    """Calls that extend each other, and the sample they make."""

    tools: list[dict] | None
    renderer: ChatRenderer
    parser: TurnParser
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
    failed: str = ""  # why a call failed on the server side: the episode is not an outcome to train on

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
        self, pool: ServerPool, oc: OrchestratorConfig, tool_parser: str, seeds: Seeds = UNSEEDED
    ) -> None:
        self.pool, self.oc, self.tool_parser = pool, oc, tool_parser
        self.seeds, self.asked = seeds, 0  # call i's request seeded at seeds.at(i)
        self.episode = AgentEpisode()
        self.server: Server | None = None  # the server that answered the last call: the next one prefers it
        self.closed = asyncio.Event()
        self.lock = asyncio.Lock()  # one call at a time: a chain is a sequence

    def close(self) -> None:
        self.closed.set()

    async def call(self, messages: list[dict], tools: list[dict] | None, max_tokens: int) -> dict | None:
        """The call's reply; None if the episode ended before it was done (the call is cancelled)."""
        work = asyncio.ensure_future(self.complete(messages, tools, max_tokens))
        work.add_done_callback(self._note_failure)
        ended = asyncio.ensure_future(self.closed.wait())
        await asyncio.wait({work, ended}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if not work.done():
            work.cancel()
            return None
        return None if work.cancelled() else work.result()

    def _note_failure(self, work: asyncio.Future) -> None:
        """A call that failed on the server side fails the episode; a request the server refused
        (a 400 to the agent, as a prompt over the context) is the agent's to handle."""
        if work.cancelled() or work.exception() is None:
            return
        error = work.exception()
        if (
            isinstance(error, TriadError)
            and not isinstance(error, RequestRejected)
            and not self.episode.failed
        ):
            self.episode.failed = str(work.exception())

    def new_chain(self, tools: list[dict] | None) -> Chain:
        options = self.oc.chat.template_kwargs
        parser = TurnParser(self.pool, tools, options, self.tool_parser)
        return Chain(tools, pool_renderer(self.pool, tools, options), parser)

    async def complete(self, messages: list[dict], tools: list[dict] | None, max_tokens: int) -> dict:
        async with self.lock:
            chain = self.episode.chains[-1] if self.episode.chains else None
            new = chain.new_messages(messages, tools) if chain else None
            if new is None:
                chain = self.new_chain(tools)
                self.episode.chains.append(chain)
                ids = await chain.renderer.prompt(messages)
            else:
                last = chain.last
                ids = await chain.renderer.after_turn(last.sampled, last.ended_on_token, last.reply, new)
            return await self._sample(chain, messages, ids, max_tokens)

    async def _sample(self, chain: Chain, messages: list[dict], ids: list[int], max_tokens: int) -> dict:
        """Sample the call; the chain's sample changes only once the reply is in, so a call
        cancelled by the end of its episode leaves it as it was."""
        sample = chain.sample
        before = sample.input_ids + ids
        seed = self.seeds.at(self.asked).value
        self.asked += 1
        (c,), server, version = await self.pool.complete(before, 1, self.server, max_tokens, seed)
        self.server = server
        parsed = await chain.parser.parse(c, before, server)
        if self.closed.is_set():
            raise asyncio.CancelledError
        sample.add(ids, sampled=False)
        sample.record_turn(c, server.url, version)
        reply = assistant_message(parsed)
        sample.tool_calls += len(parsed.calls)
        sample.conversation = [*messages, reply]
        chain.last = Call(messages, reply, c.token_ids, c.finish_reason == "stop")
        self.episode.calls.append(chain.last)
        finish = "length" if c.truncated else ("tool_calls" if parsed.calls else "stop")
        return {
            "message": reply,
            "finish_reason": finish,
            "prompt_tokens": len(before),
            "completion_tokens": len(c.token_ids),
        }


NO_TOKEN = "none"  # the api_key of agents on a proxy without a token (OpenAI clients need one)


def takes_api_key(run: Any) -> bool:
    try:
        parameters = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):  # no signature to read: pass it
        return True
    return any(p.name == "api_key" or p.kind is p.VAR_KEYWORD for p in parameters)


def check_agent(env: Any, oc: OrchestratorConfig) -> None:
    """A proxy with a token answers 401 to an agent that is not given it: refuse such a run at start."""
    if oc.agents.proxy_token is not None and not takes_api_key(env.run_agent):
        raise TriadError(
            f"environment {env.name!r}: orchestrator.agents.proxy_token is set but run_agent takes no "
            "api_key: make it run_agent(prompt, base_url, model, api_key) and give api_key to its client"
        )


async def run_agent(env, prompt, base_url: str, model: str, api_key: str, timeout: float) -> Any:
    """The environment's agent program in a thread of its own (an `async def` on that thread's loop),
    bounded by `timeout`."""
    kwargs = {"api_key": api_key} if takes_api_key(env.run_agent) else {}
    async with asyncio.timeout(timeout):
        return await env_calls.run_episode(env.run_agent, prompt, base_url, model, **kwargs)


class AgentRollouts:
    """Agent episodes of one environment: each runs the environment's agent program against its
    own proxy URL; the calls it makes become the samples."""

    def __init__(self, env, pool: ServerPool, oc: OrchestratorConfig, tool_parser: str) -> None:
        check_agent(env, oc)
        self.env, self.pool, self.oc, self.tool_parser = env, pool, oc, tool_parser
        self.proxy = AgentProxy(oc)
        self.api_key = oc.agents.proxy_token.get_secret_value() if oc.agents.proxy_token else NO_TOKEN

    async def start(self, prompt) -> None:
        self.proxy.model = self.pool.servers[0].client.model or self.proxy.model
        await self.proxy.start()

    async def stop(self) -> None:
        await self.proxy.stop()

    async def episode(self, prompt, seeds: Seeds = UNSEEDED) -> AgentEpisode:
        recorder = EpisodeRecorder(self.pool, self.oc, self.tool_parser, seeds)
        episode = self.proxy.open(recorder)
        try:
            url, model = self.proxy.base_url(episode), self.proxy.model
            result = await run_agent(self.env, prompt, url, model, self.api_key, self.oc.agents.timeout_s)
        except TimeoutError:
            log.warning(
                "environment %r: an agent episode ran over %g s (orchestrator.agents.timeout_s): "
                "scored as it stands",
                self.env.name,
                self.oc.agents.timeout_s,
            )
            result = None
        except Exception as e:  # the agent program's own failure is part of its episode
            log.warning("environment %r: the agent raised %s: %s", self.env.name, type(e).__name__, e)
            result = e
        finally:
            self.proxy.close(episode)
        recorder.episode.result = result
        return recorder.episode

    async def group(self, prompt, size: int, seeds: Seeds = UNSEEDED) -> list[Sample]:
        """Every sample of `size` episodes, each with its episode's reward. A call that failed on the
        server side (the agent got a 502) makes the episode no outcome of the policy: the group is dropped."""
        episodes = await asyncio.gather(*(self.episode(prompt, seeds.at(i)) for i in range(size)))
        failed = next((e.failed for e in episodes if e.failed), "")
        if failed:
            raise RolloutFailed(f"environment {self.env.name!r}: an agent episode's call failed: {failed}")
        rewards = await group_rewards(self.env, prompt, episodes, self.oc.environment.timeout_s)
        samples = []
        for i, (episode, reward) in enumerate(zip(episodes, rewards, strict=True)):
            metrics = await env_metrics(self.env, prompt, episode, self.oc.environment.timeout_s)
            for sample in episode.samples:
                sample.reward, sample.metrics, sample.episode = reward, metrics, i
                samples.append(sample)
        if not samples:
            raise RolloutFailed(f"environment {self.env.name!r}: no agent episode of a prompt made a call")
        return samples
