import random

import pytest

from orchestrator.tasks import ReverseText, get_task, positional_match
from shared.errors import TriadError


def test_positional_match_gives_partial_credit():
    assert positional_match("dcba", "dcba") == 1.0
    assert positional_match("dcxa", "dcba") == 0.75
    assert positional_match("dc", "dcba") == 0.5
    assert positional_match("dcbaaa", "dcba") == pytest.approx(4 / 6)
    assert positional_match("", "") == 1.0


def test_reverse_task_prompts_and_reward():
    task = ReverseText()
    p = task.sample(random.Random(0))
    word = p.text.removeprefix("reverse ").removesuffix(": ")
    assert 3 <= len(word) <= 5 and p.answer == word[::-1]
    assert task.reward(p, f" {p.answer}\n") == 1.0


def test_unknown_task_names_the_choices():
    with pytest.raises(TriadError, match="reverse"):
        get_task("chess")
