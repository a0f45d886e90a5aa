"""Tool calls: parsing them from the model's text, tool schemas, and running the tools.

The model calls a tool by writing, anywhere in its turn (the Hermes / Qwen format),

    <tool_call>
    {"name": "calculate", "arguments": {"expression": "12*34+5"}}
    </tool_call>

`parse_tool_calls` splits a turn into its text and its calls, and turns every block
that cannot be used into a `ToolCallError` instead of raising: the model's text is
untrusted input. `tool_schema` makes the OpenAI schema of a plain or async Python
function, and `ToolRunner` runs the calls with a timeout, answering each one with an
OpenAI tool message whose content is the result, or "error: ..." in one line.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import untrusted
from shared.errors import TriadError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 16  # per turn; further blocks get one error entry and are not run
MAX_CALL_CHARS = 16 * 1024  # one block's JSON
MAX_DEPTH = 64  # of lists and objects in the arguments, so that serialising them again cannot recurse too far
MAX_ERROR_CHARS = 500
_CLOSE_AFTER = re.compile(r"\s*" + re.escape(CLOSE))
_DECODER = json.JSONDecoder(strict=False)  # control characters in strings (a newline in code) are allowed
_LINE_BREAKS = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
JSON_TYPES: list[tuple[type, str]] = [
    (bool, "boolean"),  # before int: a bool is an int to Python, not to JSON
    (str, "string"),
    (int, "integer"),
    (float, "number"),
    (list, "array"),
    (dict, "object"),
]
_TYPE_NAMES = {t.__name__: t for t, _ in JSON_TYPES}


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


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = _LINE_BREAKS.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_type_of(value: Any) -> str:
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


def _parse_call(call_id: str, body: str) -> ToolCall | ToolCallError:
    if len(body) > MAX_CALL_CHARS:
        return ToolCallError(call_id, f"tool call too large: over {MAX_CALL_CHARS} characters of JSON")
    obj, why = _load_json(body, "tool call")
    if why:
        return ToolCallError(call_id, one_line(why))
    if not isinstance(obj, dict):
        return ToolCallError(call_id, f"tool call must be a JSON object, got {_json_type_of(obj)}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(call_id, 'tool call has no "name" string')
    arguments = obj.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):  # OpenAI's form: a JSON string holding the object
        arguments, why = _load_json(arguments, '"arguments" string')
        if why:
            return ToolCallError(call_id, one_line(why))
    if not isinstance(arguments, dict):
        what = _json_type_of(arguments)
        return ToolCallError(
            call_id, f'"arguments" of {one_line(name, 100)!r} must be a JSON object, got {what}'
        )
    if _depth(arguments) > MAX_DEPTH:
        return ToolCallError(call_id, f'"arguments" nest more than {MAX_DEPTH} levels deep')
    return ToolCall(call_id, name, arguments)


def parse_tool_calls(text: str) -> ParsedTurn:
    """The turn's text without its tool-call blocks, its calls, and its unusable blocks.

    Calls and errors share one numbering ("call_0", "call_1", ...) in the order the
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
        call_id = f"call_{blocks}"
        blocks += 1
        if blocks > MAX_CALLS:
            continue
        if not closed:
            errors.append(ToolCallError(call_id, f"truncated tool call: {OPEN} with no {CLOSE}"))
            continue
        parsed = _parse_call(call_id, text[body_start:body_end])
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            errors.append(parsed)
    pieces.append(text[pos:])
    if blocks > MAX_CALLS:
        why = f"too many tool calls: {blocks} in one turn, at most {MAX_CALLS}; the rest were not run"
        errors.append(ToolCallError(f"call_{MAX_CALLS}", why))
    return ParsedTurn("".join(pieces).strip(), calls, errors)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _base_type(annotation: Any) -> Any:
    """`list` for list[int], a builtin for its name in a string annotation, else as given."""
    if isinstance(annotation, str):
        return _TYPE_NAMES.get(annotation.partition("[")[0].strip())
    return typing.get_origin(annotation) or annotation


def parameter_types(fn: Callable[..., Any]) -> dict[str, type | None]:
    """Each parameter's JSON-able type (str, int, float, bool, list, dict), None for any other;
    TriadError for a parameter that cannot be passed by name."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TriadError(f"tool {_name(fn)!r}: cannot read its signature: {e}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: fall back to its text
        hints = {}
    types: dict[str, type | None] = {}
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            shown = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
            why = "cannot be passed by name, as the model passes arguments"
            raise TriadError(f"tool {_name(fn)!r}: parameter {shown} {why}")
        base = _base_type(hints.get(p.name, p.annotation))
        types[p.name] = next((t for t, _ in JSON_TYPES if base is t), None)
    return types


def _json_schema(t: type | None) -> dict[str, str]:
    return next(({"type": name} for known, name in JSON_TYPES if t is known), {})


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool schema of a plain or async function: its name, its docstring's
    first paragraph, and its parameters (those without a default are required)."""
    doc = inspect.getdoc(fn) or ""
    description = " ".join(re.split(r"\n\s*\n", doc.strip())[0].split())
    if not description:
        raise TriadError(f"tool {_name(fn)!r} has no docstring: its first paragraph describes the tool")
    types = parameter_types(fn)
    parameters = inspect.signature(fn).parameters
    return {
        "type": "function",
        "function": {
            "name": _name(fn),
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {name: _json_schema(t) for name, t in types.items()},
                "required": [name for name, p in parameters.items() if p.default is p.empty],
            },
        },
    }


def tool_message(call_id: str, name: str, content: str) -> dict[str, str]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _error(what: str) -> str:
    return one_line(f"error: {what}")


def _describe(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # a __str__ that raises
        return type(e).__name__


def _fits(value: Any, t: type | None) -> bool:
    """Whether a JSON value suits a parameter of type t: a bool is no int, an int is a float."""
    if t is None:
        return True
    if isinstance(value, bool):
        return t is bool
    return isinstance(value, t) or (t is float and isinstance(value, int))


def _id_order(message: dict[str, str]) -> tuple[int, str]:
    number = message["tool_call_id"].rpartition("_")[2]
    return (int(number) if number.isdigit() else 1 << 62), message["tool_call_id"]


class ToolRunner:
    """Runs a turn's tool calls against a fixed set of tools, each call bounded by `timeout` s.

    Sync tools run in a thread (asyncio.to_thread) so that a slow one cannot block the event
    loop; one that times out is answered at once, though its thread runs until the tool returns."""

    def __init__(self, tools: list[Callable[..., Any]], timeout: float):
        self.timeout = timeout
        self.schemas = [tool_schema(fn) for fn in tools]
        self._tools = {_name(fn): fn for fn in tools}
        if len(self._tools) != len(tools):
            raise TriadError(f"two tools share a name: {sorted(_name(fn) for fn in tools)}")
        self._types = {name: parameter_types(fn) for name, fn in self._tools.items()}

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def _check(self, call: ToolCall) -> tuple[inspect.BoundArguments | None, str | None]:
        """The call's bound arguments, or why they do not fit the tool."""
        fn, types = self._tools[call.name], self._types[call.name]
        expected = f"expected {call.name}({', '.join(types)})"
        try:
            bound = inspect.signature(fn).bind(**call.arguments)
        except TypeError as e:
            return None, f"bad arguments for {call.name}: {e}; {expected}"
        for name, value in bound.arguments.items():
            t = types[name]
            if _fits(value, t):
                continue
            got, want = _json_type_of(value), _json_schema(t)["type"]
            return None, f"bad arguments for {call.name}: {name} must be {want}, got {got}"
        return bound, None

    async def _invoke(self, fn: Callable[..., Any], bound: inspect.BoundArguments) -> Any:
        return await untrusted.call(fn, *bound.args, **bound.kwargs)

    async def _content(self, call: ToolCall) -> str:
        if call.name not in self._tools:
            return _error(
                f"unknown tool {one_line(call.name, 100)!r}; the tools are: {', '.join(self.names)}"
            )
        bound, why = self._check(call)
        if bound is None:
            return _error(str(why))
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    return str(await self._invoke(self._tools[call.name], bound))
                except (Exception, SystemExit) as e:  # the tool's own errors, its own TimeoutError too
                    return _error(f"{call.name} raised {_describe(e)}")
        except TimeoutError:
            return _error(f"{call.name} timed out after {self.timeout:g} s")

    async def run(self, call: ToolCall) -> dict[str, str]:
        """The tool message answering `call`: the result, or "error: ..." in one line."""
        return tool_message(call.id, call.name, await self._content(call))

    async def run_turn(self, parsed: ParsedTurn) -> list[dict[str, str]]:
        """Tool messages for the turn's calls (run concurrently) and its errors, in id order."""
        answers = list(await asyncio.gather(*(self.run(call) for call in parsed.calls)))
        answers += [tool_message(e.id, "", _error(e.message)) for e in parsed.errors]
        return sorted(answers, key=_id_order)


def assistant_message(parsed: ParsedTurn) -> dict[str, Any]:
    """The OpenAI assistant message for a parsed turn (arguments as JSON strings)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
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
