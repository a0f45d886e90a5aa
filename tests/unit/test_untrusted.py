"""Untrusted sync code runs in worker threads off the event loop, with a cap on the stuck ones."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from orchestrator import untrusted
from orchestrator.environments import score
from orchestrator.failures import RolloutFailed
from orchestrator.tools import ToolCall, ToolRunner
from orchestrator.untrusted import TooManyStuck, Workers
from shared.waiting import async_wait_for
from tests.helpers import REPO


class Gate:
    """A sync function that blocks its thread until its event is set (5 s at most)."""

    def __init__(self) -> None:
        self.event, self.entered = threading.Event(), []

    @property
    def calls(self) -> int:
        return len(self.entered)

    def wait_here(self) -> str:
        self.entered.append(threading.get_ident())
        self.event.wait(timeout=5)
        return "opened"


async def times_out(workers: Workers, fn) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await workers.run(fn)


def test_stuck_workers_are_capped_and_counted_until_they_return():
    async def main() -> None:
        workers, gates = Workers(max_stuck=2), [Gate(), Gate(), Gate()]
        assert await workers.run(lambda: 41 + 1) == 42 and workers.stuck == 0  # a call that returns
        for gate in gates[:2]:
            await times_out(workers, gate.wait_here)
        assert workers.stuck == 2
        with pytest.raises(TooManyStuck) as refused:
            await workers.run(gates[2].wait_here)
        assert gates[2].calls == 0  # refused before it started
        assert str(refused.value) == (
            "not calling Gate.wait_here: 2 untrusted calls ran past their time limit and are still running "
            "(orchestrator.max_stuck_calls = 2); make the reward, tool or agent return in time"
        )
        gates[0].event.set()  # one stuck call returns: its worker no longer counts
        await async_wait_for(
            lambda: asyncio.sleep(0, workers.stuck == 1 or None), "a stuck worker to return", 5, poll=0.01
        )
        gates[2].event.set()
        assert await workers.run(gates[2].wait_here) == "opened" and workers.stuck == 1
        gates[1].event.set()
        await async_wait_for(
            lambda: asyncio.sleep(0, workers.stuck == 0 or None), "the last stuck worker", 5, poll=0.01
        )

    asyncio.run(main())


def test_workers_are_reused_and_a_call_never_waits_for_a_busy_one():
    async def main() -> None:
        workers, gate = Workers(max_stuck=4), Gate()
        for n in range(20):
            assert await workers.run(lambda n=n: n * 2) == n * 2
        assert workers.threads == 1
        calls = [asyncio.create_task(workers.run(gate.wait_here)) for _ in range(3)]
        await async_wait_for(
            lambda: asyncio.sleep(0, gate.calls == 3 or None), "three calls to run at once", 5, poll=0.01
        )
        gate.event.set()
        assert await asyncio.gather(*calls) == ["opened"] * 3
        assert workers.threads == 3 and len(set(gate.entered)) == 3 and workers.stuck == 0

    asyncio.run(main())


def test_errors_reach_the_caller_and_a_sync_result_that_is_awaitable_is_awaited():
    async def later() -> str:
        return "awaited"

    def raises() -> None:
        raise ValueError("bad input")

    async def main() -> None:
        with pytest.raises(ValueError, match="bad input"):
            await untrusted.call(raises)
        assert await untrusted.call(lambda: later()) == "awaited"
        assert await untrusted.call(later) == "awaited"

    asyncio.run(main())


def test_at_the_cap_a_reward_fails_in_one_line_and_a_tool_is_answered_with_it(monkeypatch):
    monkeypatch.setattr(untrusted, "WORKERS", Workers(max_stuck=1))
    gate = Gate()

    class Hung:
        name = "hung"

        def sample(self, rng):
            return None

        def reward(self, prompt, completion) -> float:
            return float(gate.wait_here() == "opened")

    def calc(expression: str) -> str:
        """A tool."""
        return expression

    async def main() -> None:
        assert await score(Hung(), None, "x", timeout=0.05) == 0.0  # timed out: now stuck
        with pytest.raises(  # its group is dropped, counted under `reward`
            RolloutFailed, match=r"not calling .*reward: 1 untrusted calls .*max_stuck_calls = 1"
        ) as e:
            await score(Hung(), None, "x", timeout=0.05)
        assert e.value.cause == "reward"
        message = await ToolRunner([calc], timeout=1).run(ToolCall("call_0", "calc", {"expression": "1"}))
        assert message["content"].startswith("error: calc raised TooManyStuck: not calling ")
        gate.event.set()

    asyncio.run(main())
    assert gate.calls == 1


def test_a_stuck_worker_does_not_keep_the_process_from_exiting():
    code = (
        "import asyncio, time\n"
        "from orchestrator.untrusted import call\n"
        "async def main():\n"
        "    try:\n"
        "        async with asyncio.timeout(0.05):\n"
        "            await call(time.sleep, 60)\n"
        "    except TimeoutError:\n"
        "        print('gave up')\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "gave up\n", done.stderr
