"""The chat path against the real chat templates of the model families people train.

Every vendored template (shared/data/templates, sources in its SOURCES.md) × {single turn, a second
user turn, tool calls with results} × {thinking on, off} where the template switches it. Each cell
runs `ChatRollouts.episode`, the orchestrator's own code, against a pool whose "server" renders with
the family's template and samples, for each turn, the ids the template itself writes for the
planned reply (what a model trained on that template emits, up to and including its end-of-turn
token). The episode's ids must equal the ids sampled plus the ids appended, as values, and each
appended piece must equal what the template writes after that turn's end-of-turn token in its own
rendering of the whole conversation: the rest of the closing, the new messages, the next
generation prompt. Cells a template cannot serve must be refused at start, with one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

import jinja2
import pytest

from orchestrator.environments import Prompt
from orchestrator.episodes.chat import ChatRollouts
from orchestrator.episodes.tool_calls import call_id
from orchestrator.servers.client import Completion, RequestRejected
from shared.config import ChatConfig, OrchestratorConfig
from shared.errors import TriadError
from tests.templates import FAMILIES, family, family_tokenizer

QUESTION = "Compute two plus three, please."
EXPRESSIONS = ("2+3", "7*6")
REASONING = "I should add the numbers."
ANSWER = "The answer is five."
FOLLOW_UP = "And seven times six?"
ANSWER_2 = "That is forty-two."


def calculate(expression: str) -> str:
    """Evaluate an integer arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # the two fixed expressions above


def assistant(content: str, calls: tuple[str, ...] = (), reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(n),
                "type": "function",
                "function": {"name": "calculate", "arguments": json.dumps({"expression": e})},
            }
            for n, e in enumerate(calls)
        ]
    return message


@dataclass
class Cell:
    family: str
    scenario: str  # single | user | tools
    thinking: bool | None  # None: the template has no switch

    @property
    def kwargs(self) -> dict[str, Any]:
        spec = family(self.family)
        return {spec["thinking_kwarg"]: self.thinking} if self.thinking is not None else {}

    def replies(self) -> list[dict[str, Any]]:
        """The assistant turns the model will sample, in order."""
        reasoning = REASONING if self.thinking or family(self.family)["thinking"] == "always" else None
        if self.scenario == "single":
            return [assistant(ANSWER, reasoning=reasoning)]
        if self.scenario == "user":
            return [assistant(ANSWER, reasoning=reasoning), assistant(ANSWER_2, reasoning=reasoning)]
        per_turn = family(self.family)["max_calls_per_turn"] or 2
        return [assistant("", EXPRESSIONS[:per_turn], reasoning), assistant(ANSWER, reasoning=reasoning)]


def cells() -> list[Cell]:
    out = []
    for name, spec in FAMILIES.items():
        switches = [True, False] if spec["thinking"] == "switch" else [None]
        out += [Cell(name, scenario, t) for scenario in ("single", "user", "tools") for t in switches]
    return out


class Env:
    """The cell's environment: a fixed question, a follow-up user turn or a calculator tool."""

    name = "matrix"

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.max_turns = 1 if cell.scenario == "single" else 2
        self.tools = [calculate] if cell.scenario == "tools" else []

    def sample(self, rng: random.Random) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": QUESTION}])

    def respond(self, prompt: Prompt, conversation: list[dict]) -> str | None:
        return FOLLOW_UP if self.cell.scenario == "user" else None

    def reward(self, prompt: Prompt, conversation: list[dict]) -> float:
        return 1.0


def as_vllm_renders(message: dict) -> dict:
    """vLLM's renderer gives templates a tool call's arguments as an object, not the JSON string of the
    OpenAI API (`vllm/renderers/chat_utils.py`, `_postprocess_messages`)."""
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


@dataclass
class Template:
    """The family's template and tokenizer, as vLLM's render route would apply them."""

    cell: Cell
    tools: list[dict] | None = None

    def text(self, messages: list[dict], generation_prompt: bool) -> str:
        tok = family_tokenizer(self.cell.family)
        return tok.apply_chat_template(
            [as_vllm_renders(m) for m in messages],
            tools=self.tools,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **self.cell.kwargs,
        )

    def ids(self, text: str) -> list[int]:
        return family_tokenizer(self.cell.family).encode(text, add_special_tokens=False)

    def render(self, messages: list[dict], generation_prompt: bool) -> list[int]:
        return self.ids(self.text(messages, generation_prompt))

    def end_tokens(self) -> list[str]:
        return family(self.cell.family)["eos"]

    def sampled(self, history: list[dict], reply: dict) -> list[int]:
        """What the model samples for `reply` after `history`: the template's rendering of it as the last
        message, after the generation prompt, up to and including its first end-of-turn token."""
        prompt, full = self.text(history, True), self.text([*history, reply], False)
        spec = family(self.cell.family)
        if full.startswith(prompt):
            turn = full[len(prompt) :]
        else:  # the prompt opened the think block (DeepSeek): the model writes the reasoning and closes it
            assert spec["think_in_prompt"], f"{self.cell}: the generation prompt is no prefix of the reply"
            common = len(os.path.commonprefix([prompt, full]))
            turn, close = full[common:], spec["think_tokens"][1]
            reasoning = reply.get("reasoning_content") or ""
            turn = reasoning + turn if turn.startswith(close) else f"{reasoning}\n{close}\n\n{turn}"
        end = min((turn.find(t) + len(t) for t in self.end_tokens() if t in turn), default=len(turn))
        return self.ids(turn[:end])


@dataclass
class Routes:
    template: Template
    planned: list[dict]

    async def render(self, messages, tools, generation_prompt, options):
        assert tools == self.template.tools and options == self.template.cell.kwargs
        try:
            return self.template.render(messages, generation_prompt)
        except (jinja2.TemplateError, TypeError) as e:  # vLLM answers such a template error 400
            raise RequestRejected(f"POST /v1/chat/completions/render answered 400: {e}", "render") from None

    async def derender(self, token_ids, finish_reason, messages, tools, options, prompt_ids):
        """The planned reply, as the server's parsers split the sampled ids (vLLM's own parsers of these
        formats: test_tool_parsers.py); before the episode, no derender, as on a server without it."""
        return self.planned.pop(0) if self.planned else None


@dataclass
class Client:
    chat: Routes
    base_url: str = "http://matrix"


@dataclass
class Server:
    client: Client
    url: str = "http://matrix"


@dataclass
class Pool:
    """One 'server' that samples the planned turns: each request's ids are recorded."""

    server: Server
    turns: list[list[int]]
    asked: list[list[int]] = field(default_factory=list)

    async def request(self, call, what, prefer=None):
        return await call(self.server), self.server

    async def complete(self, prompt, n, prefer=None, max_tokens=None, seed=None):
        self.asked.append(list(prompt))
        ids = self.turns.pop(0)
        return [Completion(list(prompt), ids, [-0.5] * len(ids), "", False, "stop")], self.server, 3


def planned_ids(cell: Cell, template: Template) -> tuple[list[list[int]], list[list[int]]]:
    """For each planned reply: the ids sampled, and the ids the template writes after that reply in its
    rendering of the whole conversation (expected to be appended): everything after the first turn-closing
    token (an end-of-turn or role token) that follows the reply's last text."""
    history: list[dict] = [{"role": "user", "content": QUESTION}]
    closers = [*family(cell.family)["eos"], *family(cell.family)["role_tokens"]]
    sampled, following = [], []
    replies = cell.replies()
    for i, reply in enumerate(replies):
        sampled.append(template.sampled(history, reply))
        history.append(reply)
        if i + 1 == len(replies):
            break
        new = tool_results(reply) if reply.get("tool_calls") else [{"role": "user", "content": FOLLOW_UP}]
        history += new
        full = template.text(history, True)
        calls = reply.get("tool_calls")
        mark = json.loads(calls[-1]["function"]["arguments"])["expression"] if calls else reply["content"]
        at = full.rindex(mark, 0, full.rindex(new[0]["content"]))
        start, closer = min((full.find(t, at), t) for t in closers if full.find(t, at) >= 0)
        ended = template.ids(closer)[0] in sampled[-1][-1:]
        if not ended and closer in family(cell.family)["eos"]:
            # GLM: the rendering writes no end of the turn, the next message's role token ends it
            # (`<|observation|>` before tool results): the model samples that token as its stop
            sampled[-1] = sampled[-1] + template.ids(closer)
        following.append(template.ids(full[start + len(closer) :]))
    return sampled, following


def tool_results(reply: dict) -> list[dict]:
    return [
        {
            "role": "tool",
            "tool_call_id": c["id"],
            "name": "calculate",
            "content": calculate(json.loads(c["function"]["arguments"])["expression"]),
        }
        for c in reply["tool_calls"]
    ]


def refused(cell: Cell) -> str | None:
    """Why the template cannot serve the cell, if it cannot (checked: the start refuses it)."""
    spec = family(cell.family)
    if cell.scenario == "tools" and not spec["renders_tool_calls"]:
        return "the template renders no tool calls"
    if cell.scenario == "tools" and spec["call_arguments"] == "string":
        return "the template writes a call's arguments as a string; vLLM hands templates an object"
    return None


def orchestrator_config(cell: Cell) -> OrchestratorConfig:
    """The default `[orchestrator]` with the cell's chat template options."""
    return OrchestratorConfig(chat=ChatConfig(template_kwargs=cell.kwargs))


@pytest.mark.parametrize("cell", cells(), ids=lambda c: f"{c.family}-{c.scenario}-{c.thinking}")
def test_the_trainer_gets_the_ids_sampled_plus_the_ids_the_template_appends(cell: Cell):
    env = Env(cell)
    template = Template(cell)
    routes = Routes(template, [])
    pool = Pool(Server(Client(routes)), [])
    oc = orchestrator_config(cell)
    rollouts = ChatRollouts(env, pool, oc, "auto")
    template.tools = rollouts.runner.schemas or None
    prompt = env.sample(random.Random(0))
    why = refused(cell)
    if why is not None:
        with pytest.raises(TriadError, match="^environment 'matrix': "):
            asyncio.run(rollouts.start(prompt))
        return
    asyncio.run(rollouts.start(prompt))
    routes.planned = cell.replies()
    sampled, following = planned_ids(cell, template)
    pool.turns = [list(ids) for ids in sampled]
    sample = asyncio.run(rollouts.episode(prompt))

    expected, mask, asked = template.render(prompt.messages, True), [], []
    mask = [False] * len(expected)
    for k, ids in enumerate(sampled):
        asked.append(list(expected))
        expected, mask = expected + ids, mask + [True] * len(ids)
        if k < len(following):
            expected, mask = expected + following[k], mask + [False] * len(following[k])
    assert pool.asked == asked  # each turn was sampled after exactly the ids so far
    assert sample.input_ids == expected
    assert sample.loss_mask == mask
    assert sample.logprobs == [-0.5 if m else 0.0 for m in mask]
    assert sample.turns == len(sampled)


def rollouts_of(cell: Cell) -> tuple[ChatRollouts, Template, Routes, Pool, Prompt]:
    env, template = Env(cell), Template(cell)
    routes = Routes(template, [])
    pool = Pool(Server(Client(routes)), [])
    oc = orchestrator_config(cell)
    rollouts = ChatRollouts(env, pool, oc, "auto")
    template.tools = rollouts.runner.schemas or None
    prompt = env.sample(random.Random(0))
    asyncio.run(rollouts.start(prompt))
    return rollouts, template, routes, pool, prompt


def tool_cells(fits) -> list[Cell]:
    return [
        Cell(name, "tools", True if spec["thinking"] == "switch" else None)
        for name, spec in FAMILIES.items()
        if refused(Cell(name, "tools", None)) is None and fits(spec)
    ]


# a family whose tool-call turns end on a call token (gpt-oss's <|call|>) has no other end for them
OTHER_END = tool_cells(
    lambda spec: (
        len(spec["eos"]) > 1
        and spec["eos"][1] not in spec["role_tokens"]
        and not set(spec["eos"]) & set(spec.get("tool_call_tokens", []))
    )
)


@pytest.mark.parametrize("cell", OTHER_END, ids=lambda c: c.family)
def test_a_tool_call_turn_that_ends_on_another_end_token_is_followed_by_the_template_alone(cell: Cell):
    """Qwen may end a turn on <|endoftext|>, Llama on <|eom_id|>: the ids after it are those the template
    writes after the turn's end. Before: the probe's JSON tail (past its first id) was appended."""
    rollouts, template, routes, pool, prompt = rollouts_of(cell)
    routes.planned = cell.replies()
    sampled, following = planned_ids(cell, template)
    ends = [template.ids(t)[0] for t in family(cell.family)["eos"]]
    other = next(e for e in ends if e != sampled[0][-1] and e not in following[0])
    sampled[0] = [*sampled[0][:-1], other]
    pool.turns = [list(ids) for ids in sampled]
    sample = asyncio.run(rollouts.episode(prompt))
    first = template.render(prompt.messages, True)
    assert sample.input_ids == first + sampled[0] + following[0] + sampled[1]
    assert sample.turns == 2 and not sample.truncated


SINGLE_CALL = tool_cells(lambda spec: spec["max_calls_per_turn"] == 1)


@pytest.mark.parametrize("cell", SINGLE_CALL, ids=lambda c: c.family)
def test_more_calls_than_the_template_allows_end_the_episode_truncated_not_the_run(cell: Cell):
    """Llama 3.x's template raises "only supports single tool-calls" (vLLM's render answers 400) when
    the turn with two calls is rendered for what follows it, gpt-oss's renders no arguments of the
    first call. Before: the 400 (or "does not render an assistant message's text") ended the run."""
    rollouts, template, routes, pool, prompt = rollouts_of(cell)
    one_call = assistant("", EXPRESSIONS[:1])
    routes.planned = [assistant("", EXPRESSIONS)]  # what the server's parser read in the turn
    sampled = template.sampled([{"role": "user", "content": QUESTION}], one_call)
    pool.turns = [list(sampled)]
    sample = asyncio.run(rollouts.episode(prompt))
    assert sample.input_ids == template.render(prompt.messages, True) + sampled
    assert sample.turns == 1 and sample.truncated and sample.tool_calls == 2
    assert rollouts.failures.take() == {"groups_failed": 0, "episodes_truncated_render": 1}
