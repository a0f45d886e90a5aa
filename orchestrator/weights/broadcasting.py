"""The orchestrator's part in weight broadcasts (protocol: `shared/broadcast.py`).

When the trainer says it is ready to send version V, the coordinator makes sure
every healthy server belongs to the current group generation (a new generation,
announced with `POST /admin/broadcast/init`, whenever the set of servers changes
or a broadcast failed), answers `RECEIVING`, and asks every member to receive.
A server whose receive fails is taken out of rotation, so the health watcher
re-aligns it from files; if the trainer's send failed it writes files and the
usual follower loads them: the fall-back for that update.
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.servers.pool import Server, ServerPool
from shared.admin_api import BroadcastInit
from shared.broadcast import (
    Fallback,
    Receiving,
    SendReady,
    read_handshake,
    write_handshake,
)
from shared.config import BroadcastConfig
from shared.errors import TriadError
from shared.rundir import Handshake, RunDir

log = logging.getLogger("triad.orchestrator")


class BroadcastCoordinator:
    def __init__(self, rundir: RunDir, run_id: str, pool: ServerPool, bc: BroadcastConfig) -> None:
        self.rundir, self.run_id, self.pool, self.bc = rundir, run_id, pool, bc
        self.members: list[str] | None = None  # server URLs of the current generation
        self.generation = 0
        self.world_size = 0

    def ready_to_send(self, after: int) -> int | None:
        """The newest version the trainer is waiting to send, if newer than `after`."""
        for v in reversed(self.rundir.weights.steps()):
            if v <= after:
                return None
            answered = self.rundir.weights.has_marker(v) or any(
                self.rundir.has_handshake(v, kind) for kind in (Handshake.RECEIVING, Handshake.FALLBACK)
            )
            if not answered and read_handshake(self.rundir, v, Handshake.SEND_READY, SendReady, self.run_id):
                return v
        return None

    async def deliver(self, version: int) -> None:
        members = self.pool.healthy()
        try:
            if not members:
                raise TriadError("no healthy inference server")
            if [s.url for s in members] != self.members:
                await self.new_generation(members)
        except TriadError as e:
            self.members = None
            fallback = Fallback(run_id=self.run_id, version=version, reason=str(e))
            write_handshake(self.rundir, version, Handshake.FALLBACK, fallback)
            log.warning("version %d falls back to files: %s", version, e)
            return
        answer = Receiving(
            run_id=self.run_id, version=version, generation=self.generation, world_size=self.world_size
        )
        write_handshake(self.rundir, version, Handshake.RECEIVING, answer)
        started = time.monotonic()
        results = await asyncio.gather(*(self.receive(s, version) for s in members), return_exceptions=True)
        failed = [(s, r) for s, r in zip(members, results, strict=True) if isinstance(r, BaseException)]
        for server, error in failed:
            self.pool.take_out(server, f"broadcast of version {version} failed: {error}")
        if failed:
            self.members = None  # the group is broken: the next update starts a new generation
            log.warning(
                "broadcast of version %d failed on %d server(s): falling back to files", version, len(failed)
            )
        else:
            log.info(
                "version %d broadcast to %d server(s) in %.3f s",
                version,
                len(members),
                time.monotonic() - started,
            )

    async def receive(self, server: Server, version: int) -> None:
        path = self.rundir.weights.relative(version)
        async with server.loading:
            info = await server.client.admin.broadcast_receive(version, path, timeout=2 * self.bc.timeout_s)
            if info.version != version:
                raise TriadError(f"{server.url} received version {version} but serves {info.version}")
            server.version = version

    async def new_generation(self, members: list[Server]) -> None:
        if any(s.backend.kind != "triad" for s in members):
            raise TriadError("weight broadcast needs triad's admin routes on every server")
        workers = [(await s.client.admin.broadcast_state()).workers for s in members]
        generation = time.time_ns() // 1_000_000 % 2**31  # unique across orchestrator restarts
        world_size, offset = 1 + sum(workers), 1
        for server, count in zip(members, workers, strict=True):
            init = BroadcastInit(
                host=self.bc.host,
                port=self.bc.port,
                generation=generation,
                world_size=world_size,
                rank_offset=offset,
                timeout_s=self.bc.timeout_s,
            )
            await server.client.admin.broadcast_init(init)
            offset += count
        self.members, self.generation, self.world_size = [s.url for s in members], generation, world_size
        log.info("broadcast group generation %d: trainer + %s", generation, ", ".join(self.members))
