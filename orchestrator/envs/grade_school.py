"""Math word problems, answers checked with math-verify (or a plain numeric check).

The shipped set (`data/grade_school_math.jsonl`, made by the script beside it)
has GSM8K's layout, so a user's copy of GSM8K works with `orchestrator.environment.args.path`; so does
a MATH-format file (`problem`, and `answer` or a `solution` ending in `\\boxed{}`).
The last `eval_size` items are held out for evaluation and never sampled in training.

`checker = "math_verify"` (the default; `pip install 'triad[math]'`) compares the
answer with HuggingFace's math-verify: LaTeX, fractions, boxed answers, sets,
symbolic expressions. `checker = "numeric"` is the dependency-free check below:
the marked or last number of the completion, compared as a number.
"""

from __future__ import annotations

import json
import random
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from orchestrator.envs.extras import require
from orchestrator.prompt import Prompt
from shared.errors import TriadError

DATA = Path(__file__).with_name("data") / "grade_school_math.jsonl"
NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?(?:/\d+)?"
MARKED = [
    re.compile(r"\\boxed\{\s*(" + NUMBER + r")\s*\}"),
    re.compile(r"####\s*(" + NUMBER + ")"),
    re.compile(r"answer\s*(?:is|:|=)\s*(" + NUMBER + ")", re.IGNORECASE),
]
ANY_NUMBER = re.compile(NUMBER)
CHECKERS = ("math_verify", "numeric")
MATH_VERIFY_TIMEOUT_S = 5


def parse_number(text: str) -> Fraction | None:
    """'1,234' -> 1234, '$5.50' -> 11/2, '3/4' -> 3/4; None if it is not a number."""
    cleaned = text.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(completion: str) -> Fraction | None:
    """The final answer: a boxed or marked one if present (the last such), else the last number."""
    for pattern in MARKED:
        found = pattern.findall(completion)
        if found:
            return parse_number(found[-1])
    numbers = ANY_NUMBER.findall(completion)
    return parse_number(numbers[-1]) if numbers else None


def is_correct(completion: str, answer: str) -> bool:
    got, want = extract_answer(completion), parse_number(answer)
    return got is not None and want is not None and got == want


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def item_of(line: str) -> dict[str, str]:
    """One dataset line as {question, answer}: GSM8K ('question', 'answer' after '####') or
    MATH ('problem', and 'answer' or the last boxed answer of 'solution'); KeyError if neither."""
    item = json.loads(line)
    question = item["question"] if "question" in item else item["problem"]
    if "answer" in item:
        answer = str(item["answer"]).rsplit("####", 1)[-1].strip()
    else:
        answer = last_boxed(item["solution"])
        if answer is None:
            raise KeyError("answer")
    return {"question": str(question), "answer": answer}


def load_items(path: Path) -> list[dict[str, str]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TriadError(f"cannot read the math dataset {path}: {e.strerror}") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(item_of(line))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
            raise TriadError(
                f"{path}:{n}: expected JSON with 'question' and 'answer' (GSM8K) or 'problem' and "
                "'answer' or a 'solution' with \\boxed{} (MATH)"
            ) from None
    return items


def math_verify_correct(completion: str, answer: str) -> bool:
    """math-verify's verdict on the completion against the gold answer (read as LaTeX).
    Its timeouts use SIGALRM, so they are on only in the main thread."""
    mv = require("math_verify", "math-verify", "math", "the math environment's checker 'math_verify'")
    limit = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = mv.parse(f"${answer}$", parsing_timeout=limit)
    got = mv.parse(completion, parsing_timeout=limit)
    return bool(gold and got and mv.verify(gold, got, timeout_seconds=limit))


@dataclass
class GradeSchoolMath:
    name: str = "grade_school_math"
    path: Path = DATA
    eval_size: int = 40
    template: str = "Question: {question}\nGive the final answer as: answer: <number>\nSolution:"
    checker: str = "math_verify"
    items: list[dict[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.checker not in CHECKERS:
            raise TriadError(f"grade_school_math: checker {self.checker!r} is not one of {CHECKERS}")
        if self.checker == "math_verify":
            require("math_verify", "math-verify", "math", "the math environment's checker 'math_verify'")
        self.items = load_items(Path(self.path))
        if len(self.items) <= self.eval_size:
            raise TriadError(f"{self.path} has {len(self.items)} items; eval_size is {self.eval_size}")

    def _prompt(self, item: dict[str, str]) -> Prompt:
        return Prompt(text=self.template.format(question=item["question"]), answer=item["answer"])

    def sample(self, rng: random.Random) -> Prompt:
        return self._prompt(rng.choice(self.items[: -self.eval_size]))

    def dataset(self) -> list[Prompt]:
        """The training prompts (all but the held-out last `eval_size`), each once per epoch."""
        return [self._prompt(item) for item in self.items[: -self.eval_size]]

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(item) for item in self.items[-self.eval_size :]]

    def reward(self, prompt: Prompt, completion: str) -> float:
        check = math_verify_correct if self.checker == "math_verify" else is_correct
        return 1.0 if check(completion, prompt.answer) else 0.0
