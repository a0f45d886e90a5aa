"""Environments backed by libraries: math-verify, reasoning-gym, verifiers."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.environments import load_environment
from orchestrator.envs.extras import require
from orchestrator.envs.grade_school import GradeSchoolMath, last_boxed, math_verify_correct
from shared.errors import TriadError

MATH_FORMS = [
    # (completion, gold answer, math-verify's verdict, the numeric check's verdict)
    ("answer: 42", "42", 1.0, 1.0),
    ("The answer is \\boxed{42}.", "42", 1.0, 1.0),
    ("#### 1,000", "1000", 1.0, 1.0),
    ("so 1,000 apples in all", "1000", 1.0, 1.0),
    ("answer: 12.0", "12", 1.0, 1.0),
    ("\\boxed{\\frac{3}{4}}", "3/4", 1.0, 0.0),
    ("answer: 0.75", "\\frac{3}{4}", 1.0, 0.0),
    ("$\\frac{6}{8}$", "\\frac{3}{4}", 1.0, 0.0),
    ("\\boxed{1/2}", "0.5", 1.0, 1.0),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0, 0.0),
    ("\\boxed{1+x^2}", "x^2+1", 1.0, 0.0),
    ("\\boxed{(1,2)}", "(1,2)", 1.0, 0.0),
    ("answer: $5.50", "5.5", 1.0, 1.0),
    ("\\boxed{\\dfrac{1}{3}}", "\\frac{1}{3}", 1.0, 0.0),
    ("answer: 41", "42", 0.0, 0.0),
    ("\\boxed{\\frac{3}{5}}", "\\frac{3}{4}", 0.0, 0.0),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0, 0.0),
    ("\\boxed{x^2-1}", "x^2+1", 0.0, 0.0),
    ("3 apples, then 4", "3", 0.0, 0.0),
    ("answer: -3", "3", 0.0, 0.0),
    ("no idea", "42", 0.0, 0.0),
    ("", "42", 0.0, 0.0),
    ("\\boxed{", "42", 0.0, 0.0),
    ("\\boxed{}", "1", 0.0, 0.0),
]


@pytest.mark.parametrize("completion, answer, verified, numeric", MATH_FORMS)
def test_math_env_rewards_each_answer_form(completion, answer, verified, numeric):
    prompt = GradeSchoolMath(checker="numeric")._prompt({"question": "q", "answer": answer})
    assert GradeSchoolMath().reward(prompt, completion) == verified
    assert GradeSchoolMath(checker="numeric").reward(prompt, completion) == numeric
    assert math_verify_correct(completion, answer) is bool(verified)


def test_math_env_reads_math_format_and_rejects_a_bad_checker(tmp_path):
    data = tmp_path / "math.jsonl"
    rows = [
        {"problem": "Simplify 6/8.", "solution": "Divide: $\\boxed{\\frac{3}{4}}$."},
        {"problem": "Root of 2?", "answer": "\\sqrt{2}", "solution": "..."},
        {"problem": "1+1?", "solution": "It is \\boxed{2}"},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = GradeSchoolMath(path=data, eval_size=1)
    assert [i["answer"] for i in env.items] == ["\\frac{3}{4}", "\\sqrt{2}", "2"]
    assert env.reward(env._prompt(env.items[0]), "so \\boxed{0.75}") == 1.0
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    data.write_text(json.dumps({"problem": "p", "solution": "no box"}) + "\n")
    with pytest.raises(TriadError, match=f"{data}:1: expected JSON.*MATH"):
        GradeSchoolMath(path=data)
    with pytest.raises(TriadError, match="checker 'sympy' is not one of"):
        load_environment("grade_school_math", {"checker": "sympy"})


def test_a_missing_library_names_the_extra_to_install():
    with pytest.raises(TriadError, match=r"needs the package 'nope'.*pip install 'triad\[nope-extra\]'"):
        require("triad_no_such_module", "nope", "nope-extra", "the test")
    assert require("math_verify", "math-verify", "math", "the test").verify
    assert GradeSchoolMath().sample(random.Random(0)).answer
