"""Environments: built-ins, answer checking, loading user environments, multi-turn rollouts."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from collections.abc import Awaitable
from fractions import Fraction

import pytest

from orchestrator.batches.advantages import has_signal, overlong_penalty
from orchestrator.batches.stats import percentile
from orchestrator.environments import env_metrics, eval_prompts, load_environment, respond, score
from orchestrator.envs.basic import ReverseText, positional_match
from orchestrator.envs.calculator import TextCalculator, evaluate
from orchestrator.envs.grade_school import GradeSchoolMath, extract_answer, is_correct
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.text import TextRollouts
from orchestrator.evaluation import evaluate as evaluate_held_out
from orchestrator.evaluation import pass_at_k
from orchestrator.failures import EpisodeEnded, RolloutFailed
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import Server, ServerPool
from shared.config import load_config
from shared.errors import TriadError
from tests.fake_openai import FakeServer, encode
from tests.helpers import write_env_plugin


def test_positional_match_gives_partial_credit():
    assert positional_match("dcba", "dcba") == 1.0
    assert positional_match("dcxa", "dcba") == 0.75
    assert positional_match("dc", "dcba") == 0.5
    assert positional_match("dcbaaa", "dcba") == pytest.approx(4 / 6)
    assert positional_match("", "") == 1.0


def test_reverse_task_prompts_and_reward():
    env = ReverseText()
    p = env.sample(random.Random(0))
    word = p.text.removeprefix("reverse ").removesuffix(": ")
    assert 3 <= len(word) <= 5 and p.answer == word[::-1]
    assert env.reward(p, f" {p.answer}\n") == 1.0


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("so the total is 1,234 dollars", Fraction(1234)),
        ("5 * 3 = 15. 15 - 4 = 11.\n#### 11", Fraction(11)),
        ("The answer is $5.50.", Fraction(11, 2)),
        ("answer: -3 (I think 4 is wrong)", Fraction(-3)),
        ("\\boxed{3/4} but 7 appears later", Fraction(3, 4)),
        ("no number here", None),
    ],
)
def test_grade_school_answer_extraction(completion, answer):
    assert extract_answer(completion) == answer


def test_grade_school_checks_values_not_strings_and_holds_out_its_eval_set():
    assert is_correct("answer: 12.0", "12") and is_correct("#### 1,000", "1000")
    assert not is_correct("answer: 13", "12") and not is_correct("", "12")
    env = GradeSchoolMath(eval_size=40)
    held_out = {p.text for p in env.eval_prompts()}
    rng = random.Random(0)
    trained = {env.sample(rng).text for _ in range(2000)}
    assert len(held_out) == 40 and not held_out & trained
    item = env.items[0]
    assert env.reward(env.sample(random.Random(1)), "nothing") == 0.0
    assert env.reward(env._prompt(item), f"answer: {item['answer']}") == 1.0


def test_grade_school_reads_gsm8k_layout_and_reports_bad_lines(tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "1+1?", "answer": "1 + 1 = 2\\n#### 2"}\n' * 3)
    env = GradeSchoolMath(path=data, eval_size=1)
    assert env.items[0]["answer"] == "2"
    data.write_text('{"question": "1+1?"}\n')
    with pytest.raises(TriadError, match=f"{data}:1: expected JSON"):
        GradeSchoolMath(path=data)


def test_calculator_evaluates_only_integer_arithmetic():
    assert evaluate("12*(3+4)-5//2") == 82
    for bad in ("__import__('os')", "2**1000", "1/0", "9" * 20 + "*" + "9" * 20, "x"):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_calculator_responds_to_tool_calls_and_scores_the_final_answer():
    env = TextCalculator()
    p = env.sample(random.Random(0))
    assert env.respond(p, "let me calc(6*7)") == "\n= 42\n"
    assert env.respond(p, "calc(6*7)\n= 42\nthen calc(42+1)") == "\n= 43\n"  # the last turn only
    assert env.respond(p, "calc(6*7)\n= 42\nhmm") == "\n= no tool call\n"
    assert env.respond(p, f"answer: {p.answer}") is None
    assert env.reward(p, f"calc(1)\n= 1\nanswer: {p.answer}") == 1.0
    assert env.reward(p, "answer: 0") == 0.0


class AgentEpisodes:
    """Groups as `AgentRollouts.group` makes them: every sample of `k` episodes, each episode's
    samples (one per agent call) with its reward; `calls[i]` samples for episode i."""

    def __init__(self, rewards: list[float], calls: list[int]) -> None:
        self.rewards, self.calls = rewards, calls

    async def group(self, prompt, size: int, seeds=None) -> list[Sample]:
        assert size == len(self.rewards)
        return [
            Sample(reward=reward, episode=i)
            for i, (reward, calls) in enumerate(zip(self.rewards, self.calls, strict=True))
            for _ in range(calls)
        ]


def test_held_out_pass_at_k_counts_an_agent_episode_once_however_many_calls_it_made():
    """4 episodes of a planner-and-worker agent, 2 calls each (8 samples), 3 solved: pass@1 is
    3/4 (per sample it was 6 of 4, which raised); an episode that made no call is not solved."""
    from orchestrator.environments import Prompt

    prompts = [Prompt("a", "1"), Prompt("b", "2")]
    result = asyncio.run(evaluate_held_out(prompts, 4, AgentEpisodes([1.0, 1.0, 0.0, 1.0], [2, 2, 2, 2])))
    assert result["eval_pass@1"] == 0.75 and result["eval_pass@4"] == 1.0
    assert result["eval_reward_mean"] == 0.75 and result["eval_prompts"] == 2.0
    result = asyncio.run(evaluate_held_out(prompts, 4, AgentEpisodes([1.0, 0.5, 0.0, 1.0], [3, 1, 0, 0])))
    assert result["eval_pass@1"] == 0.25 and result["eval_reward_mean"] == 0.75


def test_shaping_and_pass_at_k_values():
    assert has_signal([0, 1]) and not has_signal([0.5, 0.5]) and not has_signal([])
    assert overlong_penalty(10, max_length=16, buffer=4, factor=1.0) == 0.0
    assert overlong_penalty(14, max_length=16, buffer=4, factor=1.0) == -0.5
    assert overlong_penalty(16, max_length=16, buffer=4, factor=2.0) == -2.0
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - (7 * 6) / (10 * 9))
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 90) == 0.0


def test_builtin_names_and_errors():
    assert load_environment("calculator").max_turns == 3
    assert load_environment("grade_school_math", {"eval_size": 10}).eval_size == 10
    with pytest.raises(TriadError, match="unknown environment 'chess'.*reverse"):
        load_environment("chess")
    with pytest.raises(TriadError, match="bad orchestrator.environment.args"):
        load_environment("addition", {"colour": "red"})
    with pytest.raises(TriadError, match="cannot import 'nowhere'"):
        load_environment("nowhere:Env")


def test_user_environments_load_by_entry_point_and_by_module_attribute(tmp_path, monkeypatch):
    write_env_plugin(tmp_path, "echo_env_pkg", "echo")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = load_environment("echo", {"word": "yo"})
    assert env.name == "echo" and env.word == "yo"
    prompt = env.sample(random.Random(0))
    assert asyncio.run(score(env, prompt, f" {prompt.answer}", timeout=1)) == 1.0
    assert load_environment("echo_env_pkg:Echo").word == "hi"
    sys.modules.pop("echo_env_pkg", None)


def test_eval_prompts_fall_back_to_a_fixed_seed():
    env = load_environment("addition")
    assert eval_prompts(env, 5) == eval_prompts(env, 5) and len(eval_prompts(env, 5)) == 5


def test_multi_turn_rollout_masks_environment_tokens_and_keeps_server_tokens():
    cfg = load_config(None, ['orchestrator.environment.name="calculator"', "orchestrator.group_size=3"])
    env = TextCalculator(max_turns=3)
    prompt = env.sample(random.Random(0))
    with FakeServer() as fake:
        fake.state.answer = "calc(2*3)"

        async def run():
            client = InferenceClient(fake.url, None, 5)
            client.model = "fake"
            pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
            out = await TextRollouts(env, pool, cfg.orchestrator).group(prompt, 3)
            await client.close()
            return out

        group = asyncio.run(run())
    reply = "\n= 6\n"
    turn, env_part = encode("calc(2*3)"), encode(reply)
    expected = encode(prompt.text) + turn + env_part + turn + env_part + turn
    for sample in group:
        assert sample.input_ids == expected and sample.turns == 3
        assert sample.completion == "calc(2*3)" + reply + "calc(2*3)" + reply + "calc(2*3)"
        sampled = [False] * len(encode(prompt.text)) + ([True] * len(turn) + [False] * len(env_part)) * 2
        assert sample.loss_mask == sampled + [True] * len(turn)
        assert sample.logprobs == [0.0 if not m else -0.5 for m in sample.loss_mask]
        assert sample.reward == 0.0


def test_a_tokenize_answer_that_is_cut_busy_or_a_refusal_never_ends_the_run():
    """The environment's replies are tokenized by the server: a cut body and a 429 are retried
    (after its Retry-After) like a rollout, without counting against the server; a refusal (400)
    ends each episode there, truncated after its first turn, counted under `tokenize`."""
    cfg = load_config(
        None,
        [
            'orchestrator.environment.name="calculator"',
            "orchestrator.group_size=2",
            "orchestrator.servers.retry_backoff_s=0",
        ],
    )
    env = TextCalculator(max_turns=2)
    prompt = env.sample(random.Random(0))
    with FakeServer() as fake:
        fake.state.answer = "calc(2*3)"
        fake.state.spoiled_route = "/tokenize"

        async def run():
            client = InferenceClient(fake.url, None, 5)
            client.model = "fake"
            pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
            rollouts = TextRollouts(env, pool, cfg.orchestrator)
            fake.state.busy, fake.state.cut_bodies = [(429, 0.2)], 1
            retried = await rollouts.group(prompt, 2)
            assert not fake.state.busy and fake.state.cut_bodies == 0 and pool.servers[0].failures == 0
            failed = {k: v for k, v in pool.take_requests().items() if k.startswith("requests_failed")}
            assert failed == {
                "requests_failed": 2,
                "requests_failed_http_429": 1,
                "requests_failed_bad_body": 1,
            }
            fake.state.busy = [(400, None)] * 2
            refused = await rollouts.group(prompt, 2)
            await client.close()
            return retried, refused, rollouts.failures.take()

        retried, refused, counted = asyncio.run(run())
    assert [(s.turns, s.truncated) for s in retried] == [(2, False), (2, False)]
    assert [(s.turns, s.truncated) for s in refused] == [(1, True), (1, True)]
    assert counted["episodes_truncated_tokenize"] == 2


def test_an_environment_s_own_timeout_error_is_an_error_it_raised_not_a_run_past_the_bound():
    """A reward or metrics function whose own socket timed out raises TimeoutError: that is its
    error (metrics: the group dropped, not "none kept"), not orchestrator.environment.timeout_s."""

    class Flaky:
        name = "flaky"

        def sample(self, rng):
            return None

        async def reward(self, prompt, completion):
            raise TimeoutError("the grader's socket timed out")

        def metrics(self, prompt, seen):
            raise TimeoutError("the judge's socket timed out")

    with pytest.raises(RolloutFailed) as e:
        asyncio.run(score(Flaky(), None, "x", timeout=5))
    assert str(e.value) == "environment 'flaky': reward raised TimeoutError: the grader's socket timed out"
    assert e.value.cause == "reward"
    with pytest.raises(RolloutFailed) as e:
        asyncio.run(env_metrics(Flaky(), None, "x", timeout=5))
    assert str(e.value) == "environment 'flaky': metrics raised TimeoutError: the judge's socket timed out"
    assert e.value.cause == "metrics"


def test_a_reward_that_times_out_drops_its_group_and_says_why():
    class Slow:
        name = "slow"

        def sample(self, rng):
            return None

        async def reward(self, prompt, completion):
            await asyncio.sleep(10)
            return 1.0

    with pytest.raises(RolloutFailed, match=r"^environment 'slow': reward took over 0.05 s") as e:
        asyncio.run(score(Slow(), None, "x", timeout=0.05))
    assert e.value.cause == "reward"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "9" * 1000, True, None])
def test_a_reward_that_is_no_finite_number_drops_its_group(value):
    """A string of digits used to pass as float('99...9') = inf: every advantage of its group, and
    then the trainer's loss and weights, became NaN."""

    class Odd:
        name = "odd"

        def reward(self, prompt, completion):
            return value

    with pytest.raises(RolloutFailed, match=r"^environment 'odd': reward returned .*not a (finite )?number"):
        asyncio.run(score(Odd(), None, "x", timeout=5))


class Blocking:
    """A sync reward and respond that block their thread until `release` (3 s at most), and record
    whether the event loop ran while they blocked."""

    name = "blocking"

    def __init__(self) -> None:
        self.started, self.returned, self.release = threading.Event(), threading.Event(), threading.Event()
        self.loop_ran_meanwhile = False

    def sample(self, rng):
        return None

    def _block(self) -> None:
        self.started.set()
        self.release.wait(timeout=3)
        self.returned.set()

    def reward(self, prompt, completion) -> float:
        self._block()
        return 1.0

    def respond(self, prompt, completion) -> str:
        self._block()
        return "more"

    async def watch(self) -> None:
        """On the loop: note a moment when the sync call has started and not returned."""
        while not (self.loop_ran_meanwhile or self.returned.is_set()):
            self.loop_ran_meanwhile = self.started.is_set() and not self.returned.is_set()
            await asyncio.sleep(0.001)


async def bounded(env: Blocking, call: Awaitable[object]) -> object:
    """`call`'s result (or its TimeoutError or TriadError) with `env.watch` running beside it; then
    releases `env` (once the watcher saw it blocked, so that the outcome does not hang on thread timing)."""
    watcher = asyncio.create_task(env.watch())
    try:
        return await call
    except (TimeoutError, TriadError) as e:
        return e
    finally:
        still_running = not env.returned.is_set()
        async with asyncio.timeout(5):
            await watcher
        env.release.set()
        assert still_running, "the call waited for the sync function to return"


def test_a_slow_sync_reward_is_bounded_and_the_loop_keeps_running(caplog):
    """A sync reward used to run on the event loop: nothing else ran, and the timeout could not fire."""
    env = Blocking()
    failed = asyncio.run(bounded(env, score(env, None, "x", timeout=0.1)))
    assert isinstance(failed, RolloutFailed) and failed.cause == "reward"
    assert env.loop_ran_meanwhile
    assert "environment 'blocking': reward took over 0.1 s" in str(failed)


def test_a_slow_sync_respond_is_bounded_and_the_loop_keeps_running():
    """It used to raise a bare TimeoutError that nothing above caught: the run ended."""
    env = Blocking()
    ended = asyncio.run(bounded(env, respond(env, None, "x", timeout=0.1)))
    assert isinstance(ended, EpisodeEnded) and ended.cause == "respond"
    assert (
        str(ended) == "environment 'blocking': respond took over 0.1 s (orchestrator.environment.timeout_s)"
    )
    assert env.loop_ran_meanwhile


def test_sync_and_async_metrics_are_checked_and_bounded():
    class Metrics:
        name = "m"

        def __init__(self, fn) -> None:
            self.metrics = fn

    async def slow(prompt, episode):
        await asyncio.sleep(5)

    counted = Metrics(lambda prompt, episode: {"calls": 2})
    assert asyncio.run(env_metrics(counted, None, None, timeout=1)) == {"calls": 2.0}
    assert asyncio.run(env_metrics(Metrics(slow), None, None, timeout=0.05)) == {}
    with pytest.raises(
        RolloutFailed, match=r"environment 'm': metrics\(\) must return a dict of numbers"
    ) as e:
        asyncio.run(env_metrics(Metrics(lambda p, e: {"calls": "two"}), None, None, timeout=1))
    assert e.value.cause == "metrics"
    with pytest.raises(RolloutFailed, match="^environment 'm': metrics raised KeyError: 'x'$") as e:
        asyncio.run(env_metrics(Metrics(lambda p, e: {}["x"]), None, None, timeout=1))
    assert e.value.cause == "metrics"


@pytest.mark.parametrize(
    "reward, why",
    [
        (lambda p, c: 1 / 0, "reward raised ZeroDivisionError: division by zero"),
        (lambda p, c: "high", "reward returned str, not a number"),
    ],
)
def test_a_reward_that_raises_or_is_no_number_drops_its_group(reward, why):
    """It used to raise a TriadError the loop did not catch: the run ended."""

    class Odd:
        name = "odd"

    env = Odd()
    env.reward = reward
    with pytest.raises(RolloutFailed, match=f"^environment 'odd': {why}$") as e:
        asyncio.run(score(env, None, "x", timeout=1))
    assert e.value.cause == "reward"
