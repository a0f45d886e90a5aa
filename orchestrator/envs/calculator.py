"""Arithmetic with a calculator tool, in two forms.

`ChatCalculator` (built-in "calculator") is a chat environment: the user asks
`a*b+c=?`, the model may call the tool `calculate` (OpenAI tool calls, run by
triad) and answers in a turn without a tool call; the reward is 1 when that last
assistant message ends on the right number.

`TextCalculator` (built-in "calculator_text", for base models) is the text form:
the model may write `calc(<expression>)`; the environment answers with `= <value>`
on a new line and the model continues. The episode ends when the model writes
`answer: <number>` or after `max_turns` model turns; the reward is 1 for the right
final answer. The environment's lines are inserted as tokens the model did not
sample, so they carry `loss_mask = false`.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from dataclasses import dataclass
from typing import ClassVar

from orchestrator.envs.grade_school import parse_number
from orchestrator.prompt import Prompt

CALL = re.compile(r"calc\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
ANSWER = re.compile(r"answer:\s*(-?\d+)")
NUMBER = re.compile(r"-?\d+")
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_MAGNITUDE = 10**12
REPLY = "\n= "  # the environment's lines start with this and end with a newline


def model_text_after_last_reply(completion: str) -> str:
    before, sep, after = completion.rpartition(REPLY)
    return after.partition("\n")[2] if sep else completion


def evaluate(expression: str) -> int:
    """Integer arithmetic on + - * // % and parentheses; ValueError on anything else."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            value = OPERATORS[type(node.op)](walk(node.left), walk(node.right))
            if abs(value) > MAX_MAGNITUDE:
                raise ValueError("number too large")
            return value
        raise ValueError(f"unsupported: {ast.dump(node)[:40]}")

    try:
        return walk(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, RecursionError) as e:
        raise ValueError(str(e)) from None


def calculate(expression: str) -> str:
    """Evaluate an integer arithmetic expression."""
    return str(evaluate(expression))


def final_number(content: str) -> int | None:
    """The last whole number in a message, or None."""
    found = NUMBER.findall(content)
    return int(found[-1]) if found else None


@dataclass(frozen=True)
class ChatCalculator:
    """`a*b+c=?` as a chat; the model calls `calculate` and answers with the number."""

    name: str = "calculator"
    max_turns: int = 3
    max_operand: int = 99
    tools: ClassVar[tuple] = (calculate,)

    def sample(self, rng: random.Random) -> Prompt:
        a, b, c = (rng.randint(2, self.max_operand) for _ in range(3))
        question = {"role": "user", "content": f"{a}*{b}+{c}=?"}
        return Prompt(messages=[question], answer=str(a * b + c))

    def respond(self, prompt: Prompt, conversation: list[dict]) -> str | None:
        return None  # an answer without a tool call ends the episode

    def reward(self, prompt: Prompt, conversation: list[dict]) -> float:
        """1 if the last assistant message made no tool call (nor had one answered) and its
        last number is the answer, else 0."""
        turns = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
        if not turns:
            return 0.0
        last = conversation[turns[-1]]
        content = last.get("content") or ""
        called = last.get("tool_calls") or "<tool_call>" in content
        if called or any(m.get("role") == "tool" for m in conversation[turns[-1] :]):
            return 0.0
        return 1.0 if final_number(content) == int(prompt.answer) else 0.0

    def demonstration(self, prompt: Prompt) -> list[dict]:
        """The ideal conversation after the prompt: one tool call, then the result (for warm-ups)."""
        expression = prompt.messages[-1]["content"].removesuffix("=?")
        call = {"name": "calculate", "arguments": json.dumps({"expression": expression})}
        tool_call = {"id": "call_0", "type": "function", "function": call}
        return [
            {"role": "assistant", "content": "", "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": "call_0", "name": "calculate", "content": calculate(expression)},
            {"role": "assistant", "content": prompt.answer},
        ]


@dataclass(frozen=True)
class TextCalculator:
    """The text form for base models: `calc(...)` lines and `answer: N`."""

    name: str = "calculator_text"
    max_turns: int = 3
    max_operand: int = 99

    def sample(self, rng: random.Random) -> Prompt:
        a, b, c = (rng.randint(2, self.max_operand) for _ in range(3))
        expression = f"{a}*{b}+{c}"
        return Prompt(text=f"{expression}=? tool: calc(...)\n", answer=str(evaluate(expression)))

    def respond(self, prompt: Prompt, completion: str) -> str | None:
        last_turn = model_text_after_last_reply(completion)
        if ANSWER.search(last_turn):
            return None
        calls = CALL.findall(last_turn)
        if not calls:
            return f"{REPLY}no tool call\n"
        try:
            return f"{REPLY}{evaluate(calls[-1])}\n"
        except ValueError:
            return f"{REPLY}error\n"

    def reward(self, prompt: Prompt, completion: str) -> float:
        found = ANSWER.findall(completion)
        return 1.0 if found and parse_number(found[-1]) == parse_number(prompt.answer) else 0.0
