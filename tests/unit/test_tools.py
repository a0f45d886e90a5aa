"""Tool calls: parsing the Hermes / Qwen format, tool schemas, and the tool runner."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from orchestrator.episodes.tool_calls import (
    MAX_CALLS,
    ParsedTurn,
    ToolCall,
    ToolCallError,
    assistant_message,
    call_id,
    parse_tool_calls,
    turn_from_message,
)
from orchestrator.episodes.tools import (
    ToolRunner,
    tool_schema,
)
from shared.errors import TriadError

NOT_JSON = "tool call is not valid JSON: "
TRUNCATED = "truncated tool call: <tool_call> with no </tool_call>"
TOO_LARGE = "tool call too large: over 16384 characters of JSON"
NOT_BY_NAME = "cannot be passed by name, as the model passes arguments"
UNKNOWN_MUL = (
    "error: unknown tool 'mul'; the tools are: add, scale, fail, own_timeout, sleep_sync, sleep_async"
)


def block(payload: object) -> str:
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


def call(name: str, **arguments: object) -> str:
    return block({"name": name, "arguments": arguments})


def json_error(text: str) -> str:
    try:
        json.loads(text)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"{text!r} parses")


# parsing: well-formed


def test_one_call():
    parsed = parse_tool_calls(call("calculate", expression="12*34+5"))
    assert parsed == ParsedTurn("", [ToolCall("call00000", "calculate", {"expression": "12*34+5"})], [])


def test_two_calls_with_content_around_them():
    text = f"Let me compute.\n{call('add', a=1, b=2)}\nand\n{call('neg', x=-3)}\nThen done. "
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute.\n\nand\n\nThen done."
    assert parsed.calls == [
        ToolCall("call00000", "add", {"a": 1, "b": 2}),
        ToolCall("call00001", "neg", {"x": -3}),
    ]
    assert parsed.errors == []


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
        '<tool_call>  \t\r\n {"name":"f","arguments":{"x":1}} \r\n\t </tool_call>',
        '<tool_call>\n{\n  "name": "f",\n  "arguments": {\n    "x": 1\n  }\n}\n</tool_call>\n\n',
        '<tool_call>{"arguments": {"x": 1}, "name": "f", "extra": "ignored"}</tool_call>',
    ],
)
def test_whitespace_and_layout_do_not_matter(text):
    assert parse_tool_calls(text) == ParsedTurn("", [ToolCall("call00000", "f", {"x": 1})], [])


def test_arguments_given_as_a_json_string_as_openai_sends_them():
    text = block({"name": "f", "arguments": json.dumps({"x": 1, "s": "a b"})})
    assert parse_tool_calls(text).calls == [ToolCall("call00000", "f", {"x": 1, "s": "a b"})]


@pytest.mark.parametrize(
    "payload", [{"name": "now"}, {"name": "now", "arguments": None}, {"name": "now", "arguments": " "}]
)
def test_missing_null_or_empty_arguments_mean_none(payload):
    assert parse_tool_calls(block(payload)).calls == [ToolCall("call00000", "now", {})]


def test_text_without_calls_is_all_content():
    assert parse_tool_calls("  The answer is 413.\n") == ParsedTurn("The answer is 413.", [], [])
    assert parse_tool_calls("") == ParsedTurn("", [], [])


def test_a_newline_inside_a_string_is_accepted():
    text = '<tool_call>{"name": "run", "arguments": {"code": "x = 1\nprint(x)"}}</tool_call>'
    assert parse_tool_calls(text).calls == [ToolCall("call00000", "run", {"code": "x = 1\nprint(x)"})]


# parsing: truncated and malformed


def test_no_closing_tag_is_a_truncated_call_that_takes_the_rest_of_the_text():
    text = f'I will call. {call("f", x=1)} then <tool_call>\n{{"name": "g", "argu'
    parsed = parse_tool_calls(text)
    assert parsed.content == "I will call.  then"
    assert parsed.calls == [ToolCall("call00000", "f", {"x": 1})]
    assert parsed.errors == [ToolCallError("call00001", TRUNCATED)]


def test_a_call_without_a_closing_tag_ends_at_the_next_call():
    text = '<tool_call>{"name": "f", "arguments": {}} oops ' + call("g", y=1) + " done"
    parsed = parse_tool_calls(text)
    assert parsed == ParsedTurn(
        "done", [ToolCall("call00001", "g", {"y": 1})], [ToolCallError("call00000", TRUNCATED)]
    )


def test_a_closing_tag_without_an_opening_one_is_text():
    text = '{"name": "f", "arguments": {}}\n</tool_call> done'
    assert parse_tool_calls(text) == ParsedTurn(text, [], [])


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"name": "f", "arguments": {"x": 1}', NOT_JSON + json_error('{"name": "f", "arguments": {"x": 1}')),
        ("{'name': 'f'}", NOT_JSON + json_error("{'name': 'f'}")),
        ('{"name": "f"} trailing', NOT_JSON + json_error('{"name": "f"} trailing')),
        ("", NOT_JSON + json_error("")),
        ('["f", {"x": 1}]', "tool call must be a JSON object, got array"),
        ('"f"', "tool call must be a JSON object, got string"),
        ("null", "tool call must be a JSON object, got null"),
        ('{"arguments": {"x": 1}}', 'tool call has no "name" string'),
        ('{"name": 7, "arguments": {}}', 'tool call has no "name" string'),
        ('{"name": "", "arguments": {}}', 'tool call has no "name" string'),
        ('{"name": "f", "arguments": [1, 2]}', "\"arguments\" of 'f' must be a JSON object, got array"),
        ('{"name": "f", "arguments": 3}', "\"arguments\" of 'f' must be a JSON object, got integer"),
        ('{"name": "f", "arguments": true}', "\"arguments\" of 'f' must be a JSON object, got boolean"),
        ('{"name": "f", "arguments": "[1]"}', "\"arguments\" of 'f' must be a JSON object, got array"),
        (
            '{"name": "f", "arguments": "{x: 1}"}',
            '"arguments" string is not valid JSON: ' + json_error("{x: 1}"),
        ),
    ],
)
def test_unusable_blocks_are_errors_with_a_one_line_reason(body, message):
    parsed = parse_tool_calls(f"before <tool_call>\n{body}\n</tool_call> after")
    assert parsed == ParsedTurn("before  after", [], [ToolCallError("call00000", message)])
    assert "\n" not in message


def test_errors_and_calls_share_one_numbering_in_order():
    text = call("a") + "<tool_call>oops</tool_call>" + call("b") + block([1]) + call("c") + "<tool_call>{"
    parsed = parse_tool_calls(text)
    assert [(c.id, c.name) for c in parsed.calls] == [
        ("call00000", "a"),
        ("call00002", "b"),
        ("call00004", "c"),
    ]
    assert [e.id for e in parsed.errors] == ["call00001", "call00003", "call00005"]


# parsing: nested


def test_nested_arguments_are_kept_as_they_are():
    arguments = {"matrix": [[1, 2], [3, 4]], "opts": {"deep": {"list": [{"k": None}, 1.5, True]}}, "s": "x"}
    assert parse_tool_calls(call("f", **arguments)).calls == [ToolCall("call00000", "f", arguments)]


def test_tool_call_tags_inside_json_strings_are_data():
    """A block is one JSON value followed by the closing tag, so tags inside its strings,
    opening or closing, are text of the arguments and do not start or end a block."""
    arguments = {"text": "<tool_call> and </tool_call> and <tool_call>{}</tool_call>"}
    parsed = parse_tool_calls(f"see {call('echo', **arguments)} ok")
    assert parsed == ParsedTurn("see  ok", [ToolCall("call00000", "echo", arguments)], [])


def test_a_block_that_is_not_one_json_value_ends_at_its_first_closing_tag():
    text = '<tool_call>{"name": "f"} x </tool_call> tail </tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == "tail </tool_call>"
    assert parsed.errors == [ToolCallError("call00000", NOT_JSON + json_error('{"name": "f"} x'))]


# parsing: malicious


def test_a_100_kib_block_is_refused_without_parsing():
    text = call("f", blob="x" * 100 * 1024) + call("g", y=2)
    parsed = parse_tool_calls(text)
    assert parsed.errors == [ToolCallError("call00000", TOO_LARGE)]
    assert parsed.calls == [ToolCall("call00001", "g", {"y": 2})]


@pytest.mark.parametrize(
    "text, message",
    [
        ("<tool_call>" + "[" * 10000 + "]" * 10000 + "</tool_call>", TOO_LARGE),
        ("<tool_call>" + "[" * 10000, TRUNCATED),
        (
            "<tool_call>" + '{"a":' * 2500 + "1" + "}" * 2500 + "</tool_call>",
            "tool call is nested too deeply",
        ),
        (call("f", x=json.loads("[" * 70 + "]" * 70)), '"arguments" nest more than 64 levels deep'),
        (
            block({"name": "f", "arguments": "[" * 5000 + "]" * 5000}),
            '"arguments" string is nested too deeply',
        ),
    ],
)
def test_deep_nesting_is_an_error_not_a_crash(text, message):
    assert parse_tool_calls(text) == ParsedTurn("", [], [ToolCallError("call00000", message)])


def test_fifty_calls_run_sixteen_and_say_so():
    parsed = parse_tool_calls("".join(call("f", i=i) for i in range(50)) + " end")
    assert parsed.content == "end"
    assert parsed.calls == [ToolCall(call_id(i), "f", {"i": i}) for i in range(MAX_CALLS)]
    why = "too many tool calls: 50 in one turn, at most 16; the rest were not run"
    assert parsed.errors == [ToolCallError("call00016", why)]


@pytest.mark.parametrize(
    "unit", ["<tool_call>", "<tool_call>{", "<tool_call>x</tool_call>", "<tool_call>[]</tool_call>"]
)
def test_a_megabyte_of_tags_is_parsed_in_linear_time(unit):
    text = unit * (1_000_000 // len(unit))
    start = time.monotonic()
    parsed = parse_tool_calls(text)
    assert time.monotonic() - start < 0.5
    assert len(parsed.errors) == MAX_CALLS + 1 and parsed.calls == [] and parsed.content == ""


def test_control_characters_and_lone_surrogates_never_raise():
    weird = "\x00\x01\x1b[31m\ud800 \udfff\ufffe\u2028é\x7f"  # lone surrogates, not a pair
    parsed = parse_tool_calls(f"{weird}{call('f', s=weird)}{weird}<tool_call>{weird}</tool_call>")
    assert parsed.content == weird + weird
    assert parsed.calls == [ToolCall("call00000", "f", {"s": weird})]
    assert [e.id for e in parsed.errors] == ["call00001"]
    assert "\n" not in parsed.errors[0].message


def test_random_fragments_never_raise():
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"',
        ":",
        ",",
        '"name"',
        '"arguments"',
        '"f"',
        "1",
        "null",
        "\\",
        "\n",
        " ",
        "x",
        "\x00",
        "\ud800",
        "<tool_",
        "call>",
        '{"name": "f", "arguments": {}}',
    ]
    rng = random.Random(0)
    for _ in range(3000):
        parsed = parse_tool_calls("".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))))
        ids = sorted([c.id for c in parsed.calls] + [e.id for e in parsed.errors], key=lambda i: int(i[5:]))
        assert ids == [call_id(i) for i in range(len(ids))]
        assert all("\n" not in e.message for e in parsed.errors)


def test_code_in_arguments_is_data_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    text = call("echo", text=payload) + block({"name": "__import__", "arguments": {"name": "os"}})
    text += block({"name": "echo", "arguments": json.dumps({"text": payload})})
    parsed = parse_tool_calls(text)
    assert parsed.calls[0] == ToolCall("call00000", "echo", {"text": payload})
    assert parsed.calls[2] == ToolCall("call00002", "echo", {"text": payload})

    def echo(text: str) -> str:
        """Say it back."""
        return text

    messages = asyncio.run(ToolRunner([echo], timeout=1.0).run_turn(parsed))
    assert [m["content"] for m in messages] == [
        payload,
        "error: unknown tool '__import__'; the tools are: echo",
        payload,
    ]
    assert not marker.exists()


# schemas


def calculate(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Supports + - * // % and parentheses."""
    return expression


async def search(query: str, limit: int = 5, exact: bool = False, *, threshold: float = 0.5) -> list[str]:
    """Search the
    notes   for a query.

    Returns titles."""
    return [query]


def mixed(
    items: list[int], options: dict[str, str], anything, other: tuple[int, int], maybe: str | None = None
):
    """Take anything."""


def test_schema_of_a_plain_function():
    assert tool_schema(calculate) == {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an integer arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }


def test_schema_of_an_async_function_with_defaults():
    assert tool_schema(search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes for a query.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "threshold": {"type": "number"},
                },
                "required": ["query"],
            },
        },
    }


def test_schema_of_containers_and_unknown_types():
    assert tool_schema(mixed)["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "items": {"type": "array"},
            "options": {"type": "object"},
            "anything": {},
            "other": {},
            "maybe": {},
        },
        "required": ["items", "options", "anything", "other"],
    }


def test_schema_of_a_function_with_no_parameters():
    def now() -> str:
        """The time."""
        return "noon"

    assert tool_schema(now)["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}


def no_doc(x: int) -> int:
    return x


def star_args(*numbers: int) -> int:
    """Add."""
    return sum(numbers)


def star_kwargs(**options: str) -> str:
    """Options."""
    return ""


def positional_only(x: int, /) -> int:
    """Only by position."""
    return x


@pytest.mark.parametrize(
    "fn, message",
    [
        (no_doc, "tool 'no_doc' has no docstring: its first paragraph describes the tool"),
        (star_args, f"tool 'star_args': parameter *numbers {NOT_BY_NAME}"),
        (star_kwargs, f"tool 'star_kwargs': parameter **options {NOT_BY_NAME}"),
        (positional_only, f"tool 'positional_only': parameter x {NOT_BY_NAME}"),
    ],
)
def test_schema_refuses_what_it_cannot_describe(fn, message):
    with pytest.raises(TriadError) as e:
        tool_schema(fn)
    assert str(e.value) == message


# the runner


def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


def scale(x: float, flag: bool = False) -> str:
    """Scale a number."""
    return f"{x * 2}:{type(x).__name__}:{flag}"


def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


def own_timeout() -> str:
    """Raises its own TimeoutError."""
    raise TimeoutError("upstream took too long")


def sleep_sync(seconds: float) -> str:
    """Sleep in a thread."""
    time.sleep(seconds)
    return "woke"


async def sleep_async(seconds: float) -> str:
    """Sleep on the loop."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


RUNNER = ToolRunner([add, scale, fail, own_timeout, sleep_sync, sleep_async], timeout=0.2)


def run(name: str, **arguments: object) -> str:
    message = asyncio.run(RUNNER.run(ToolCall("call00003", name, arguments)))
    assert message["role"] == "tool" and message["tool_call_id"] == "call00003" and message["name"] == name
    return message["content"]


def test_runner_names_and_schemas():
    assert RUNNER.names == ["add", "scale", "fail", "own_timeout", "sleep_sync", "sleep_async"]
    assert RUNNER.schemas == [
        tool_schema(fn) for fn in (add, scale, fail, own_timeout, sleep_sync, sleep_async)
    ]


def test_runner_returns_the_result_as_text():
    assert asyncio.run(RUNNER.run(ToolCall("call00000", "add", {"a": 2, "b": 40}))) == {
        "role": "tool",
        "tool_call_id": "call00000",
        "name": "add",
        "content": "42",
    }
    assert run("add", a=5) == "5"
    assert run("sleep_async", seconds=0) == "slept 0"


@pytest.mark.parametrize(
    "name, arguments, content",
    [
        ("mul", {"a": 1}, UNKNOWN_MUL),
        (
            "add",
            {"x": 1},
            "error: bad arguments for add: missing a required argument: 'a'; expected add(a, b)",
        ),
        (
            "add",
            {"a": 1, "c": 2},
            "error: bad arguments for add: got an unexpected keyword argument 'c'; expected add(a, b)",
        ),
        ("add", {"a": "1"}, "error: bad arguments for add: a must be integer, got string"),
        ("add", {"a": 1.0}, "error: bad arguments for add: a must be integer, got number"),
        ("add", {"a": True}, "error: bad arguments for add: a must be integer, got boolean"),
        ("add", {"a": 1, "b": None}, "error: bad arguments for add: b must be integer, got null"),
        ("scale", {"x": "2"}, "error: bad arguments for scale: x must be number, got string"),
        ("scale", {"x": 1, "flag": 1}, "error: bad arguments for scale: flag must be boolean, got integer"),
        ("fail", {"reason": ["a"]}, "error: bad arguments for fail: reason must be string, got array"),
        ("fail", {"reason": 3}, "error: bad arguments for fail: reason must be string, got integer"),
    ],
)
def test_runner_answers_bad_calls_with_one_line_errors(name, arguments, content):
    assert run(name, **arguments) == content


def test_an_int_is_accepted_for_a_float():
    assert run("scale", x=3) == "6:int:False"
    assert run("scale", x=1.5, flag=True) == "3.0:float:True"


def test_a_raising_tool_is_an_error_with_its_type_and_message_in_one_line():
    assert run("fail", reason="no\nway\r\nout") == "error: fail raised ValueError: no way out"
    long = run("fail", reason="x" * 2000)
    assert long.startswith("error: fail raised ValueError: xxx") and long.endswith("...") and len(long) == 500


def test_a_tools_own_timeout_error_is_not_taken_for_the_runners():
    assert run("own_timeout") == "error: own_timeout raised TimeoutError: upstream took too long"


def test_a_slow_sync_tool_times_out_without_blocking_the_loop():
    async def main() -> tuple[str, float, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        start = time.monotonic()
        message = await RUNNER.run(ToolCall("call00000", "sleep_sync", {"seconds": 1.0}))
        elapsed = time.monotonic() - start
        ticker.cancel()
        return message["content"], elapsed, ticks

    content, elapsed, ticks = asyncio.run(main())
    assert content == "error: sleep_sync timed out after 0.2 s"
    assert 0.19 < elapsed < 0.6
    assert ticks >= 5  # the loop kept running while the tool slept


def test_an_async_tool_times_out():
    start = time.monotonic()
    assert run("sleep_async", seconds=5) == "error: sleep_async timed out after 0.2 s"
    assert time.monotonic() - start < 0.6


def test_calls_of_a_turn_run_concurrently():
    runner = ToolRunner([sleep_async, sleep_sync], timeout=1.0)
    text = (
        call("sleep_async", seconds=0.2) + call("sleep_async", seconds=0.2) + call("sleep_sync", seconds=0.2)
    )
    start = time.monotonic()
    messages = asyncio.run(runner.run_turn(parse_tool_calls(text)))
    assert time.monotonic() - start < 0.35
    assert [m["content"] for m in messages] == ["slept 0.2", "slept 0.2", "woke"]


def test_run_turn_answers_calls_in_id_order_and_the_blocks_that_were_no_call_in_a_user_message():
    """A tool message must answer a call of the assistant message, which holds only the calls that
    parsed: the others' errors come back in one user message."""
    text = (
        call("add", a=1)
        + "<tool_call>nope</tool_call>"
        + call("mul")
        + call("add", a=2, b=2)
        + "<tool_call>{"
    )
    messages = asyncio.run(RUNNER.run_turn(parse_tool_calls(text)))
    assert messages == [
        {"role": "tool", "tool_call_id": "call00000", "name": "add", "content": "1"},
        {"role": "tool", "tool_call_id": "call00002", "name": "mul", "content": UNKNOWN_MUL},
        {"role": "tool", "tool_call_id": "call00003", "name": "add", "content": "4"},
        {
            "role": "user",
            "content": f"error: call00001: {NOT_JSON}{json_error('nope')}\nerror: call00004: {TRUNCATED}",
        },
    ]


def test_run_turn_with_no_calls_is_empty():
    assert asyncio.run(RUNNER.run_turn(parse_tool_calls("just text"))) == []


def test_tools_must_have_distinct_names():
    with pytest.raises(TriadError, match="two tools share a name"):
        ToolRunner([add, add], timeout=1.0)


# the assistant message


def test_assistant_message_with_calls():
    parsed = parse_tool_calls(
        "Computing. " + call("calculate", expression="1+2") + call("f", nested={"a": [1]})
    )
    assert assistant_message(parsed) == {
        "role": "assistant",
        "content": "Computing.",
        "tool_calls": [
            {
                "id": "call00000",
                "type": "function",
                "function": {"name": "calculate", "arguments": '{"expression": "1+2"}'},
            },
            {
                "id": "call00001",
                "type": "function",
                "function": {"name": "f", "arguments": '{"nested": {"a": [1]}}'},
            },
        ],
    }


def test_assistant_message_without_calls_has_no_tool_calls():
    assert assistant_message(parse_tool_calls(" 413 ")) == {"role": "assistant", "content": "413"}
    assert assistant_message(parse_tool_calls("<tool_call>bad</tool_call>")) == {
        "role": "assistant",
        "content": "",
    }


@pytest.mark.parametrize(
    "message",
    [
        {"content": "4", "reasoning": "add them", "reasoning_content": None},  # vLLM 0.32: both keys
        {"content": "4", "reasoning": None, "reasoning_content": "add them"},
        {"content": "4", "reasoning_content": "add them"},
    ],
)
def test_a_null_reasoning_field_does_not_hide_the_other(message):
    """Before: `reasoning_content: null` beside vLLM's `reasoning` lost the reasoning."""
    assert turn_from_message(message).reasoning == "add them"
