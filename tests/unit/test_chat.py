"""Chat rendering, message checks and agent-call chaining, against a small fake ChatML template."""

from __future__ import annotations

import asyncio
import json

import pytest

from orchestrator.episodes.agent_proxy import check_request
from orchestrator.episodes.agents import Call, Chain, normal
from orchestrator.episodes.render import ChatRenderer, check_messages, common_tail, following
from shared.errors import TriadError

IM_START, IM_END = 1000, 1001  # special tokens of the fake template; bytes are their own ids
ENDOFTEXT = 1002  # another end-of-sequence token the model may end a turn on
USER = {"role": "user", "content": "x"}
CALL = {"id": "call00000", "type": "function", "function": {"name": "calc", "arguments": "{}"}}


def chatml(messages: list[dict], generation_prompt: bool, drop_think: bool = False) -> list[int]:
    """A ChatML template over a byte tokenizer; with `drop_think`, earlier assistant think blocks
    are dropped from the rendering (as Qwen3's template does)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    ids: list[int] = []
    for i, m in enumerate(messages):
        content = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            content += f"\n<tool_call>\n{json.dumps(call['function'])}\n</tool_call>"
        if drop_think and m["role"] == "assistant" and i < last_user and "</think>" in content:
            content = content.split("</think>", 1)[1]
        ids += [IM_START, *f"{m['role']}\n{content}".encode(), IM_END, *b"\n"]
    if generation_prompt:
        ids += [IM_START, *b"assistant\n"]
    return ids


def qwen3_like(messages: list[dict], generation_prompt: bool) -> list[int]:
    """ChatML that writes an empty think block into the last assistant message only when it ends the
    conversation, as Qwen3's template does: a rendering is then no prefix of a longer one."""
    ids = chatml(messages, False)
    if messages[-1]["role"] == "assistant" and not generation_prompt:
        at = len(chatml(messages[:-1], False)) + 1 + len(b"assistant\n")
        ids[at:at] = [*b"<think>\n\n</think>\n\n"]
    return ids + ([IM_START, *b"assistant\n"] if generation_prompt else [])


def fake_renderer(template=chatml) -> tuple[ChatRenderer, list]:
    calls = []

    async def render(messages, generation_prompt):
        calls.append((messages, generation_prompt))
        return template(messages, generation_prompt)

    return ChatRenderer(render), calls


def test_common_tail_is_what_follows_the_one_difference():
    assert common_tail([1, 2, 7, 3, 4], [1, 2, 8, 3, 4]) == [3, 4]
    assert common_tail([1, 7], [1, 8]) == []
    assert common_tail([1, 2], [1, 2]) is None


def test_following_starts_after_the_turns_end_token_in_the_tail():
    tail = [5, 6, IM_END, 9, IM_END]
    assert following([1, IM_END], True, tail) == [9, IM_END]
    assert following([1, 2], False, tail) == tail  # truncated: nothing of the closing was sampled
    assert following([1, 77], True, [IM_END, 9]) == [9]  # an end token the tail lacks stands for its first


@pytest.mark.parametrize("template", [chatml, qwen3_like])
def test_after_turn_appends_the_rest_of_the_closing_and_the_new_messages(template):
    renderer, _ = fake_renderer(template)
    tool = {"role": "tool", "content": "413"}
    turn = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    sampled = [*b"<think>x</think><tool_call>{}</tool_call>", IM_END]  # the model stopped at <|im_end|>
    added = asyncio.run(renderer.after_turn(sampled, True, turn, [tool]))
    assert added == [*b"\n", IM_START, *b"tool\n413", IM_END, *b"\n", IM_START, *b"assistant\n"]
    truncated = asyncio.run(
        renderer.after_turn([*b"partial"], False, {"role": "assistant", "content": "p"}, [tool])
    )
    assert truncated == [IM_END, *b"\n", *added[1:]]


@pytest.mark.parametrize("template", [chatml, qwen3_like])
def test_a_tool_call_turn_that_ended_on_another_end_token_gets_no_json_of_the_probe(template):
    """Qwen ends a turn on <|endoftext|> too, Llama on <|eom_id|>: the turn's calls were closed by the
    model. Before: the probe's tail past its first id was appended (`"}"}\n</tool_call>` and
    <|im_end|> after the turn's own closing)."""
    renderer, _ = fake_renderer(template)
    tool = {"role": "tool", "content": "413"}
    turn = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    sampled = [*b'<tool_call>{"name": "calc", "arguments": {}}</tool_call>', ENDOFTEXT]
    added = asyncio.run(renderer.after_turn(sampled, True, turn, [tool]))
    assert added == [*b"\n", IM_START, *b"tool\n413", IM_END, *b"\n", IM_START, *b"assistant\n"]


@pytest.mark.parametrize("template", [chatml, qwen3_like])
def test_a_growing_conversation_keeps_the_sampled_tokens(template):
    """Sampled ids + after_turn ids are what the sampler saw, with a template whose renderings are not
    prefixes of each other too; re-rendering the whole conversation is what the template would do."""
    renderer, _ = fake_renderer(template)
    prompt = [{"role": "user", "content": "q1"}]
    ids = asyncio.run(renderer.prompt(prompt))
    turn = [*b"a1", IM_END]
    reply = {"role": "assistant", "content": "a1"}
    ids += turn + asyncio.run(renderer.after_turn(turn, True, reply, [{"role": "user", "content": "q2"}]))
    assert ids == template([*prompt, reply, {"role": "user", "content": "q2"}], True)


def test_a_template_that_hides_assistant_content_is_refused():
    async def render(messages, generation_prompt):
        return [IM_START]

    with pytest.raises(TriadError, match="does not render an assistant message's text"):
        asyncio.run(ChatRenderer(render).tail({"role": "assistant", "content": "."}, [USER]))


@pytest.mark.parametrize(
    "messages, message",
    [
        ("hi", "must be a non-empty list, got str"),
        ([], "must be a non-empty list"),
        ([{"content": "x"}], "message 0 is malformed (role: Field required)"),
        ([USER, {"role": "robot", "content": "y"}], "message 1 is malformed (role"),
        ([{"role": "user", "content": 3}], "message 0 is malformed (content: Input should be a valid str"),
        ([{"role": "user"}], "message 0 (user) has neither content nor tool_calls"),
        ([USER, {"role": "tool", "content": None}], "message 1 (tool) has neither content nor tool_calls"),
        (["user: hi"], "message 0 is malformed"),
    ],
)
def test_malformed_messages_get_one_line_naming_the_message(messages, message):
    with pytest.raises(TriadError) as e:
        check_messages(messages, "environment 'x': prompt")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("environment 'x': prompt")


def test_an_empty_assistant_reply_echoed_back_as_null_is_an_empty_one():
    assert check_messages([USER, {"role": "assistant", "content": None}], "w")[1] == {
        "role": "assistant",
        "content": "",
    }


def test_good_messages_come_back_as_plain_dicts():
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
    ]
    assert check_messages(messages, "w") == [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c"}]},
    ]


def call(name: str, args: str, call_id: str = "call00000") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def test_normal_form_ignores_what_clients_add_and_argument_spelling():
    ours = {"role": "assistant", "content": "", "tool_calls": [call("calc", '{"x": 1}')]}
    theirs = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [call("calc", '{ "x" : 1 }')],
    }
    assert normal(ours) == normal(theirs)
    assert normal(ours) != normal({**ours, "tool_calls": [call("calc", '{"x": 2}')]})


def test_a_call_extends_the_chain_only_after_the_previous_messages_and_reply():
    renderer, _ = fake_renderer()
    chain = Chain(tools=None, renderer=renderer, parser=None)
    first = [{"role": "user", "content": "q"}]
    reply = {"role": "assistant", "content": "", "tool_calls": [call("calc", "{}")]}
    assert chain.new_messages(first, None) is None  # no call yet
    chain.last = Call(first, reply, sampled=[1])
    tool = {"role": "tool", "tool_call_id": "call00000", "content": "4"}
    assert chain.new_messages([*first, reply, tool], None) == [tool]
    assert chain.new_messages([*first, reply], None) is None  # nothing new
    assert chain.new_messages([{"role": "user", "content": "other"}, reply, tool], None) is None
    assert chain.new_messages([*first, {**reply, "content": "edited"}, tool], None) is None
    assert chain.new_messages([*first, reply, tool], [{"type": "function"}]) is None  # other tools


@pytest.mark.parametrize(
    "body, message",
    [
        ([], "the body must be a JSON object"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream is not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n must be 1"),
        ({"messages": "x"}, "must be a non-empty list"),
        ({"messages": [USER], "max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "tools must be a list"),
    ],
)
def test_bad_requests_are_named(body, message):
    with pytest.raises(TriadError, match=message):
        check_request(body, 32)


def test_max_tokens_is_capped_by_the_run():
    body = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 500}
    assert check_request(body, 32)[2] == 32
    assert check_request({**body, "max_completion_tokens": 8}, 32)[2] == 8


class Parsing:
    """A server whose parsers split (or fail to split) the template's own rendering of a reply."""

    def __init__(self, message: dict | None) -> None:
        self.message = message

    async def request(self, call, what, prefer=None):
        return await call(self), self

    @property
    def client(self):
        return self

    @property
    def chat(self):
        return self

    async def derender(self, token_ids, finish_reason, messages, tools, options, prompt_ids):
        return self.message


def qwen_with_reasoning(messages: list[dict], generation_prompt: bool) -> list[int]:
    """ChatML that writes a reply's reasoning_content as a think block."""
    return chatml([with_think(m) for m in messages], generation_prompt)


def with_think(message: dict) -> dict:
    if not message.get("reasoning_content"):
        return message
    return message | {"content": f"<think>{message['reasoning_content']}</think>{message['content']}"}


THOUGHT = "Let me think this over first."
MISNAMED = {**CALL, "function": {"name": "calc[CALL_ID]call00000", "arguments": "{}"}}
LEFT_IN_TEXT = '<tool_call>{"name": "calc", "arguments": {}}</tool_call>'


@pytest.mark.parametrize(
    "message, tool, error",
    [
        ({"content": f"<think>{THOUGHT}</think>Done."}, None, "reasoning parser does not split"),
        (
            {"content": f"Done.{LEFT_IN_TEXT}", "reasoning_content": THOUGHT},
            "calc",
            "tool parser does not read",
        ),
        (  # Mistral-Small-3.2 through vLLM's `mistral` parser: a call came back, under another name
            {"content": "Done.", "reasoning_content": THOUGHT, "tool_calls": [MISNAMED]},
            "calc",
            r"^the server's tool parser \(auto\) reads this model's call of 'calc' back as calls of "
            r"\['calc\[CALL_ID\]call00000'\]: ",
        ),
    ],
)
def test_parsers_that_do_not_fit_the_model_are_named_at_start(message, tool, error):
    from orchestrator.episodes.turns import TurnParser

    renderer, _ = fake_renderer(qwen_with_reasoning)
    parser = TurnParser(Parsing(message), None, {}, "auto")
    with pytest.raises(TriadError, match=error):
        asyncio.run(parser.check(renderer, tool))


def test_parsers_that_fit_pass_the_start_check_and_a_server_without_derender_is_not_asked():
    from orchestrator.episodes.turns import TurnParser

    renderer, _ = fake_renderer(qwen_with_reasoning)
    fits = {"content": "Done.", "reasoning_content": THOUGHT, "tool_calls": [CALL]}
    asyncio.run(TurnParser(Parsing(fits), None, {}, "auto").check(renderer, "calc"))
    asyncio.run(TurnParser(Parsing(None), None, {}, "auto").check(renderer, "calc"))
