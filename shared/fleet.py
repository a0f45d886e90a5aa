"""The elastic inference fleet's registry: who joined a run, and who is still alive.

An inference server started with `triad inference --join` writes one small record
(`FleetRecord`) to the run directory and rewrites it every
`inference.heartbeat_interval_s` with its `beat` counted up; on a clean shutdown it
removes it. The orchestrator reads the registry every `orchestrator.servers.fleet_poll_s`
and judges liveness by its own clock (`FleetView`): a record is alive while its beat
keeps changing within `orchestrator.servers.heartbeat_timeout_s`. Only a record seen for the
first time is judged by the time written in it, so that a leftover of a server killed
before this orchestrator started is not taken for a live one until its beat moves
(clocks need not agree).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid

from pydantic import BaseModel, ValidationError

from shared.errors import TriadError
from shared.rundir import RunDir

log = logging.getLogger("triad.fleet")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class FleetRecord(BaseModel):
    server_id: str
    url: str
    beat: int  # counts up with every rewrite
    written_at: float  # the writer's wall clock
    started_at: float


def default_url(host: str, port: int) -> str:
    """How others reach a server bound to `host`: this machine's name for a wildcard address."""
    if host in WILDCARD_HOSTS:
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class Registration:
    """One joined server's record in the registry (the inference side)."""

    def __init__(self, rundir: RunDir, url: str, server_id: str | None = None) -> None:
        self.rundir = rundir
        now = time.time()
        self.record = FleetRecord(
            server_id=server_id or uuid.uuid4().hex[:12], url=url, beat=0, written_at=now, started_at=now
        )
        self.failing = False

    def beat(self) -> None:
        self.record.beat += 1
        self.record.written_at = time.time()
        self.rundir.fleet.write(self.record.server_id, self.record.model_dump_json().encode())

    def leave(self) -> None:
        try:
            self.rundir.fleet.remove(self.record.server_id)
        except (OSError, TriadError) as e:  # the orchestrator drops it once its heartbeat times out
            log.warning("cannot remove the fleet record from %s: %s", self.rundir.fleet.describe(), e)
            return
        log.info("left the fleet of %s (%s)", self.rundir.fleet.describe(), self.record.url)

    async def keep_alive(self, interval: float) -> None:
        """Forever: renew the record; a failed write is logged and tried again at the next beat."""
        while True:
            try:
                await asyncio.to_thread(self.beat)
            except (OSError, TriadError) as e:  # an object store that gave up: tried again next beat
                if not self.failing:
                    log.warning("cannot renew the fleet record in %s: %s", self.rundir.fleet.describe(), e)
                self.failing = True
            else:
                if self.record.beat == 1 or self.failing:
                    log.info("joined the fleet of %s as %s", self.rundir.fleet.describe(), self.record.url)
                self.failing = False
            await asyncio.sleep(interval)


def parse_records(raw: dict[str, bytes], where: str) -> list[FleetRecord]:
    """The valid records; a malformed one is logged and left out."""
    out = []
    for server_id, body in raw.items():
        try:
            out.append(FleetRecord.model_validate_json(body))
        except ValidationError as e:
            log.warning("ignoring the fleet record %s in %s: %s", server_id, where, e.errors()[0]["msg"])
    return out


class FleetView:
    """Which joined servers are alive, by the reader's clock (plain code, no I/O but a log line)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.changed: dict[str, tuple[int, float]] = {}  # server id -> (beat, monotonic time it changed)
        self.leftovers: dict[str, int] = {}  # server id -> beat, of records already old when first seen

    def update(self, records: list[FleetRecord], now: float, wall_now: float) -> dict[str, FleetRecord]:
        """The live records by URL (the newest server of a URL if several claim it). `now` is
        a monotonic time, `wall_now` the wall clock that first sightings are judged by."""
        alive: dict[str, FleetRecord] = {}
        present = set()
        for record in records:
            present.add(record.server_id)
            seen = self.changed.get(record.server_id)
            if seen is None and self.is_leftover(record, wall_now):
                continue
            if seen is None or seen[0] != record.beat:
                self.changed[record.server_id] = seen = (record.beat, now)
            if now - seen[1] > self.timeout:
                continue
            other = alive.get(record.url)
            if other is None or other.started_at < record.started_at:
                alive[record.url] = record
        self.changed = {k: v for k, v in self.changed.items() if k in present}
        self.leftovers = {k: v for k, v in self.leftovers.items() if k in present}
        return alive

    def is_leftover(self, record: FleetRecord, wall_now: float) -> bool:
        """Whether a record not seen changing yet is a stopped server's: old when first seen,
        and its beat not moved since (a server whose clock is behind beats on)."""
        if wall_now - record.written_at <= self.timeout:
            return False
        if record.server_id not in self.leftovers:
            self.leftovers[record.server_id] = record.beat
            log.info(
                "ignoring the fleet record of %s: written %.0f s ago, by its own clock (a server that "
                "stopped; if its beat goes on, it is alive)",
                record.url,
                wall_now - record.written_at,
            )
        return self.leftovers[record.server_id] == record.beat
