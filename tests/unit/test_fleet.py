"""The fleet registry (records, heartbeats, liveness) and the orchestrator's discovery of joined servers.

Discovery runs against fake OpenAI-compatible servers over real HTTP, on a local run directory."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pyarrow.parquet as pq
import pytest

from orchestrator.batches.builder import BatchBuilder, Group
from orchestrator.environments import Prompt
from orchestrator.episodes.sample import Sample
from orchestrator.episodes.text import TextRollouts
from orchestrator.fleet import Fleet
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import Server
from services.cli import parser
from services.report import status_lines
from shared.batch import publish_batch
from shared.config import load_config
from shared.errors import TriadError
from shared.fleet import FleetRecord, FleetView, Registration, default_url, parse_records
from shared.rundir import RunDir
from tests.fake_openai import FakeServer
from tests.unit.test_orchestrator import FakeBackend, close, make, stop

TIMEOUT = 10.0


def record(
    server_id: str, url: str, beat: int, written_at: float = 1000.0, started_at: float = 0.0
) -> FleetRecord:
    return FleetRecord(server_id=server_id, url=url, beat=beat, written_at=written_at, started_at=started_at)


def test_a_registration_renews_its_record_and_removes_it_on_leaving(tmp_path):
    rundir = RunDir(tmp_path)
    me = Registration(rundir, "http://10.0.0.5:8000")
    me.beat()
    me.beat()
    (found,) = parse_records(rundir.fleet.read_all(), "here")
    assert (found.url, found.beat, found.server_id) == ("http://10.0.0.5:8000", 2, me.record.server_id)
    other = Registration(rundir, "http://10.0.0.6:8000")
    other.beat()
    assert sorted(rundir.fleet.read_all()) == sorted([me.record.server_id, other.record.server_id])
    me.leave()
    assert list(rundir.fleet.read_all()) == [other.record.server_id]


def test_keep_alive_survives_a_failing_store_and_says_so(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    me = Registration(RunDir(blocker), "http://a:1")  # the run directory is a file: every write fails

    async def beat_a_while():
        task = asyncio.create_task(me.keep_alive(0.01))
        deadline = time.monotonic() + 10  # a loaded machine may take longer than 4 beats' 0.04 s
        while me.record.beat <= 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await stop(task)

    with caplog.at_level(logging.WARNING):
        asyncio.run(beat_a_while())
    warnings = [r.getMessage() for r in caplog.records if "cannot renew the fleet record" in r.getMessage()]
    assert me.record.beat > 3 and len(warnings) == 1, warnings


def test_keep_alive_survives_a_store_that_gives_up_and_leave_does_not_raise(tmp_path, caplog):
    """An object store raises TriadError (its retries spent), not OSError."""
    me = Registration(RunDir(tmp_path), "http://a:1")

    def unreachable(*_args):
        raise TriadError("gave up after 300 s waiting for object store s3://b/run (writing fleet/x)")

    me.rundir.fleet.write = me.rundir.fleet.remove = unreachable

    async def beat_a_while():
        task = asyncio.create_task(me.keep_alive(0.01))
        await asyncio.sleep(0.1)
        assert not task.done()
        await stop(task)

    with caplog.at_level(logging.WARNING):
        asyncio.run(beat_a_while())
        me.leave()
    assert "cannot renew the fleet record" in caplog.text and "s3://b/run" in caplog.text
    assert "cannot remove the fleet record" in caplog.text


def test_a_malformed_record_is_reported_and_left_out(tmp_path, caplog):
    rundir = RunDir(tmp_path)
    Registration(rundir, "http://a:1").beat()
    rundir.fleet.write("junk", b'{"url": 3}')
    with caplog.at_level(logging.WARNING):
        records = parse_records(rundir.fleet.read_all(), rundir.fleet.describe())
    assert [r.url for r in records] == ["http://a:1"]
    assert "ignoring the fleet record junk" in caplog.text


def test_a_server_is_alive_while_its_beat_changes_within_the_timeout():
    view = FleetView(TIMEOUT)
    assert list(view.update([record("s1", "http://a:1", 1)], now=0, wall_now=1001)) == ["http://a:1"]
    assert list(view.update([record("s1", "http://a:1", 1)], now=TIMEOUT, wall_now=9999)) == ["http://a:1"]
    assert view.update([record("s1", "http://a:1", 1)], now=TIMEOUT + 0.1, wall_now=9999) == {}
    assert list(view.update([record("s1", "http://a:1", 2)], now=30, wall_now=9999)) == ["http://a:1"]
    assert view.update([], now=31, wall_now=9999) == {} and view.changed == {}  # deregistered


def test_a_leftover_record_seen_first_is_judged_by_its_time(caplog):
    view = FleetView(TIMEOUT)
    with caplog.at_level(logging.INFO):
        for now in (0, 1):
            leftover = record("old", "http://a:1", 7, written_at=1000)
            assert view.update([leftover], now=now, wall_now=1000 + TIMEOUT + 1) == {}
    assert caplog.text.count("ignoring the fleet record of http://a:1: written 11 s ago") == 1
    behind = record("old", "http://a:1", 8, written_at=1000)  # it beats on: its clock is behind
    assert view.update([behind], now=2, wall_now=1000 + TIMEOUT + 3) == {"http://a:1": behind}
    fresh = record("new", "http://b:1", 1, written_at=1010)
    assert view.update([fresh], now=3, wall_now=1011) == {"http://b:1": fresh}


def test_of_two_records_for_one_url_the_newest_server_wins():
    view = FleetView(TIMEOUT)
    old, new = record("s1", "http://a:1", 5, started_at=1), record("s2", "http://a:1", 1, started_at=2)
    assert view.update([new, old], now=0, wall_now=1000) == {"http://a:1": new}
    assert view.update([old, new], now=1, wall_now=1000) == {"http://a:1": new}


def test_default_url_names_this_host_for_a_wildcard_address():
    assert default_url("10.1.2.3", 8000) == "http://10.1.2.3:8000"
    assert default_url("0.0.0.0", 8001) == f"http://{socket.gethostname()}:8001"
    assert default_url("::1", 8002) == "http://[::1]:8002"


def test_fleet_config_is_checked():
    with pytest.raises(TriadError, match=r"heartbeat_timeout_s \(2\) must be more than twice"):
        load_config(None, ["orchestrator.servers.heartbeat_timeout_s=2", "inference.heartbeat_interval_s=1"])
    with pytest.raises(TriadError, match="inference.advertise_url: 'gpu-3:8000' is not an http"):
        load_config(None, ["inference.advertise_url=gpu-3:8000"])
    assert load_config(None, ["orchestrator.servers.fleet_poll_s=0"]).orchestrator.servers.fleet_poll_s == 0


def test_only_inference_takes_join():
    assert parser().parse_args(["inference", "--join"]).join
    assert not parser().parse_args(["inference"]).join
    with pytest.raises(SystemExit):
        parser().parse_args(["orchestrator", "--join"])


def test_batches_name_the_servers_of_each_sample(tmp_path):
    oc = load_config(None, []).orchestrator
    one, two = Sample(reward=1.0, servers=["http://a:1"]), Sample(reward=0.0)
    two.served_by("http://a:1")
    two.served_by("http://b:2")
    two.served_by("http://a:1")
    for s in (one, two):
        s.add([1, 2], sampled=False)
        s.add([3], sampled=True, logprobs=[-0.1])
    rows = BatchBuilder(oc, "addition", 1).rows(1, [Group("g", Prompt("1+1=", "2"), [one, two])])
    publish_batch(RunDir(tmp_path), "run", 1, rows, 1.0)
    servers = pq.read_table(RunDir(tmp_path).batch_file(1), columns=["server"]).column(0).to_pylist()
    assert servers == ["http://a:1", "http://a:1 http://b:2"]


def test_status_lists_the_joined_servers(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.ensure_run({})
    me = Registration(rundir, "http://gpu-7:8000")
    me.beat()
    lines = status_lines(rundir, now=me.record.written_at + 4)
    assert lines[-1] == "  joined       http://gpu-7:8000  beat 1  (4 s ago)"


class FakeFleet(Fleet):
    """Reaches a joiner without asking it for its weight backend (fake servers have none)."""

    backend = FakeBackend

    async def reach(self, client: InferenceClient, run_id: str) -> Server:
        await client.wait_ready(5, None)
        return Server(client, self.backend())


def fleet_of(tmp_path, fixed_url: str) -> tuple[FakeFleet, RunDir, str]:
    orch = make(
        tmp_path,
        [fixed_url],
        "inference.heartbeat_interval_s=0.05",
        "orchestrator.servers.heartbeat_timeout_s=0.5",
        "orchestrator.servers.fleet_poll_s=0.02",
    )
    for version in (1, 2):
        orch.rundir.weights.write_marker(version, orch.run_id)
    orch.weights.trainer_version = 2
    fleet = FakeFleet(orch.cfg, orch.rundir, orch.pool)
    fleet.follow(orch.weights)
    return fleet, orch.rundir, orch.run_id


async def until(check, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def test_a_joiner_is_admitted_at_the_current_version_and_removed_when_its_heartbeat_stops(tmp_path, caplog):
    with FakeServer() as fixed, FakeServer() as joiner:
        fleet, rundir, _ = fleet_of(tmp_path, fixed.url)

        async def scenario():
            watcher = asyncio.create_task(fleet.watch())
            me = Registration(rundir, joiner.url)
            beating = asyncio.create_task(me.keep_alive(0.05))
            await until(lambda: joiner.url in fleet.joined)
            server = fleet.joined[joiner.url]
            assert fleet.pool.has(server) and server.healthy and server.version == 2
            assert server.backend.loads == [2]  # aligned with the newest published version first
            await stop(beating)  # as if killed: the record stays, unchanged
            await until(lambda: not fleet.pool.has(server))
            assert len(fleet.pool.servers) == 1 and fleet.pool.servers[0].url == fixed.url
            assert rundir.fleet.read_all()  # the dead server's record is still there
            await stop(watcher)
            await fleet.close()

        with caplog.at_level(logging.INFO):
            asyncio.run(scenario())
    assert f"removing inference server {joiner.url} from the pool: its heartbeat" in caplog.text


def test_a_version_published_while_a_joiner_loads_is_loaded_before_it_joins(tmp_path):
    with FakeServer() as fixed, FakeServer() as joiner:
        fleet, rundir, run_id = fleet_of(tmp_path, fixed.url)

        class PublishedMeanwhile(FakeBackend):
            async def load(self, version: int, path: str) -> None:
                await super().load(version, path)
                if version == 2:  # the trainer publishes 3 while this server loads 2
                    rundir.weights.write_marker(3, run_id)

        fleet.backend = PublishedMeanwhile

        async def scenario():
            Registration(rundir, joiner.url).beat()
            await fleet.poll()
            await until(lambda: joiner.url in fleet.joined)
            server = fleet.joined[joiner.url]
            assert server.backend.loads == [2, 3] and server.version == 3
            await fleet.close()

        asyncio.run(scenario())


def test_a_joiner_that_leaves_is_removed_and_one_at_a_fixed_url_is_left_alone(tmp_path, caplog):
    with FakeServer() as fixed, FakeServer() as joiner:
        fleet, rundir, _ = fleet_of(tmp_path, fixed.url)

        async def scenario():
            Registration(rundir, fixed.url).beat()
            me = Registration(rundir, joiner.url)
            me.beat()
            await fleet.poll()
            await until(lambda: joiner.url in fleet.joined)
            assert [s.url for s in fleet.pool.servers] == [fixed.url, joiner.url]
            me.leave()  # a clean shutdown
            await fleet.poll()
            assert [s.url for s in fleet.pool.servers] == [fixed.url] and not fleet.joined
            await fleet.close()

        with caplog.at_level(logging.WARNING):
            asyncio.run(scenario())
    assert f"removing inference server {joiner.url} from the pool: it left the fleet" in caplog.text


def test_a_joiner_that_cannot_follow_the_weights_is_not_admitted(tmp_path, caplog):
    with FakeServer() as fixed, FakeServer() as joiner:
        fleet, rundir, _ = fleet_of(tmp_path, fixed.url)
        fleet.backend = Frozen

        async def scenario():
            Registration(rundir, joiner.url).beat()
            await fleet.poll()
            await until(lambda: not fleet.admitting)
            assert not fleet.joined and len(fleet.pool.servers) == 1
            await fleet.poll()
            assert not fleet.admitting  # the same server is not tried again
            fleet.backend = FakeBackend
            Registration(rundir, joiner.url).beat()  # restarted: a new server id
            await fleet.poll()
            await until(lambda: joiner.url in fleet.joined)
            await fleet.close()

        with caplog.at_level(logging.WARNING):
            asyncio.run(scenario())
    refusals = [r for r in caplog.records if r.getMessage().startswith("not admitting")]
    assert len(refusals) == 1
    assert f"{joiner.url} (until it restarts): it loads weights with 'none'" in refusals[0].getMessage()


class TwoTurns:
    """Answers the first turn, then ends the episode; `between` runs between the turns."""

    name, max_turns = "two-turns", 2

    def __init__(self, between) -> None:
        self.between = between

    def respond(self, prompt, completion) -> str | None:
        self.between()
        return "ok"

    def reward(self, prompt, completion) -> float:
        return 0.0


def test_a_multi_turn_sample_names_each_server_it_went_to(tmp_path):
    with FakeServer() as first, FakeServer() as second:
        orch = make(tmp_path, [first.url, second.url])

        def fail_first() -> None:
            first.state.mode = "fail"

        async def scenario():
            try:
                rollouts = TextRollouts(TwoTurns(fail_first), orch.pool, orch.oc)
                return await rollouts.episode(Prompt("1+1=", "2"))
            finally:
                await close(orch)

        sample = asyncio.run(scenario())
    assert sample.turns == 2 and sample.servers == [first.url, second.url]


def test_an_ending_admission_leaves_a_newer_admission_of_the_same_url_in_place(tmp_path):
    """The server left and came back while its first admission was ending: that admission's
    cleanup must not drop the newer one's entry, or the next poll admits the URL twice."""
    with FakeServer() as fixed:
        fleet, _, _ = fleet_of(tmp_path, fixed.url)
        fleet.weights = None  # this admission fails at once

        async def scenario():
            newer = asyncio.create_task(asyncio.sleep(10))
            fleet.admitting["http://joiner:8000"] = newer
            await fleet.admit("http://joiner:8000", "first-server-id")
            assert fleet.admitting == {"http://joiner:8000": newer}
            newer.cancel()

        asyncio.run(scenario())


def test_a_joiner_slower_than_the_trainer_is_refused_after_a_bounded_bring_up(tmp_path, caplog):
    from orchestrator.fleet import BRING_UP_LOADS

    with FakeServer() as fixed, FakeServer() as joiner:
        fleet, rundir, run_id = fleet_of(tmp_path, fixed.url)

        class AlwaysBehind(FakeBackend):
            async def load(self, version: int, path: str) -> None:
                await super().load(version, path)
                rundir.weights.write_marker(version + 1, run_id)  # the trainer published again

        fleet.backend = AlwaysBehind

        async def scenario():
            Registration(rundir, joiner.url).beat()
            await fleet.poll()
            await until(lambda: not fleet.admitting)
            assert not fleet.joined and len(fleet.pool.servers) == 1
            await fleet.close()

        with caplog.at_level(logging.WARNING):
            asyncio.run(scenario())
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not admitting")]
    assert len(refusals) == 1, refusals
    assert f"still behind the trainer after loading {BRING_UP_LOADS} versions while joining" in refusals[0]
    assert f"(serves {2 + BRING_UP_LOADS}, the trainer has published {3 + BRING_UP_LOADS})" in refusals[0]


def test_a_joiner_that_leaves_during_a_weight_load_is_closed_after_it_and_never_loaded_again(tmp_path):
    """A clean shutdown of a joined server while the follower loads a version into it: its client
    closed under the load made the load's next request raise httpx's RuntimeError, which no
    handler takes, and the follower's task (the run) ended. The client now closes after the load,
    and a load that comes later skips the server."""
    with FakeServer() as fixed, FakeServer() as joiner:
        fleet, rundir, run_id = fleet_of(tmp_path, fixed.url)
        gate = asyncio.Event()

        class AsksAfterAWait(FakeBackend):
            """As the admin backend: store reads in a thread between its requests."""

            client: InferenceClient

            async def load(self, version: int, path: str):
                if version == 3:
                    await gate.wait()
                    await self.client.http.get("/health")
                return await super().load(version, path)

        fleet.backend = AsksAfterAWait

        async def scenario():
            Registration(rundir, joiner.url).beat()
            await fleet.poll()
            await until(lambda: joiner.url in fleet.joined)
            server = fleet.joined[joiner.url]
            server.backend.client = server.client
            for version in (3, 4):
                rundir.weights.write_marker(version, run_id)
            loading = asyncio.create_task(fleet.weights.load(server, 3))
            await asyncio.sleep(0.05)
            leaving = asyncio.create_task(fleet.leave(joiner.url, "it left the fleet"))
            await asyncio.sleep(0.05)
            assert not leaving.done() and not server.client.closed  # waits for the load
            gate.set()
            await loading
            await leaving
            assert server.client.closed and server.version == 3
            await fleet.weights.load(server, 4)  # a load that picked it before it left: skipped
            assert server.backend.loads == [2, 3] and not fleet.pool.has(server)
            await fleet.close()

        asyncio.run(scenario())
