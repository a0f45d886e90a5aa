"""Grade-school math word problems with robust answer extraction.

The shipped set (`data/grade_school_math.jsonl`, made by the script beside it)
has GSM8K's layout, so a user's copy of GSM8K works with `env_args.path`. The
last `eval_size` items are held out for evaluation and never sampled in training.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from orchestrator.environments import Prompt
from shared.errors import TriadError

DATA = Path(__file__).with_name("data") / "grade_school_math.jsonl"
NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?(?:/\d+)?"
MARKED = [
    re.compile(r"\\boxed\{\s*(" + NUMBER + r")\s*\}"),
    re.compile(r"####\s*(" + NUMBER + ")"),
    re.compile(r"answer\s*(?:is|:|=)\s*(" + NUMBER + ")", re.IGNORECASE),
]
ANY_NUMBER = re.compile(NUMBER)


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
            item = json.loads(line)
            answer = str(item["answer"]).rsplit("####", 1)[-1].strip()  # GSM8K: solution then ####
            items.append({"question": item["question"], "answer": answer})
        except (json.JSONDecodeError, KeyError, AttributeError):
            raise TriadError(f"{path}:{n}: expected JSON with 'question' and 'answer'") from None
    return items


@dataclass
class GradeSchoolMath:
    name: str = "grade_school_math"
    path: Path = DATA
    eval_size: int = 40
    template: str = "Question: {question}\nGive the final answer as: answer: <number>\nSolution:"
    items: list[dict[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.items = load_items(Path(self.path))
        if len(self.items) <= self.eval_size:
            raise TriadError(f"{self.path} has {len(self.items)} items; eval_size is {self.eval_size}")

    def _prompt(self, item: dict[str, str]) -> Prompt:
        return Prompt(text=self.template.format(question=item["question"]), answer=item["answer"])

    def sample(self, rng: random.Random) -> Prompt:
        return self._prompt(rng.choice(self.items[: -self.eval_size]))

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(item) for item in self.items[-self.eval_size :]]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if is_correct(completion, prompt.answer) else 0.0
