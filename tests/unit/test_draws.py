"""Prompts by epoch: each dataset prompt once per epoch in a seeded shuffle, and a run killed at
any moment and restarted trains on exactly the prompts of the same run unbroken (issue 47, item 7).

The kill test runs the orchestrator's own producer and assembler in a process of its own against
a fake OpenAI server and kills it with SIGKILL: the resume is the orchestrator's code path
(`Orchestrator.__init__` reads the newest batch's marker), and a kill can land anywhere, between a
batch's rows and its marker included. No trainer is needed: with the `none` backend and
`max_async_level` above `max_steps` no group waits for weights or goes stale, so every group drawn
is trained on, which is what lets the two runs be compared draw for draw."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.draws import Draws, Position
from orchestrator.prompt import Prompt
from shared.errors import TriadError
from shared.rundir import RunDir
from tests.fake_openai import FakeServer
from tests.helpers import REPO

SIZE, STEPS, BATCH = 7, 8, 3  # 24 draws: three epochs of 7, and three draws of the fourth


class Numbers:
    """A dataset of SIZE prompts."""

    name = "numbers"

    def sample(self, rng: random.Random) -> Prompt:
        return self.dataset()[rng.randrange(SIZE)]

    def dataset(self) -> list[Prompt]:
        return [Prompt(text=f"{i}+0=", answer=str(i)) for i in range(SIZE)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return float(completion.strip() == prompt.answer)


class Dice:
    """A procedural environment."""

    name = "dice"

    def sample(self, rng: random.Random) -> Prompt:
        return Prompt(text=str(rng.randrange(10**9)), answer="")

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 0.0


def test_each_dataset_prompt_comes_once_per_epoch_in_a_seeded_shuffle():
    draws = Draws(Numbers(), 3, Position())
    drawn = [draws.draw() for _ in range(3 * SIZE)]
    for epoch in range(3):
        of_epoch = drawn[epoch * SIZE : (epoch + 1) * SIZE]
        assert {d.epoch for d in of_epoch} == {epoch} and sorted(d.index for d in of_epoch) == list(
            range(SIZE)
        )
        assert [d.prompt.text for d in of_epoch] == [f"{d.index}+0=" for d in of_epoch]
    orders = [[d.index for d in drawn[e * SIZE : (e + 1) * SIZE]] for e in range(3)]
    assert len({tuple(o) for o in orders}) == 3  # each epoch its own shuffle
    again = Draws(Numbers(), 3, Position())
    assert [again.draw().index for _ in range(SIZE)] == orders[0]  # the same seed, the same order
    assert [d.index for d in (Draws(Numbers(), 4, Position()).draw() for _ in range(SIZE))] != orders[0]


def test_the_position_counts_open_draws_and_a_resume_draws_them_again_first():
    draws = Draws(Numbers(), 0, Position())
    taken = [draws.draw() for _ in range(5)]
    for d in (taken[0], taken[2], taken[3]):
        draws.consumed(d.number)
    position = draws.position()
    assert position.to_json() == {"next": 5, "open": [1, 4]} and draws.epochs_done() == round(1 / SIZE, 4)
    resumed = Draws(Numbers(), 0, Position.from_json(position.to_json(), "batch 3"))
    assert [resumed.draw().number for _ in range(3)] == [1, 4, 5]
    assert resumed.at(4) == taken[4]  # a pure function of (seed, draw)
    with pytest.raises(TriadError, match=r"batch 3: 'draws' must be \{'next': int"):
        Position.from_json({"next": 2, "open": [2]}, "batch 3")


def test_a_procedural_environment_keeps_drawing_a_sequence_that_resumes():
    draws = Draws(Dice(), 0, Position())
    texts = [draws.draw().prompt.text for _ in range(6)]
    assert len(set(texts)) == 6 and draws.epochs_done() is None and draws.size is None
    resumed = Draws(Dice(), 0, Position(next=4, open=[2]))
    assert [resumed.draw().prompt.text for _ in range(3)] == [texts[2], texts[4], texts[5]]


RUN = """
import asyncio, sys
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.loop import Orchestrator
from orchestrator.servers.pool import Server, ServerPool
from shared.config import load_config
from shared.rundir import RunDir
from tests.unit.test_draws import Numbers

run_dir, url, inflight, steps, batch = sys.argv[1:]
cfg = load_config(None, [
    f"run_dir={run_dir}", "seed=5", f"max_steps={steps}", "max_async_level=20", "weights.keep=22",
    f"orchestrator.batch_size={batch}", "orchestrator.group_size=2", f"orchestrator.max_inflight={inflight}",
])
run = RunDir.of(cfg).ensure_run(cfg.public_dict())
server = Server(InferenceClient(url, None, 10), Frozen())
server.client.model = "fake"
orch = Orchestrator(cfg, run.run_id, ServerPool([server], cfg.orchestrator), Numbers())

async def main():
    async with asyncio.TaskGroup() as tg:
        producer = tg.create_task(orch.produce())
        async with asyncio.TaskGroup() as evals:
            await orch.run_steps(evals)
        producer.cancel()
    await server.client.close()

asyncio.run(main())
"""


def start(run_dir: Path, url: str, inflight: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", RUN, str(run_dir), url, str(inflight), str(STEPS), str(BATCH)]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen) -> None:
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out.decode()[-3000:]


def trained_draws(run_dir: Path) -> list[int]:
    rundir = RunDir(run_dir)
    run_id = rundir.read_run().run_id
    markers = [rundir.rollouts.marker(step, run_id) for step in range(1, STEPS + 1)]
    return [number for marker in markers for number in marker.prompt_draws]


def newest(run_dir: Path) -> int:
    try:
        return RunDir(run_dir).rollouts.newest(RunDir(run_dir).read_run().run_id)
    except Exception:  # the run directory is being made
        return 0


@pytest.mark.parametrize("inflight", [1, 4])
def test_a_run_killed_three_times_trains_on_the_prompts_of_the_run_unbroken(tmp_path, inflight):
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    with FakeServer() as fake:
        fake.state.delay = 0.1  # a step takes 0.1-0.3 s: a kill lands inside the run
        finish(start(tmp_path / "unbroken", fake.url, inflight))
        killed_at = []
        for target in sorted(rng.sample(range(1, STEPS - 2), 3)):
            process = start(tmp_path / "killed", fake.url, inflight)
            deadline = time.monotonic() + 60
            while newest(tmp_path / "killed") < target and process.poll() is None:
                assert time.monotonic() < deadline, f"batch {target} not published in 60 s"
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.1))  # anywhere in the next batch: generating, writing, marking
            process.send_signal(signal.SIGKILL)
            process.wait()
            killed_at.append(newest(tmp_path / "killed"))
        finish(start(tmp_path / "killed", fake.url, inflight))
    unbroken, killed = trained_draws(tmp_path / "unbroken"), trained_draws(tmp_path / "killed")
    why = f"random seed {seed}, killed after batches {killed_at}"
    assert all(k < STEPS for k in killed_at), why
    assert sorted(unbroken) == list(range(STEPS * BATCH)), why  # every draw once
    assert sorted(killed) == sorted(unbroken), why  # none skipped, none repeated across the kills
    if inflight == 1:  # groups finish in the order drawn: the very sequence
        assert killed == unbroken, why
    draws = Draws(Numbers(), 5, Position())
    indices = [draws.at(n).index for n in sorted(killed)]
    for epoch in range(STEPS * BATCH // SIZE):
        assert sorted(indices[epoch * SIZE : (epoch + 1) * SIZE]) == list(range(SIZE)), why
    last = RunDir(tmp_path / "killed").metrics.rows("orchestrator")[-1]
    assert last["step"] == STEPS and last["epoch"] == round(STEPS * BATCH / SIZE, 4)
