"""The weight follower: which version every server serves, and bringing them up to date.

It watches the trainer's published versions (`weights/step_V/DONE`, or the
broadcast handshake), has every healthy server load the newest one through its
weight backend, aligns a server that (re)connects with this run's newest
loadable version, and tells its owner of each new version (`on_version`: the orchestrator
prunes the batches the trainer is done with, `orchestrator/batches/retention.py`). Each load is checked
against the trainer's digests (`CheckedLoads`). With a
backend that cannot load weights (`none`) the policy is frozen; the trainer's
published version then stands in for the served one, so it still paces rollouts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from orchestrator.servers.backends.base import DigestMismatch
from orchestrator.servers.client import ServerUnreachable
from orchestrator.servers.pool import Server, ServerPool
from orchestrator.weights.broadcasting import BroadcastCoordinator
from orchestrator.weights.integrity import mismatch
from orchestrator.weights.published import PublishedWeights
from shared.admin_api import WeightsInfo
from shared.config import TriadConfig
from shared.errors import TriadError
from shared.liveness import PeerWatch
from shared.resume import newest_checkpoint
from shared.rundir import TRAINER, Marker, RunDir
from shared.waiting import Backoff, poll_cap
from shared.watch import DirWatch

log = logging.getLogger("triad.orchestrator")
POLL_S = 0.1


class CheckedLoads:
    """Loads compared with the trainer's digests of the version (`orchestrator/weights/integrity.py`)."""

    def __init__(self, rundir: RunDir, run_id: str) -> None:
        self.rundir, self.run_id = rundir, run_id
        self.unverified: set[str] = set()  # servers told of once: they report no digests

    async def load(self, server: Server, version: int, path: str, marker: Marker | None = None) -> None:
        """Load, then compare what the server loaded with the trainer's digests; on a mismatch
        load once more, then stop the run naming the server, the version and the tensor.
        `marker`: the version's, where the caller has read it already (else it is read here)."""
        if marker is None and version:
            marker = await asyncio.to_thread(self.rundir.weights.marker, version, self.run_id)
        required = self.verifiable(server)
        problem = mismatch(marker, await server.backend.load(version, path), required)
        if problem is None:
            return
        log.warning(
            "%s loaded version %d with other bytes than published (%s): loading it again",
            server.url,
            version,
            problem,
        )
        problem = mismatch(marker, await server.backend.load(version, path), required)
        if problem is not None:
            raise DigestMismatch(
                f"{server.url} serves version {version} from {path} with other bytes than "
                f"the trainer published, also after a reload: {problem}"
            )

    def verifiable(self, server: Server) -> bool:
        """triad's servers report digests of what they load; others are trusted, said once."""
        if server.backend.kind in ("triad", "triad-lora"):
            return True
        if server.url not in self.unverified:
            self.unverified.add(server.url)
            log.warning(
                "%s (backend %r) reports no weight digests: loads there are not verified",
                server.url,
                server.backend.kind,
            )
        return False


class WeightFollower:
    def __init__(
        self,
        cfg: TriadConfig,
        rundir: RunDir,
        run_id: str,
        pool: ServerPool,
        on_change: Callable[[], Awaitable[None]],
        on_version: Callable[[int], None] | None = None,
        trainer: PeerWatch | None = None,
    ) -> None:
        """`on_change` is awaited after each new version; `on_version(version)` runs in a thread
        after it (store work of the follower's owner, kept off the path from a version to its
        rollouts: the orchestrator's pruning reads several markers, each a round trip in an object
        store). `trainer`: the trainer's progress, which bounds `wait_for_version` (default: a
        watch bounded by `orchestrator.weights_stall_s`)."""
        self.cfg, self.rundir, self.run_id, self.pool = cfg, rundir, run_id, pool
        self.trainer = trainer or PeerWatch(
            rundir.live, TRAINER, cfg.orchestrator.weights_stall_s, "orchestrator.weights_stall_s"
        )
        self.on_change, self.on_version = on_change, on_version
        self.published = PublishedWeights(rundir, run_id)
        self.checked = CheckedLoads(rundir, run_id)
        self.frozen = not any(s.backend.updates for s in pool.servers)
        self.trainer_version = 0  # the newest version the trainer has published
        self.trainer_version_created = 0.0  # its marker's time: a resumed trainer republishes
        self.broadcast = None
        if cfg.weights.transport == "broadcast" and not self.frozen and not cfg.trainer.lora.rank:
            self.broadcast = BroadcastCoordinator(rundir, run_id, pool, cfg.weights.broadcast)

    @property
    def served_version(self) -> int:
        """The version rollouts may count on: the oldest a healthy server serves, or
        when frozen the trainer's progress (which then paces rollouts)."""
        if self.frozen:
            return self.trainer_version
        servers = self.pool.healthy() or self.pool.servers
        return min(s.version for s in servers)

    async def load(self, server: Server, version: int, marker: Marker | None = None) -> None:
        """Bring one server to `version` (`marker`: as in `CheckedLoads.load`); one that cannot
        load it is taken out of rotation."""
        async with server.loading:
            if server.version >= version or server.client.closed:  # closed: it left the fleet
                return
            try:
                await self.checked.load(server, version, self.rundir.weights.relative(version), marker)
            except DigestMismatch:
                raise
            except TriadError as e:
                self.pool.take_out(server, f"could not load version {version}: {e}")
                return
            server.version = version

    async def check_received(self, server: Server, version: int, files: bool) -> None:
        """A version that came by broadcast: compare the server's digests with the marker's;
        on a mismatch reload from files if there are any, else stop the run. A server that
        does not answer is taken out unchecked: the health watcher aligns it when back."""
        async with server.loading:
            if server.version != version:
                return
            marker = await asyncio.to_thread(self.rundir.weights.marker, version, self.run_id)
            try:
                problem = mismatch(marker, await server.backend.current())
            except ServerUnreachable as e:
                server.version = -1  # what it holds is unverified: `align` loads it again
                self.pool.take_out(server, f"could not check version {version} it received: {e}")
                return
            if problem is None:
                return
            if not files:
                raise DigestMismatch(
                    f"{server.url} received version {version} by broadcast with other bytes than the "
                    f"trainer sent, and there are no files to reload: {problem}"
                )
            log.warning(
                "%s received version %d with other bytes than sent (%s): loading its files",
                server.url,
                version,
                problem,
            )
            await self.checked.load(server, version, self.rundir.weights.relative(version), marker)

    async def align(self, server: Server) -> None:
        """Make a server serve this run's newest published weights (or its base).

        What it holds is kept if it is this run's and at least that new, and it is certain
        to be of the trainer's current lineage: checkpointed, or loaded by this orchestrator
        (which would have seen a rewind). A version after the checkpoint that a server held
        before may be one a resumed trainer has since published again, with other weights."""
        if not server.backend.updates:
            return
        async with server.loading:
            if server.client.closed:  # it left the fleet
                return
            info = await server.backend.current()
            newest, checkpoint, holds = await asyncio.to_thread(self.newest_for, info)
            current_lineage = info.version <= checkpoint or info.version == server.version
            if holds and info.version >= newest and current_lineage:
                server.version = info.version
                return
            path = self.rundir.weights.relative(newest) if newest else info.base_path
            log.info("%s serves %s v%d: loading this run's v%d", server.url, info.path, info.version, newest)
            await self.checked.load(server, newest, path)
            server.version = newest

    async def connect(self) -> None:
        """Align every server; what each holds was loaded before this orchestrator started.
        One that does not answer is taken out of rotation, not the run: the health watcher aligns
        it when it answers again (after a trainer rewind, it may be out already); with none
        healthy for `servers.ready_timeout_s` the run stops naming each (`ServerPool.pick`)."""
        for server in self.pool.servers:
            if server.backend.updates:
                server.version = -1
            try:
                await self.align(server)
            except ServerUnreachable as e:
                self.pool.take_out(server, f"could not give it this run's weights: {e}")
        if self.frozen:
            log.warning(
                "the inference backend cannot load weights: the policy stays frozen at the served model; "
                "max_async_level only bounds how far rollouts run ahead of the trainer"
            )

    def newest_for(self, info: WeightsInfo) -> tuple[int, int, bool]:
        """(this run's newest loadable version, the newest checkpoint, whether `info` is this
        run's): store reads, run in a thread."""
        newest = self.published.newest(after=-1, loadable=True) or 0
        return newest, newest_checkpoint(self.rundir, self.run_id), self.published.holds(info)

    def newer_version(self) -> tuple[int, Marker] | None:
        """The trainer's newest version after the followed one, with its marker (store reads, run
        in a thread); first, a rewound trainer is noticed."""
        self.published.check_lineage(self.trainer_version, self.trainer_version_created)
        return self.published.newest_marked(after=self.trainer_version)

    async def follow(self) -> None:
        """Forever: take each newly published version to the servers, then tell `on_change` and
        `on_version`.
        Looks for a new version from the store's `poll_floor_s` up to `poll_cap` of it (`Backoff`),
        and at once when a marker is written where the store can tell (`shared/watch.py`): the
        next version usually comes one training step after the last. Store reads and writes run
        in threads: a slow store call does not stall generation."""
        watch = await asyncio.to_thread(self.rundir.weights.watch)
        try:
            await self._follow(watch)
        finally:
            if watch is not None:
                watch.close()

    async def _follow(self, watch: DirWatch | None) -> None:
        floor = self.rundir.store.poll_floor_s
        intervals = Backoff(floor, poll_cap(floor))
        sleep = asyncio.sleep if watch is None else watch.wait_async
        while True:
            if self.broadcast is not None:
                await asyncio.to_thread(
                    self.published.check_lineage, self.trainer_version, self.trainer_version_created
                )
                ready = await asyncio.to_thread(self.broadcast.ready_to_send, self.trainer_version)
                if ready is not None:
                    await self.broadcast.deliver(ready)
                    intervals.reset()  # its DONE comes once the trainer has sent it
            found = await asyncio.to_thread(self.newer_version)
            if found is None:  # none yet (or pruned between the listing and the read)
                await sleep(intervals.next())
                continue
            intervals.reset()
            version, marker = found
            self.trainer_version, self.trainer_version_created = version, marker.created_at
            files = getattr(marker, "files", True)
            if not self.frozen and self.broadcast is not None:  # what came by broadcast is checked first
                await asyncio.gather(*(self.check_received(s, version, files) for s in self.pool.healthy()))
            if not self.frozen and files:
                await asyncio.gather(*(self.load(s, version, marker) for s in self.pool.healthy()))
                log.info("inference now serves version %d", self.served_version)
            await self.on_change()  # rollouts of the new version may start now
            if self.on_version is not None:
                await asyncio.to_thread(self.on_version, version)

    async def wait_for_version(self, version: int) -> None:
        """Until the servers serve `version` (the trainer's last), as long as the trainer makes
        progress towards it (its loads are bounded by `orchestrator.servers.weight_load_timeout_s`),
        then as long as a server is healthy to load it (`check_servers_can_load`)."""
        what = f"{self.rundir.weights.describe_marker(version)} from the trainer, after the last batch"
        while self.served_version < version:
            await self.trainer.while_stalled(self.trainer_version < version, what)
            self.check_servers_can_load(version)
            await asyncio.sleep(POLL_S)
        self.trainer.end_stall()

    def check_servers_can_load(self, version: int) -> None:
        """A wait for `version` once the trainer has published it is a wait on the servers: with
        none healthy to load it for `servers.ready_timeout_s`, TriadError naming each and why."""
        if not self.frozen and self.trainer_version >= version:
            self.pool.check_some_healthy()
