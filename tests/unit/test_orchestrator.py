"""The orchestrator's scheduling and staleness logic, against a fake inference client."""

from __future__ import annotations

import asyncio
import random

import pyarrow.parquet as pq
import pytest

from orchestrator.client import Completion
from orchestrator.loop import Group, Orchestrator
from orchestrator.tasks import Prompt, get_task
from shared.config import load_config
from shared.errors import WaitTimeout
from shared.rundir import RunDir, ensure_run, read_marker


class FakeClient:
    """Answers after `delay` seconds; records how many requests overlap."""

    def __init__(self, delay: float = 0.01) -> None:
        self.base_url, self.delay = "fake://inference", delay
        self.inflight = self.peak = self.calls = 0

    async def complete(self, prompt: str, n: int, max_tokens: int, temperature: float) -> list[Completion]:
        self.inflight += 1
        self.calls += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.inflight -= 1
        return [Completion([1, 2], [3, 4], [-0.5, -0.25], str(i), False) for i in range(n)]


def make(tmp_path, *sets: str, delay: float = 0.01) -> tuple[Orchestrator, FakeClient]:
    cfg = load_config(
        None, [f"run_dir={tmp_path}", "orchestrator.batch_size=4", "orchestrator.group_size=2", *sets]
    )
    run = ensure_run(tmp_path, {})
    client = FakeClient(delay)
    return Orchestrator(cfg, run.run_id, [client], get_task(cfg.orchestrator.task)), client


def test_producer_keeps_max_inflight_busy_and_no_more(tmp_path):
    orch, client = make(
        tmp_path,
        "orchestrator.max_inflight=6",
        "max_steps=50",
        "max_async_level=100",
        "trainer.keep_weights=200",
    )

    async def run() -> None:
        producer = asyncio.create_task(orch.produce())
        for step in range(1, 6):
            await orch.assemble(step)
        producer.cancel()

    asyncio.run(run())
    assert client.peak == 6  # the bound is reached...
    assert orch.pending <= 6  # ...and never exceeded


def test_generation_waits_for_fresh_weights(tmp_path):
    """With eta = 0 nothing for batch 2 starts until version 1 is served."""
    orch, client = make(tmp_path, "orchestrator.max_inflight=100", "max_steps=10", "max_async_level=0")

    async def run() -> None:
        producer = asyncio.create_task(orch.produce())
        await orch.assemble(1)
        await asyncio.sleep(0.1)
        assert client.calls == 4  # batch 1 only: batch 2 needs version 1
        orch.served_version = 1
        await orch.notify()
        await orch.assemble(2)
        producer.cancel()

    asyncio.run(run())


def test_a_group_that_went_stale_in_the_queue_is_dropped_and_counted(tmp_path):
    orch, _ = make(tmp_path, "max_async_level=1", "max_steps=10")
    prompt = Prompt("1+1=", "2")
    completions = [Completion([1], [2], [-0.1], "2", False)] * 2

    async def run():
        for version in (1, 2, 3, 3, 3, 3):  # batch 4 accepts versions >= 2
            orch.pending += 1
            await orch.queue.put(Group(f"g{version}", prompt, version, completions, [1.0, 0.0]))
        return await orch.assemble(4)

    batch, dropped = asyncio.run(run())
    assert [g.version for g in batch] == [2, 3, 3, 3] and dropped == 2
    assert orch.dropped_total == 2


def test_published_batch_has_advantages_versions_and_marker(tmp_path):
    orch, _ = make(tmp_path, "max_async_level=1", "max_steps=10")
    prompt = Prompt("1+1=", "2")
    group = Group("g", prompt, 3, [Completion([7, 8], [9], [-0.7], "2", False)] * 2, [1.0, 0.0])
    rows = orch.rows(4, [group])
    orch.publish(4, rows)
    table = pq.read_table(RunDir(tmp_path).batch_file(4)).to_pylist()
    assert [r["advantage"] for r in table] == pytest.approx([1.0, -1.0], abs=1e-5)  # grpo on rewards 1, 0
    assert table[0]["input_ids"] == [7, 8, 9] and table[0]["loss_mask"] == [False, False, True]
    assert table[0]["logprobs"] == pytest.approx([0.0, 0.0, -0.7])
    marker = read_marker(RunDir(tmp_path).rollout_dir(4), orch.run_id)
    assert marker.min_policy_version == 3 and marker.samples == 2 and marker.temperature == 1.0


def test_resumes_after_the_newest_batch(tmp_path):
    orch, _ = make(tmp_path)
    orch.publish(
        1,
        orch.rows(1, [Group("g", Prompt("1+1=", "2"), 0, [Completion([1], [2], [-0.1], "2", False)], [1.0])]),
    )
    again, _ = make(tmp_path)
    assert again.first_step == 2 and again.step == 2
    assert again.rng.random() != random.Random(f"{again.cfg.seed}-1").random()


def test_weights_timeout_counts_only_time_stalled_on_weights(tmp_path):
    """Generation time is not waiting for the trainer: the clock starts when nothing else is left."""
    orch, _ = make(
        tmp_path, "max_async_level=0", "max_steps=10", "orchestrator.weights_timeout_s=0.4", delay=0.6
    )

    async def run() -> float:
        producer = asyncio.create_task(orch.produce())
        await orch.assemble(1)  # its groups took 0.6 s, longer than the weights timeout
        done = asyncio.get_running_loop().time()
        with pytest.raises(ExceptionGroup) as caught:  # raised inside the producer's TaskGroup
            await producer
        (timeout,) = caught.value.subgroup(WaitTimeout).exceptions
        assert "version 1" in str(timeout) and "weights/step_000001/DONE" in str(timeout)
        return asyncio.get_running_loop().time() - done

    waited = asyncio.run(run())
    assert 0.35 < waited < 1.5
