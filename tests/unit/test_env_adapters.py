"""Environments backed by libraries: math-verify, reasoning-gym, verifiers."""

from __future__ import annotations

import asyncio
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


ARITH = {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+", "-"]}


def test_reasoning_gym_prompts_are_the_librarys_items_held_out_by_seed():
    import reasoning_gym as rg

    env = load_environment("reasoning_gym:basic_arithmetic", {"config": ARITH, "size": 1000, "eval_size": 8})
    train = rg.create_dataset("basic_arithmetic", **ARITH, seed=0, size=1000)
    held_out = rg.create_dataset("basic_arithmetic", **ARITH, seed=1000, size=8)
    p = env.sample(random.Random(3))
    item = train[int(p.meta["index"])]
    system = rg.utils.SYSTEM_PROMPTS["default"]
    assert p.messages == [
        {"role": "system", "content": system},
        {"role": "user", "content": item["question"]},
    ]
    assert p.answer == item["answer"] and p.meta["task"] == "basic_arithmetic"
    assert [q.messages[1]["content"] for q in env.eval_prompts()] == [
        held_out[i]["question"] for i in range(8)
    ]
    text = load_environment(
        "reasoning_gym:basic_arithmetic", {"config": ARITH, "chat": False, "system_prompt": "none"}
    ).sample(random.Random(3))
    big = rg.create_dataset("basic_arithmetic", **ARITH, seed=0, size=10**6)
    assert text.text == big[int(text.meta["index"])]["question"] + "\n"


def test_reasoning_gym_held_out_questions_are_not_trained_on():
    env = load_environment("reasoning_gym:leg_counting", {"eval_size": 32})
    rng = random.Random(0)
    trained = {env.sample(rng).messages[-1]["content"] for _ in range(3000)}
    held_out = {p.messages[-1]["content"] for p in env.eval_prompts()}
    assert len(held_out) == 32 and not held_out & trained


@pytest.mark.parametrize(
    "reply", ["<answer>{a}</answer>", "<answer>{a}0</answer>", "{a}", "<answer>x</answer>", ""]
)
def test_reasoning_gym_rewards_are_the_librarys_scores(reply):
    import reasoning_gym as rg

    env = load_environment("reasoning_gym:basic_arithmetic", {"config": ARITH})
    dataset = rg.create_dataset("basic_arithmetic", **ARITH, seed=0, size=10**6)
    for p in (env.sample(random.Random(s)) for s in range(5)):
        completion = reply.format(a=p.answer)
        want = dataset.score_answer(rg.utils.extract_answer(completion), dataset[int(p.meta["index"])])
        conversation = [
            {"role": "assistant", "content": "thinking"},
            {"role": "assistant", "content": completion},
        ]
        assert env.reward(p, conversation) == want
    p = env.sample(random.Random(0))
    assert env.reward(p, [{"role": "assistant", "content": f"<answer>{p.answer}</answer>"}]) == 1.0
    assert env.reward(
        p, [{"role": "assistant", "content": f"<answer>{p.answer}0</answer>"}]
    ) == pytest.approx(len(p.answer) / (len(p.answer) + 1))
    untagged = load_environment("reasoning_gym:basic_arithmetic", {"config": ARITH, "answer_tag": False})
    assert untagged.reward(p, f" {p.answer}\n") == 1.0 and untagged.reward(p, "") == 0.0


def test_reasoning_gym_composite_mixes_tasks_by_weight():
    env = load_environment(
        "reasoning_gym",
        {"tasks": {"leg_counting": 1, "basic_arithmetic": 3}, "config": {"basic_arithmetic": ARITH}},
    )
    rng = random.Random(0)
    tasks = [env.sample(rng).meta["task"] for _ in range(800)]
    assert 0.68 < tasks.count("basic_arithmetic") / 800 < 0.82
    p = next(q for q in env.eval_prompts() if q.meta["task"] == "leg_counting")
    assert env.reward(p, [{"role": "assistant", "content": f"<answer>{p.answer}</answer>"}]) == 1.0
    assert env.name == "reasoning_gym"


@pytest.mark.parametrize(
    "ref, args, error",
    [
        ("reasoning_gym:chess_puzzles", {}, "unknown task.*'chess_puzzles'.*basic_arithmetic"),
        ("reasoning_gym:basic_arithmetic", {"config": {"colour": 1}}, "bad config for.*colour"),
        ("reasoning_gym:basic_arithmetic", {"tasks": {"leg_counting": 1}}, "one task.*not both"),
        ("reasoning_gym", {}, "one task.*not both"),
        ("reasoning_gym:leg_counting", {"system_prompt": "pirate"}, "system_prompt 'pirate' is not one of"),
        ("reasoning_gym", {"tasks": {"leg_counting": 1}, "config": {"basic_arithmetic": {}}}, "not in tasks"),
    ],
)
def test_reasoning_gym_bad_arguments_are_one_line_errors(ref, args, error):
    with pytest.raises(TriadError, match=error):
        load_environment(ref, args)


@pytest.fixture
def vf_env_module(tmp_path, monkeypatch):
    from tests.helpers import write_verifiers_env

    write_verifiers_env(tmp_path, "vf_two_turns_unit")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "vf_two_turns_unit"


def test_verifiers_environment_gives_its_dataset_as_prompts(vf_env_module):
    env = load_environment(f"verifiers:{vf_env_module}", {"num_examples": 6})
    assert env.name == f"verifiers:{vf_env_module}" and len(env.train) == 6
    rng = random.Random(0)
    prompts = [env.sample(rng) for _ in range(40)]
    assert {p.messages[0]["content"] for p in prompts} == {r["question"] for r in env.train}
    p = prompts[0]
    assert p.messages == [{"role": "user", "content": env.train[int(p.meta["index"])]["question"]}]
    assert p.answer == env.train[int(p.meta["index"])]["answer"]
    held_out = env.eval_prompts()
    assert [q.messages[0]["content"] for q in held_out] == [r["question"] for r in env.held_out]
    assert len(held_out) == 4 and not {q.messages[0]["content"] for q in held_out} & {
        r["question"] for r in env.train
    }


def test_verifiers_reward_and_metrics_come_from_the_rollout_output(vf_env_module):
    from orchestrator.batches.builder import env_metric_means, sample_metrics
    from orchestrator.environments import env_metrics
    from orchestrator.episodes.agents import AgentEpisode
    from orchestrator.episodes.sample import Sample

    env = load_environment(f"verifiers:{vf_env_module}")
    p = env.sample(random.Random(0))
    done = AgentEpisode(result={"reward": 1.25, "metrics": {"contains_answer": 1.0, "brevity": 0.5}})
    assert env.reward(p, done) == 1.25
    assert asyncio.run(env_metrics(env, p, done, timeout=5)) == {"contains_answer": 1.0, "brevity": 0.5}
    failed = AgentEpisode(result=RuntimeError("agent died"))
    assert env.reward(p, failed) == 0.0 and asyncio.run(env_metrics(env, p, failed, timeout=5)) == {}
    samples = [Sample(metrics={"brevity": 0.5}), Sample(metrics={"brevity": 0.25, "turns": 2}), Sample()]
    assert env_metric_means(samples) == {"env/brevity": 0.375, "env/turns": 2.0}
    assert sample_metrics(samples[1])["env/brevity"] == 0.25


def test_verifiers_errors_are_one_line(vf_env_module):
    with pytest.raises(TriadError, match="verifiers:no_such_vf_env: cannot load it.*no_such_vf_env"):
        load_environment("verifiers:no_such_vf_env")
    with pytest.raises(TriadError, match=f"verifiers:{vf_env_module}: cannot load it.*colour"):
        load_environment(f"verifiers:{vf_env_module}", {"colour": "red"})
    with pytest.raises(TriadError, match="name the environment"):
        load_environment("verifiers:")


@pytest.mark.parametrize(
    "module, ref, args, extra",
    [
        ("math_verify", "grade_school_math", {}, "math"),
        ("reasoning_gym", "reasoning_gym:leg_counting", {}, "reasoning-gym"),
        ("verifiers", "verifiers:anything", {}, "verifiers"),
    ],
)
def test_each_adapter_without_its_library_names_its_extra(monkeypatch, module, ref, args, extra):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # what an environment without the package sees
    with pytest.raises(TriadError, match=rf"pip install 'triad\[{extra}\]'") as e:
        load_environment(ref, args)
    assert "\n" not in str(e.value)
    assert load_environment("grade_school_math", {"checker": "numeric"}).checker == "numeric"
