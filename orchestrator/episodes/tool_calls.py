"""Tool calls as data: their types, the checks a call's arguments get, and the Hermes text parser.

A model's turn is split into its text, its reasoning and its tool calls by the
server's own parsers (vLLM's `/v1/chat/completions/derender`, `inference.tool_parser`);
`turn_from_message` checks what a parser found. `parse_tool_calls` is triad's
own parser of the Hermes / Qwen format, for servers without derender (SGLang):

    <tool_call>
    {"name": "calculate", "arguments": {"expression": "12*34+5"}}
    </tool_call>

Every call that cannot be used becomes a `ToolCallError` instead of raising: the
model's text is untrusted input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from shared.errors import one_line

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 16  # per turn; further blocks get one error entry and are not run
MAX_CALL_CHARS = 16 * 1024  # one block's JSON
MAX_DEPTH = 64  # of lists and objects in the arguments, so that serialising them again cannot recurse too far
_CLOSE_AFTER = re.compile(r"\s*" + re.escape(CLOSE))
_DECODER = json.JSONDecoder(strict=False)  # control characters in strings (a newline in code) are allowed
JSON_TYPES: list[tuple[type, str]] = [
    (bool, "boolean"),  # before int: a bool is an int to Python, not to JSON
    (str, "string"),
    (int, "integer"),
    (float, "number"),
    (list, "array"),
    (dict, "object"),
]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    """A tool-call block that cannot be run, and why (one line)."""

    id: str
    message: str


@dataclass(frozen=True)
class ParsedTurn:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    reasoning: str | None = None  # what the reasoning parser split off (`<think>...</think>`)


def call_id(n: int) -> str:
    """The id of a turn's n-th call: nine letters and digits, as Mistral's templates require."""
    return f"call{n:05d}"


def probe_call(tool: str) -> dict[str, Any]:
    """A call of `tool` without arguments, in the OpenAI format: what a template's rendering of
    tool calls is checked with."""
    return {"id": call_id(0), "type": "function", "function": {"name": tool, "arguments": "{}"}}


def json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for t, name in JSON_TYPES if isinstance(value, t)), type(value).__name__)


def _block_end(text: str, body_start: int) -> tuple[int, int, bool]:
    """(end of the body, end of the block, whether it is closed) for the block whose body
    starts at `body_start`. A body that is one JSON value followed by the closing tag ends
    there, even if a string in it holds a tag; otherwise see `_plain_end`."""
    window = text[body_start : body_start + MAX_CALL_CHARS + 1]
    start = len(window) - len(window.lstrip())
    try:
        _, end = _DECODER.raw_decode(window, start)
    except (ValueError, RecursionError):
        pass
    else:
        close = _CLOSE_AFTER.match(text, body_start + end)
        if close:
            return body_start + end, close.end(), True
    return _plain_end(text, body_start)


def _plain_end(text: str, body_start: int) -> tuple[int, int, bool]:
    """The first closing tag ends the block; if the next opening tag or the end of the
    text comes first, the block is truncated and ends there."""
    next_open = text.find(OPEN, body_start)
    end = len(text) if next_open < 0 else next_open
    close_at = text.find(CLOSE, body_start, end)  # not past `end`: linear time on many open tags
    if close_at >= 0:
        return close_at, close_at + len(CLOSE), True
    return end, end, False


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in a JSON value, counted up to MAX_DEPTH + 1."""
    deepest, stack = 0, [(value, 0)]
    while stack and deepest <= MAX_DEPTH:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def _load_json(text: str, what: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why not) for text that is not JSON."""
    try:
        return _DECODER.decode(text.strip()), None
    except RecursionError:
        return None, f"{what} is nested too deeply"
    except ValueError as e:
        return None, f"{what} is not valid JSON: {e}"


def _parse_call(id_: str, body: str) -> ToolCall | ToolCallError:
    if len(body) > MAX_CALL_CHARS:
        return ToolCallError(id_, f"tool call too large: over {MAX_CALL_CHARS} characters of JSON")
    obj, why = _load_json(body, "tool call")
    if why:
        return ToolCallError(id_, one_line(why))
    if not isinstance(obj, dict):
        return ToolCallError(id_, f"tool call must be a JSON object, got {json_type_of(obj)}")
    return check_call(id_, obj.get("name"), obj.get("arguments"))


def check_call(id_: str, name: Any, arguments: Any) -> ToolCall | ToolCallError:
    """A call whose name is a string and whose arguments are a JSON object (or a string holding
    one, OpenAI's form), not nested too deeply; otherwise why not."""
    if not isinstance(name, str) or not name:
        return ToolCallError(id_, 'tool call has no "name" string')
    if isinstance(arguments, str) and len(arguments) > MAX_CALL_CHARS:
        return ToolCallError(id_, f"tool call too large: over {MAX_CALL_CHARS} characters of JSON")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):  # OpenAI's form: a JSON string holding the object
        arguments, why = _load_json(arguments, '"arguments" string')
        if why:
            return ToolCallError(id_, one_line(why))
    if not isinstance(arguments, dict):
        what = json_type_of(arguments)
        return ToolCallError(id_, f'"arguments" of {one_line(name, 100)!r} must be a JSON object, got {what}')
    if _depth(arguments) > MAX_DEPTH:
        return ToolCallError(id_, f'"arguments" nest more than {MAX_DEPTH} levels deep')
    return ToolCall(id_, name, arguments)


def parse_tool_calls(text: str) -> ParsedTurn:
    """The turn's text without its tool-call blocks, its calls, and its unusable blocks.

    Calls and errors share one numbering (`call_id`) in the order the
    blocks appear. A `<tool_call>` with no closing tag before the next `<tool_call>` or the
    end of the text is a truncated call that ends there; a closing tag with no opening one
    is text. Never raises."""
    pieces: list[str] = []
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    blocks = pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        pieces.append(text[pos:start])
        body_start = start + len(OPEN)
        # past MAX_CALLS only the end of each block is looked for, so that many blocks stay cheap
        body_end, pos, closed = (_block_end if blocks < MAX_CALLS else _plain_end)(text, body_start)
        id_ = call_id(blocks)
        blocks += 1
        if blocks > MAX_CALLS:
            continue
        if not closed:
            errors.append(ToolCallError(id_, f"truncated tool call: {OPEN} with no {CLOSE}"))
            continue
        parsed = _parse_call(id_, text[body_start:body_end])
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            errors.append(parsed)
    pieces.append(text[pos:])
    if blocks > MAX_CALLS:
        why = f"too many tool calls: {blocks} in one turn, at most {MAX_CALLS}; the rest were not run"
        errors.append(ToolCallError(call_id(MAX_CALLS), why))
    return ParsedTurn("".join(pieces).strip(), calls, errors)


def assistant_message(parsed: ParsedTurn) -> dict[str, Any]:
    """The OpenAI assistant message for a parsed turn (arguments as JSON strings)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in parsed.calls
        ]
    return message


def turn_from_message(message: dict[str, Any]) -> ParsedTurn:
    """A turn as a server's parsers split it (an OpenAI assistant message: `content`, `reasoning`
    or `reasoning_content`, either of them null, `tool_calls`), each call checked as `check_call`
    does and renumbered."""
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    found = message.get("tool_calls") or []
    for n, raw in enumerate(found[:MAX_CALLS]):
        function = (raw.get("function") if isinstance(raw, dict) else None) or {}
        checked = check_call(call_id(n), function.get("name"), function.get("arguments"))
        (calls if isinstance(checked, ToolCall) else errors).append(checked)
    if len(found) > MAX_CALLS:
        why = f"too many tool calls: {len(found)} in one turn, at most {MAX_CALLS}; the rest were not run"
        errors.append(ToolCallError(call_id(MAX_CALLS), why))
    reasoning = message.get("reasoning")  # vLLM's field; `reasoning_content` the older one, null if unset
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    return ParsedTurn((message.get("content") or "").strip(), calls, errors, reasoning)
