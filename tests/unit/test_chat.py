"""Chat rendering, message checks and agent-call chaining, against a small fake ChatML template."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.agents import Call, Chain, check_request, normal
from orchestrator.chat import ChatRenderer, check_messages, find_last
from shared.errors import TriadError

IM_START, IM_END = 1000, 1001  # special tokens of the fake template; bytes are their own ids
USER = {"role": "user", "content": "x"}


def chatml(messages: list[dict], generation_prompt: bool, drop_think: bool = False) -> list[int]:
    """A ChatML template over a byte tokenizer; with `drop_think`, earlier assistant think blocks
    are dropped from the rendering (as Qwen3's template does)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    ids: list[int] = []
    for i, m in enumerate(messages):
        content = m.get("content") or ""
        if drop_think and m["role"] == "assistant" and i < last_user and "</think>" in content:
            content = content.split("</think>", 1)[1]
        ids += [IM_START, *f"{m['role']}\n{content}".encode(), IM_END, *b"\n"]
    if generation_prompt:
        ids += [IM_START, *b"assistant\n"]
    return ids


def fake_renderer(drop_think: bool = False) -> tuple[ChatRenderer, list]:
    calls = []

    async def render(messages, generation_prompt):
        calls.append((messages, generation_prompt))
        return chatml(messages, generation_prompt, drop_think)

    async def tokenize(text):
        return list(text.encode())

    return ChatRenderer(render, tokenize), calls


def test_find_last():
    assert find_last([1, 2, 1, 2, 3], [1, 2]) == 2
    assert find_last([1, 2, 3], [4]) == -1
    assert find_last([], [1]) == -1


def test_closing_is_what_the_template_writes_after_assistant_content():
    renderer, _ = fake_renderer()
    assert asyncio.run(renderer.closing()) == [IM_END, *b"\n"]


@pytest.mark.parametrize("drop_think", [False, True])
def test_after_turn_appends_the_rest_of_the_closing_and_the_new_messages(drop_think):
    renderer, _ = fake_renderer(drop_think)
    tool = {"role": "tool", "content": "413"}
    sampled = [*b"<think>x</think><tool_call>{}</tool_call>", IM_END]  # the model stopped at <|im_end|>
    added = asyncio.run(renderer.after_turn(sampled, [tool]))
    assert added == [*b"\n", IM_START, *b"tool\n413", IM_END, *b"\n", IM_START, *b"assistant\n"]
    truncated = asyncio.run(renderer.after_turn([*b"partial"], [tool]))
    assert truncated == [IM_END, *b"\n", *added[1:]]  # nothing of the closing was sampled


def test_a_growing_conversation_keeps_the_sampled_tokens_where_a_rewriting_template_would_not():
    """Sampled ids + after_turn ids are what the sampler saw; with drop_think, re-rendering the
    whole conversation would give other ids for the first turn."""
    renderer, _ = fake_renderer(drop_think=True)
    prompt = [{"role": "user", "content": "q1"}]
    ids = asyncio.run(renderer.prompt(prompt))
    turn = [*b"<think>r</think>a1", IM_END]
    ids += turn + asyncio.run(renderer.after_turn(turn, [{"role": "user", "content": "q2"}]))
    conversation = [
        *prompt,
        {"role": "assistant", "content": "<think>r</think>a1"},
        {"role": "user", "content": "q2"},
    ]
    assert ids == chatml(conversation, True, drop_think=False)
    assert ids != chatml(conversation, True, drop_think=True)


def test_a_template_that_rewrites_history_when_messages_are_added_is_refused():
    async def render(messages, generation_prompt):
        return chatml(messages, generation_prompt) + [len(messages)]  # a trailer that moves

    async def tokenize(text):
        return list(text.encode())

    with pytest.raises(TriadError, match="differently once messages are added"):
        asyncio.run(ChatRenderer(render, tokenize).after_turn([IM_END], [{"role": "user", "content": "x"}]))


def test_a_template_that_hides_assistant_content_is_refused():
    async def render(messages, generation_prompt):
        return [IM_START]

    async def tokenize(text):
        return list(text.encode())

    with pytest.raises(TriadError, match="content as is"):
        asyncio.run(ChatRenderer(render, tokenize).closing())


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


def call(name: str, args: str, call_id: str = "call_0") -> dict:
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
    chain = Chain(tools=None, renderer=renderer)
    first = [{"role": "user", "content": "q"}]
    reply = {"role": "assistant", "content": "", "tool_calls": [call("calc", "{}")]}
    assert chain.new_messages(first, None) is None  # no call yet
    chain.last = Call(first, reply, sampled=[1])
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "4"}
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
