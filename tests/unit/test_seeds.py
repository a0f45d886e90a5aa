"""`orchestrator.sampling.seeded`: each request's seed is a pure function of the run's seed and the
request's place, and it reaches the server in the request."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from orchestrator.environments import Prompt
from orchestrator.episodes import UNSEEDED, Seeds
from orchestrator.episodes.text import TextRollouts
from orchestrator.evaluation import evaluate
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import Server, ServerPool
from shared.config import load_config
from tests.fake_openai import FakeServer
from tests.unit.test_orchestrator import close, make

INT64_MAX = 2**63 - 1


def test_a_place_has_one_seed_and_places_differ():
    run = Seeds.of_run(0, seeded=True)
    places = [run.at("draw", d, e, t) for d in range(20) for e in range(4) for t in range(3)]
    values = [p.value for p in places]
    assert len(set(values)) == len(values)
    assert all(v >= 0 and v + 64 <= INT64_MAX for v in values)  # vLLM seeds sample i with seed + i
    assert run.at("draw", 3).at(1, 2).value == run.at("draw", 3, 1, 2).value
    assert Seeds.of_run(1, seeded=True).at("draw", 3).value != run.at("draw", 3).value
    assert run.at("eval", 0).value != run.at("draw", 0).value


def test_unseeded_is_none_at_every_place():
    assert Seeds.of_run(0, seeded=False) == UNSEEDED
    assert UNSEEDED.at("draw", 3, 1).value is None


def test_a_seed_is_the_same_in_another_process():
    """Not Python's salted hash: a resumed orchestrator asks for the same seed at the same place."""
    code = "from orchestrator.episodes import Seeds; print(Seeds.of_run(5, True).at('draw', 9, 2).value)"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == Seeds.of_run(5, seeded=True).at("draw", 9, 2).value


class TwoTurns:
    name = "two-turns"
    max_turns = 2

    def sample(self, rng):
        return Prompt(text="1+1=", answer="2")

    def respond(self, prompt, completion):
        return " and again:"

    def reward(self, prompt, completion):
        return 1.0


def rolled_out(seeds: Seeds, single_turn: bool = False) -> list[int | None]:
    """The seeds the server was asked with while a group of 3 episodes ran (2 turns each, or one
    request for the group)."""
    cfg = load_config(None, [])
    env = TwoTurns()
    if single_turn:
        env.max_turns = 1
    with FakeServer() as server:

        async def run():
            client = InferenceClient(server.url, None, 10)
            try:
                pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
                await TextRollouts(env, pool, cfg.orchestrator).group(env.sample(None), 3, seeds)
            finally:
                await client.close()

        asyncio.run(run())
        return server.state.seeds_asked


def test_each_episode_and_turn_asks_with_its_places_seed():
    seeds = Seeds.of_run(0, seeded=True).at("draw", 7)
    asked = rolled_out(seeds)
    assert sorted(asked) == sorted(seeds.at(e, t).value for e in range(3) for t in range(2))
    assert sorted(rolled_out(seeds)) == sorted(asked)


def test_a_single_turn_group_is_one_request_with_the_groups_seed():
    seeds = Seeds.of_run(0, seeded=True).at("draw", 7)
    assert rolled_out(seeds, single_turn=True) == [seeds.value]


def test_unseeded_requests_carry_no_seed():
    assert rolled_out(UNSEEDED) == [None] * 6


def test_the_loop_seeds_each_group_by_its_draw(tmp_path):
    with FakeServer() as fake:

        async def run() -> list[int]:
            orch = make(tmp_path, [fake.url], "orchestrator.sampling.seeded=true", "seed=3")
            draws = [orch.draws.draw() for _ in range(3)]
            for draw in draws:
                await orch.generate_group(draw)
            await close(orch)
            return [draw.number for draw in draws]

        numbers = asyncio.run(run())
    run_seeds = Seeds.of_run(3, seeded=True)
    assert fake.state.seeds_asked == [run_seeds.at("draw", k).value for k in numbers]


def test_every_evaluation_asks_each_held_out_prompt_with_the_same_seed():
    cfg = load_config(None, ["orchestrator.sampling.seeded=true"])
    env = TwoTurns()
    env.max_turns = 1
    seeds = Seeds.of_run(cfg.seed, seeded=True)
    with FakeServer() as server:

        async def run():
            client = InferenceClient(server.url, None, 10)
            try:
                pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
                prompts = [Prompt(text=f"{i}+1=", answer=str(i + 1)) for i in range(3)]
                for _ in range(2):
                    await evaluate(prompts, 2, TextRollouts(env, pool, cfg.orchestrator), seeds)
            finally:
                await client.close()

        asyncio.run(run())
    each = sorted(seeds.at("eval", i).value for i in range(3))
    assert sorted(server.state.seeds_asked[:3]) == each and sorted(server.state.seeds_asked[3:]) == each
