"""Chat episodes: the model's turns, its tool calls run, the environment's replies, as tokens.

The prompt is rendered once with the model's chat template; each model turn is
sampled by continuing from the exact ids so far (`/v1/completions` with token
ids), and what follows it (tool results, an environment's user message, the
next generation prompt) is appended as ids the model did not sample
(`loss_mask` false, logprob 0). The trainer therefore sees exactly the ids the
sampler was conditioned on and sampled (see `orchestrator/episodes/render.py`).

A turn is split into content, reasoning and tool calls by the server's parsers
(`orchestrator/episodes/turns.py`); the environment and its reward see the content (and
the reasoning, as `reasoning_content`), the trainer every sampled id. Tool calls
are run by the environment's tools, each bounded by `orchestrator.environment.timeout_s`;
an unknown tool, bad arguments, an error or a timeout goes back to the model as
the call's tool message, a block that parsed as no call as one user message
after them (`error: <id>: <why>` a line), and is in the conversation the reward
sees. The episode ends when the model makes no tool call and the environment
has no reply, on a truncated turn, or after `max_turns` model turns; one that
cannot go on (a render the server refuses, a failed `respond`, past
`orchestrator.environment.episode_timeout_s`) is dropped or ends truncated (`failures.py`).
"""

from __future__ import annotations

from orchestrator.environments import Environment, Prompt, env_tools, group_rewards, max_turns, respond
from orchestrator.episodes.render import PROBE_USER, check_messages
from orchestrator.episodes.run import finished_episodes, run_episode
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.seeds import UNSEEDED, Seeds
from orchestrator.episodes.tool_calls import ParsedTurn, assistant_message, probe_call
from orchestrator.episodes.tools import ToolRunner, tool_message
from orchestrator.episodes.turns import TurnParser, pool_renderer
from orchestrator.failures import EpisodeEnded, Failures
from orchestrator.servers.pool import ServerPool
from shared.config import OrchestratorConfig
from shared.errors import TriadError


def text_of(conversation: list[dict]) -> str:
    """A conversation as text, for environments that score text."""
    return "\n".join(m.get("content") or "" for m in conversation)


def probe_tool_turn(tool: str) -> tuple[dict, list[dict]]:
    """An assistant turn calling `tool` and its result, to check the template renders tool calls."""
    call = probe_call(tool)
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    return turn, [tool_message(call["id"], tool, ".")]


class ChatRollouts:
    """Chat episodes of one environment (its tools and template options fixed)."""

    def __init__(
        self,
        env: Environment,
        pool: ServerPool,
        oc: OrchestratorConfig,
        tool_parser: str,
        failures: Failures | None = None,
    ) -> None:
        self.env, self.pool, self.oc = env, pool, oc
        self.failures = failures or Failures(oc.max_failed_groups)
        self.runner = ToolRunner(env_tools(env), oc.environment.timeout_s, oc.chat.max_tool_result_chars)
        tools = self.runner.schemas or None
        self.renderer = pool_renderer(pool, tools, oc.chat.template_kwargs)
        self.parser = TurnParser(pool, tools, oc.chat.template_kwargs, tool_parser)
        self.where = f"environment {env.name!r}"

    def messages(self, prompt: Prompt) -> list[dict]:
        """The prompt as checked chat messages (a text prompt becomes one user message)."""
        if prompt.is_chat:
            return check_messages(prompt.messages, f"{self.where}: prompt")
        return [{"role": "user", "content": prompt.text}]

    async def start(self, prompt: Prompt) -> None:
        """Render one prompt and what follows a reply and a tool call: a template that cannot
        serve this environment (none at all, or one that cannot render its turns) fails here."""
        try:
            await self.renderer.prompt(self.messages(prompt))
            await self.renderer.tail({"role": "assistant", "content": "."}, [PROBE_USER])
            if self.runner.names:
                await self.renderer.tail(*probe_tool_turn(self.runner.names[0]))
            await self.parser.check(self.renderer, self.runner.names[0] if self.runner.names else None)
        except TriadError as e:
            if str(e).startswith(self.where):
                raise
            raise TriadError(f"{self.where}: {e}") from None

    async def stop(self) -> None:
        return None

    async def group(self, prompt: Prompt, size: int, seeds: Seeds = UNSEEDED) -> list[Sample]:
        """`size` scored episodes of `prompt` (fewer with `orchestrator.partial_groups`)."""
        episodes = [self.episode(prompt, seeds.at(i)) for i in range(size)]
        samples = await finished_episodes(episodes, self.oc.partial_groups, self.failures)
        seen = [s.conversation if prompt.is_chat else s.completion for s in samples]
        rewards = await group_rewards(self.env, prompt, seen, self.oc.environment.timeout_s)
        for sample, reward in zip(samples, rewards, strict=True):
            sample.reward = reward
        return samples

    async def replies(self, prompt: Prompt, parsed: ParsedTurn, sample: Sample) -> list[dict]:
        """What follows a model turn: the results of its tool calls, or the environment's user message."""
        if parsed.calls or parsed.errors:
            results = await self.runner.run_turn(parsed)
            sample.tool_calls += len(parsed.calls) + len(parsed.errors)
            sample.tool_errors += len(parsed.errors)
            sample.tool_errors += sum(
                r["role"] == "tool" and r["content"].startswith("error: ") for r in results
            )
            return results
        if not hasattr(self.env, "respond"):
            return []
        seen = sample.conversation if prompt.is_chat else text_of(sample.conversation)
        reply = await respond(self.env, prompt, seen, self.oc.environment.timeout_s)
        return [] if reply is None else [{"role": "user", "content": reply}]

    async def episode(self, prompt: Prompt, seeds: Seeds = UNSEEDED) -> Sample:
        sample = Sample()
        await run_episode(
            sample,
            self.turns(prompt, sample, seeds),
            self.oc.environment.episode_timeout_s,
            self.where,
            self.failures,
        )
        sample.completion = text_of(sample.conversation)
        return sample

    async def turns(self, prompt: Prompt, sample: Sample, seeds: Seeds) -> None:
        """The episode's turns, appended to `sample`; what follows a turn joins the conversation
        once its ids are rendered, so that a truncated episode's conversation is its ids'."""
        try:
            messages = self.messages(prompt)
        except TriadError as e:
            raise EpisodeEnded(str(e), "prompt") from None
        sample.add(await self.renderer.prompt(messages), sampled=False)
        server = None
        for turn in range(max(max_turns(self.env), 1)):
            before = list(sample.input_ids)
            (c,), server, version = await self.pool.complete(
                before, 1, prefer=server, seed=seeds.at(turn).value
            )
            sample.record_turn(c, server.url, version)
            parsed = await self.parser.parse(c, before, server)
            message = assistant_message(parsed)
            sample.conversation.append(message)
            if c.truncated or turn + 1 == max_turns(self.env):
                return
            new = await self.replies(prompt, parsed, sample)
            if not new:
                return
            ended_on_token = c.finish_reason == "stop"
            following = await self.renderer.after_turn(c.token_ids, ended_on_token, message, new)
            sample.conversation += new
            sample.add(following, sampled=False)
