"""A multi-turn tool-use environment: arithmetic with a calculator tool.

The model may write `calc(<expression>)`; the environment answers with
`= <value>` on a new line and the model continues. The episode ends when the
model writes `answer: <number>` or after `max_turns` model turns; the reward
is 1 for the right final answer. The environment's lines are inserted as
tokens the model did not sample, so they carry `loss_mask = false`.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass

from orchestrator.environments import Prompt
from orchestrator.envs.grade_school import parse_number

CALL = re.compile(r"calc\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
ANSWER = re.compile(r"answer:\s*(-?\d+)")
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


@dataclass(frozen=True)
class Calculator:
    name: str = "calculator"
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
