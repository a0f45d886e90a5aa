"""Servers that join a running run: discover them, bring them up to date, drop the dead.

Every `orchestrator.servers.fleet_poll_s` the orchestrator reads the run directory's fleet
registry (`shared/fleet.py`). A live record whose URL is not in the pool yet is
admitted in a task of its own: wait until it answers, check it loads weights as the
others do, bring it to the current version (`WeightFollower.align`, then `load` until
it serves the trainer's newest), and only then add it to the pool, where it takes
requests and is health-checked like a fixed server. A joined server whose record
stops changing for `orchestrator.servers.heartbeat_timeout_s`, or disappears (a clean
shutdown), is removed from the pool with a log line naming it. Fixed servers
(`orchestrator.servers.urls`) are never touched here.
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.servers.backends.detection import backend_for
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import Server, ServerPool
from orchestrator.weights.follower import WeightFollower
from shared.config import TriadConfig
from shared.errors import TriadError
from shared.fleet import FleetView, parse_records
from shared.rundir import RunDir

log = logging.getLogger("triad.orchestrator")
BRING_UP_LOADS = 8  # versions a joiner may load while catching up before it is refused


class Fleet:
    def __init__(self, cfg: TriadConfig, rundir: RunDir, pool: ServerPool) -> None:
        self.cfg, self.oc, self.rundir, self.pool = cfg, cfg.orchestrator, rundir, pool
        self.view = FleetView(self.oc.servers.heartbeat_timeout_s)
        self.fixed = {s.url for s in pool.servers}
        self.joined: dict[str, Server] = {}
        self.admitting: dict[str, asyncio.Task[None]] = {}
        self.refused: set[str] = set()  # server ids not admitted: tried again only after a restart
        self.weights: WeightFollower | None = None
        self.unreadable = False

    def follow(self, weights: WeightFollower) -> None:
        """Bring joiners to the versions this follower tracks (a new one after a trainer rewind)."""
        self.weights = weights

    async def watch(self) -> None:
        """Forever: poll the registry; admit new servers, remove those whose heartbeat stopped."""
        try:
            while True:
                await self.poll()
                await asyncio.sleep(self.oc.servers.fleet_poll_s)
        finally:
            for task in self.admitting.values():
                task.cancel()

    async def poll(self) -> None:
        try:
            raw = await asyncio.to_thread(self.rundir.fleet.read_all)
        except (OSError, TriadError) as e:
            if not self.unreadable:
                log.warning("cannot read the fleet registry %s: %s", self.rundir.fleet.describe(), e)
            self.unreadable = True
            return
        self.unreadable = False
        records = parse_records(raw, self.rundir.fleet.describe())
        alive = self.view.update(records, time.monotonic(), time.time())
        registered = {r.url for r in records}
        for url in alive.keys() - self.fixed - self.joined.keys() - self.admitting.keys():
            if alive[url].server_id not in self.refused:
                self.admitting[url] = asyncio.create_task(self.admit(url, alive[url].server_id))
        for url in self.joined.keys() - alive.keys():
            stopped = "its heartbeat in {} stopped" if url in registered else "it left the fleet {}"
            await self.leave(url, stopped.format(self.rundir.fleet.describe()))
        for url in self.admitting.keys() - alive.keys():
            log.warning("inference server %s left before it was admitted", url)
            self.admitting.pop(url).cancel()

    async def admit(self, url: str, server_id: str) -> None:
        log.info("inference server %s joined the fleet: bringing it to the current weights", url)
        client = InferenceClient(url, self.cfg.inference.token(), self.oc.servers.request_timeout_s)
        try:
            server = await self.connect(client)
        except TriadError as e:
            log.warning("not admitting inference server %s (until it restarts): %s", url, e)
            self.refused.add(server_id)
            await client.close()
            return
        except asyncio.CancelledError:
            await client.close()
            raise
        except Exception as e:  # a malformed answer: refused, said, not retried at every poll
            log.warning(
                "not admitting inference server %s (until it restarts): %s: %s", url, type(e).__name__, e
            )
            self.refused.add(server_id)
            await client.close()
            return
        finally:
            if self.admitting.get(url) is asyncio.current_task():  # not a newer admission's entry
                del self.admitting[url]
        self.pool.add(server)
        self.joined[url] = server
        log.info("inference server %s admitted, serving version %d", url, server.version)

    async def connect(self, client: InferenceClient) -> Server:
        """A server for `client`, at the trainer's newest version; TriadError if it cannot be."""
        if self.weights is None:
            raise TriadError("the orchestrator is not following weights yet")
        server = await self.reach(client, self.weights.run_id)
        await self.bring_up(server)
        return server

    async def reach(self, client: InferenceClient, run_id: str) -> Server:
        """Once it answers: the server, with the weight backend it has (a LoRA run's: its adapter)."""
        await client.wait_ready(self.oc.servers.ready_timeout_s, self.oc.servers.model_name)
        return Server(client, await backend_for(client, self.cfg, run_id))

    async def bring_up(self, server: Server) -> None:
        """Make it serve the trainer's newest version written as files (also one published while
        it loaded; between this check and joining the pool nothing awaits, so the weight follower
        takes it every later version). A version sent by broadcast only reaches it with the next
        broadcast, as it reaches a server that came back. A joiner still behind the trainer after
        `BRING_UP_LOADS` loads loads slower than the trainer publishes: refused, saying so."""
        weights = self.weights
        if weights is None:
            raise TriadError("the orchestrator is not following weights yet")
        if server.backend.updates == weights.frozen:
            raise TriadError(f"it loads weights with {server.backend.kind!r}, unlike the servers of this run")
        if weights.frozen:
            return
        server.version = -1  # what it holds was loaded before we knew it
        await weights.align(server)
        for _ in range(BRING_UP_LOADS):
            newer = weights.published.newest_marked(after=server.version, loadable=True)
            if newer is None:
                return
            await weights.load(server, *newer)
            if not server.healthy:
                raise TriadError(server.why_out)
        newest = weights.published.newest(after=server.version, loadable=True)
        if newest is not None:
            raise TriadError(
                f"it is still behind the trainer after loading {BRING_UP_LOADS} versions while joining "
                f"(serves {server.version}, the trainer has published {newest}): it loads slower than "
                f"the trainer publishes"
            )

    async def leave(self, url: str, why: str) -> None:
        """Out of the pool at once; its client is closed once no weight load or alignment is in
        flight on it (each holds `loading`, and skips a server whose client is closed)."""
        server = self.joined.pop(url)
        self.pool.remove(server, why)
        async with server.loading:
            await server.client.close()

    async def close(self) -> None:
        for task in list(self.admitting.values()):
            task.cancel()
        for server in self.joined.values():
            await server.client.close()
