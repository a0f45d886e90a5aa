"""Tools: their OpenAI schemas, and running a turn's calls.

`tool_schema` makes the OpenAI schema of a plain or async Python function, and
`ToolRunner` runs the calls of a parsed turn (`tool_calls.py`) with a timeout,
answering each one with an OpenAI tool message whose content is the result, or
"error: ..." in one line.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from orchestrator import env_calls
from orchestrator.episodes.tool_calls import JSON_TYPES, ParsedTurn, ToolCall, json_type_of
from shared.errors import TriadError, one_line

_TYPE_NAMES = {t.__name__: t for t, _ in JSON_TYPES}


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
    number = re.search(r"\d*$", message["tool_call_id"]).group()
    return (int(number) if number else 1 << 62), message["tool_call_id"]


class ToolRunner:
    """Runs a turn's tool calls against a fixed set of tools, each call bounded by `timeout` s.

    Sync tools run in the bounded pool for environment code (`env_calls.py`), so that a slow one
    cannot block the event loop; one that times out is answered at once, though its worker runs
    until the tool returns and counts as stuck meanwhile."""

    def __init__(self, tools: list[Callable[..., Any]], timeout: float, max_result_chars: int = 8192):
        self.timeout, self.max_result_chars = timeout, max_result_chars
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
            got, want = json_type_of(value), _json_schema(t)["type"]
            return None, f"bad arguments for {call.name}: {name} must be {want}, got {got}"
        return bound, None

    async def _invoke(self, fn: Callable[..., Any], bound: inspect.BoundArguments) -> Any:
        return await env_calls.call(fn, *bound.args, **bound.kwargs)

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
                    return self._capped(str(await self._invoke(self._tools[call.name], bound)))
                except (Exception, SystemExit) as e:  # the tool's own errors, its own TimeoutError too
                    return _error(f"{call.name} raised {_describe(e)}")
        except TimeoutError:
            why = env_calls.not_started()
            return _error(f"{call.name}: {why}" if why else f"{call.name} timed out after {self.timeout:g} s")

    def _capped(self, result: str) -> str:
        """A result over `max_result_chars` (orchestrator.chat.max_tool_result_chars) is cut, and says so."""
        if len(result) <= self.max_result_chars:
            return result
        return result[: self.max_result_chars] + f"... [{len(result) - self.max_result_chars} characters cut]"

    async def run(self, call: ToolCall) -> dict[str, str]:
        """The tool message answering `call`: the result, or "error: ..." in one line."""
        return tool_message(call.id, call.name, await self._content(call))

    async def run_turn(self, parsed: ParsedTurn) -> list[dict[str, str]]:
        """Tool messages answering the turn's calls (run concurrently), in id order, then one user
        message with the errors of its blocks that were no call: a tool message must answer a call
        of the assistant message (templates such as gpt-oss's refuse one that does not), and those
        are not in it."""
        answers = sorted(await asyncio.gather(*(self.run(call) for call in parsed.calls)), key=_id_order)
        if parsed.errors:
            lines = [_error(f"{e.id}: {e.message}") for e in parsed.errors]
            answers.append({"role": "user", "content": "\n".join(lines)})
        return answers
