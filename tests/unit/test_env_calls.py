"""Sync environment code runs in a bounded pool of threads off the event loop; stuck ones are capped."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading

import pytest

from orchestrator import env_calls
from orchestrator.env_calls import EnvThreads
from orchestrator.environments import score
from orchestrator.episodes.tools import ToolCall, ToolRunner
from orchestrator.failures import RolloutFailed
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


async def times_out(workers: EnvThreads, fn) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await workers.run(fn)


def test_at_the_cap_a_call_waits_for_a_stuck_one_to_return_within_its_own_time_limit():
    async def main() -> None:
        workers, gates = EnvThreads(size=8, max_stuck=2), [Gate(), Gate(), Gate()]
        assert await workers.run(lambda: 41 + 1) == 42 and workers.stuck == 0  # a call that returns
        for gate in gates[:2]:
            await times_out(workers, gate.wait_here)
        assert workers.stuck == 2
        await times_out(workers, gates[2].wait_here)  # its limit passed while it waited at the cap
        assert gates[2].calls == 0 and workers.threads == 2  # it never ran, and took no thread
        assert env_calls.not_started() == (
            "did not start Gate.wait_here: 2 environment calls ran past their time limit and none "
            "returned within this one's (orchestrator.environment.max_stuck_calls = 2); make the reward, "
            "tool or agent return in time"
        )
        assert env_calls.not_started() is None  # read once
        waiting = asyncio.create_task(workers.run(gates[2].wait_here))
        await async_wait_for(lambda: asyncio.sleep(0, workers.waiting == 1 or None), "a call at the cap", 5)
        taken = workers.take()  # the first call that waited, and the second, which waits now
        assert (taken["queued"], taken["waited"], taken["not_started"]) == (1, 2, 1) and gates[2].calls == 0
        gates[0].event.set()  # one stuck call returns: the waiting call starts in its thread
        gates[2].event.set()
        assert await asyncio.wait_for(waiting, 5) == "opened" and gates[2].calls == 1
        assert workers.stuck == 1 and workers.waiting == 0 and env_calls.not_started() is None
        assert workers.take() == {"queued": 0, "stuck": 1, "overran": 0, "waited": 0, "not_started": 0}
        gates[1].event.set()
        await async_wait_for(
            lambda: asyncio.sleep(0, workers.stuck == 0 or None), "the last stuck worker", 5, poll=0.01
        )

    asyncio.run(main())


def test_threads_are_reused_and_bounded_however_many_call_at_once():
    async def main() -> None:
        workers, gate = EnvThreads(size=4, max_stuck=4), Gate()
        for n in range(20):
            assert await workers.run(lambda n=n: n * 2) == n * 2
        assert workers.threads == 1
        calls = [asyncio.create_task(workers.run(gate.wait_here)) for _ in range(200)]
        await async_wait_for(
            lambda: asyncio.sleep(0, gate.calls == 4 or None), "four calls to run at once", 5, poll=0.01
        )
        await asyncio.sleep(0.1)
        assert gate.calls == 4 and workers.threads == 4 and workers.take()["queued"] == 196
        gate.event.set()
        assert await asyncio.gather(*calls) == ["opened"] * 200
        assert workers.threads == 4 and len(set(gate.entered)) == 4 and workers.stuck == 0
        assert workers.take() == {"queued": 0, "stuck": 0, "overran": 0, "waited": 0, "not_started": 0}

    asyncio.run(main())


def test_a_time_limit_counts_from_the_call_not_from_when_it_got_a_thread():
    async def main() -> None:
        workers, held, queued = EnvThreads(size=1, max_stuck=1), Gate(), Gate()
        holder = asyncio.create_task(workers.run(held.wait_here))
        await async_wait_for(lambda: asyncio.sleep(0, held.calls or None), "the thread to be held", 5, 0.01)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await workers.run(queued.wait_here)
        assert 0.3 <= loop.time() - started < 2  # fired on time, though no thread ever took the call
        held.event.set()
        assert await holder == "opened"
        assert await workers.run(lambda: "next") == "next"
        assert queued.calls == 0  # a call given up before a thread took it never runs
        assert workers.take() == {"queued": 0, "stuck": 0, "overran": 0, "waited": 0, "not_started": 0}

    asyncio.run(main())


def test_a_call_that_hangs_holds_its_thread_counted_until_it_returns():
    async def main() -> None:
        workers, gate = EnvThreads(size=2, max_stuck=2), Gate()
        await times_out(workers, gate.wait_here)
        assert workers.take() == {"queued": 0, "stuck": 1, "overran": 1, "waited": 0, "not_started": 0}
        assert await workers.run(lambda: "the other thread") == "the other thread"
        assert workers.threads == 2 and workers.take() == {
            "queued": 0,
            "stuck": 1,
            "overran": 0,
            "waited": 0,
            "not_started": 0,
        }
        gate.event.set()
        await async_wait_for(
            lambda: asyncio.sleep(0, workers.stuck == 0 or None), "the hung call to return", 5, poll=0.01
        )
        assert workers.take() == {"queued": 0, "stuck": 0, "overran": 0, "waited": 0, "not_started": 0}

    asyncio.run(main())


def test_more_stuck_calls_than_threads_is_refused_at_start():
    from shared.config import load_config

    with pytest.raises(
        Exception, match=r"environment.max_stuck_calls \(9\) must be at most .*environment.threads \(8\)"
    ):
        load_config(
            None, ["orchestrator.environment.threads=8", "orchestrator.environment.max_stuck_calls=9"]
        )


def test_errors_reach_the_caller_and_a_sync_result_that_is_awaitable_is_awaited():
    async def later() -> str:
        return "awaited"

    def raises() -> None:
        raise ValueError("bad input")

    async def main() -> None:
        with pytest.raises(ValueError, match="bad input"):
            await env_calls.call(raises)
        assert await env_calls.call(lambda: later()) == "awaited"
        assert await env_calls.call(later) == "awaited"

    asyncio.run(main())


def test_at_the_cap_a_reward_that_never_starts_fails_in_one_line_and_a_tool_is_answered_with_it(monkeypatch):
    monkeypatch.setattr(env_calls, "THREADS", EnvThreads(size=4, max_stuck=1))
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
        with pytest.raises(RolloutFailed, match="took over"):  # timed out (its group dropped): now stuck
            await score(Hung(), None, "x", timeout=0.05)
        with pytest.raises(  # waited its limit at the cap: its group is dropped, counted under `reward`
            RolloutFailed, match=r"reward: did not start .*reward: 1 environment calls .*max_stuck_calls = 1"
        ) as e:
            await score(Hung(), None, "x", timeout=0.05)
        assert e.value.cause == "reward"
        message = await ToolRunner([calc], timeout=0.2).run(ToolCall("call_0", "calc", {"expression": "1"}))
        assert re.match(r"error: calc: did not start \S*calc: 1 environment calls ", message["content"])
        gate.event.set()

    asyncio.run(main())
    assert gate.calls == 1


def test_a_stuck_worker_does_not_keep_the_process_from_exiting():
    code = (
        "import asyncio, time\n"
        "from orchestrator.env_calls import call\n"
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


def test_an_episode_runs_on_a_loop_of_its_own_and_is_cancelled_when_its_caller_gives_up():
    seen: list[str] = []

    async def agent(name: str) -> None:
        seen.append(f"{name} on {threading.current_thread().name}")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        workers = EnvThreads(size=2, max_stuck=2, name="agent")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await workers.run(env_calls.ThreadLoop(agent, "episode"))
        await async_wait_for(
            lambda: asyncio.sleep(0, workers.stuck == 0 or None), "the episode's thread to be free", 5, 0.01
        )
        assert workers.take() == {"queued": 0, "stuck": 0, "overran": 1, "waited": 0, "not_started": 0}

    asyncio.run(main())
    assert seen == ["episode on triad-agent-1", "cancelled"]
