"""Liveness by progress, and one writer per role.

Each service that writes a run directory's shared state (the trainer, the orchestrator) holds a
*lease* on its role: the record `live/<role>.json` (`shared/rundir/live_records.py`) names its
host, pid and last renewal, and carries its *progress* (counters and a phase, `Progress`). A
thread renews it every `RENEW_S` seconds, off the critical path of any step. A second process
that finds a live record refuses to start, naming the holder; a record not renewed for `LEASE_S`
seconds (or whose process is gone on this host: no process of its pid and start time, as after a
`kill -9` or a restarted container) is taken over at once.

A service that waits for its peer (the trainer for a batch, the orchestrator for weights) reads
the peer's record (`PeerWatch`): the wait goes on as long as the peer's progress changes, and
ends with one line naming the peer and its last sign of life once it has not changed for the
stall bound (`trainer.batch_stall_s`, `orchestrator.weights_stall_s`). Progress is judged by
the waiter's own clock, so hosts need not agree on the time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.errors import TriadError, WaitTimeout
from shared.rundir import LiveRecords

log = logging.getLogger("triad.liveness")
RENEW_S = 2.0  # the heartbeat: a lease is renewed, and its progress published, this often
LEASE_S = 30.0  # a lease not renewed for this long has no holder any more
READ_S = 1.0  # a waiter reads its peer's record at most this often (and four times per stall bound)


class LiveRecord(BaseModel):
    """One role's holder and its progress (wall-clock times, as the holder's clock has them)."""

    role: str
    holder: str
    host: str
    pid: int
    pid_start: int | None = None  # the process's start time (`process_start`): a pid reused is another
    started_at: float
    renewed_at: float
    progress: dict[str, Any] = {}
    progress_at: float

    def holder_is_gone(self, now: float) -> bool:
        """Not renewed for `LEASE_S`, or a pid of this host that no longer exists."""
        if now - self.renewed_at > LEASE_S:
            return True
        if self.host != socket.gethostname():
            return False
        return process_start(self.pid) != self.pid_start

    def who(self, now: float) -> str:
        return f"host {self.host}, pid {self.pid}, renewed {max(now - self.renewed_at, 0):.0f} s ago"

    def last_progress(self, now: float) -> str:
        done = ", ".join(f"{k} {v}" for k, v in self.progress.items()) or "nothing yet"
        at = time.strftime("%H:%M:%S UTC", time.gmtime(self.progress_at))
        return f"{done} at {at} ({max(now - self.progress_at, 0):.0f} s ago)"


def process_start(pid: int) -> int | None:
    """When process `pid` of this host started (clock ticks after boot, /proc/PID/stat); None if
    there is no such process, or no /proc (then a lease is taken over after `LEASE_S` only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])  # a zombie has ended


def parse_record(raw: bytes | None, where: str) -> LiveRecord | None:
    """The record, or None if there is none; a damaged one is logged and counts as none."""
    if raw is None:
        return None
    try:
        return LiveRecord.model_validate_json(raw)
    except ValidationError as e:
        log.warning("%s is not a valid liveness record (%s): ignoring it", where, e.errors()[0]["msg"])
        return None


class Progress:
    """A service's progress so far: counters and a phase, updated by its work (a dict update
    under a lock), read by the heartbeat thread."""

    def __init__(self, **initial: Any) -> None:
        self._values: dict[str, Any] = dict(initial)
        self._lock = threading.Lock()

    def set(self, **values: Any) -> None:
        with self._lock:
            self._values.update(values)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)


def stop_this_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Lease:
    """This process's hold on `role` in a run directory, renewed with its heartbeat."""

    def __init__(
        self,
        live: LiveRecords,
        role: str,
        progress: Progress,
        clock: Callable[[], float] = time.time,
        on_lost: Callable[[], None] = stop_this_process,
        renew_s: float = RENEW_S,
    ) -> None:
        self.live, self.role, self.progress, self.clock, self.on_lost = live, role, progress, clock, on_lost
        self.renew_s = renew_s
        now = clock()
        self.record = LiveRecord(
            role=role,
            holder=uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=os.getpid(),
            pid_start=process_start(os.getpid()),
            started_at=now,
            renewed_at=now,
            progress=progress.snapshot(),
            progress_at=now,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def body(self) -> bytes:
        return self.record.model_dump_json().encode()

    def acquire(self) -> None:
        """Hold the role, or TriadError naming the process that holds it."""
        where = self.live.describe(self.role)
        for _ in range(3):
            held = parse_record(self.live.read(self.role), where)
            if held is None:
                if self.live.create(self.role, self.body()):
                    return
                continue  # created by another process meanwhile (or by us: `ours`): look at it
            if self.ours(held):
                return
            now = self.clock()
            if not held.holder_is_gone(now):
                raise TriadError(
                    f"another {self.role} holds this run directory ({where}: {held.who(now)}): stop it "
                    f"first; a holder that stops renewing is replaced after {LEASE_S:g} s"
                )
            log.warning("taking over the %s role from a holder that is gone (%s)", self.role, held.who(now))
            again = parse_record(self.live.read(self.role), where)
            if again is not None and again.holder == held.holder:  # not taken by another meanwhile
                self.live.remove(self.role)
        raise TriadError(f"could not take the {self.role} role in {where}: other processes keep taking it")

    def renew(self) -> bool:
        """Publish the progress and renew; False if another process holds the role now."""
        held = parse_record(self.live.read(self.role), self.live.describe(self.role))
        if held is not None and held.holder != self.record.holder:
            return False
        now, progress = self.clock(), self.progress.snapshot()
        changed = progress != self.record.progress
        self.record = self.record.model_copy(
            update=dict(
                renewed_at=now, progress=progress, progress_at=now if changed else self.record.progress_at
            )
        )
        if held is None:  # removed under us (by hand): ours again only if nobody else took it
            if self.live.create(self.role, self.body()):
                return True
            again = parse_record(self.live.read(self.role), self.live.describe(self.role))
            return again is not None and self.ours(again)
        self.live.write(self.role, self.body())
        return True

    def ours(self, held: LiveRecord) -> bool:
        """Whether a record found is this lease's own: on an object store a create whose reply
        was lost is retried, and the retry finds the record the first attempt wrote."""
        return held.holder == self.record.holder

    def start(self) -> Lease:
        """Acquire, then renew in a thread until `close`."""
        self.acquire()
        self._thread = threading.Thread(target=self._beat, name=f"triad-{self.role}-lease", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                held = self.renew()
            except (OSError, TriadError) as e:  # the store is unreachable for a moment: try again
                log.warning("could not renew the %s lease: %s", self.role, e)
                continue
            if not held:
                log.error(
                    "another process took over the %s role in %s: stopping this one",
                    self.role,
                    self.live.describe(self.role),
                )
                self.on_lost()
                return

    def close(self) -> None:
        """Stop renewing and give the role up (a record another process holds now is left)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            held = parse_record(self.live.read(self.role), self.live.describe(self.role))
            if held is not None and held.holder == self.record.holder:
                self.live.remove(self.role)
        except (OSError, TriadError) as e:
            log.warning("could not give up the %s lease: %s", self.role, e)


def check_free(live: LiveRecords, role: str, clock: Callable[[], float] = time.time) -> None:
    """TriadError naming the holder if a live process holds `role` (what `triad up` checks
    before it touches the run directory)."""
    where = live.describe(role)
    held = parse_record(live.read(role), where)
    now = clock()
    if held is not None and not held.holder_is_gone(now):
        raise TriadError(
            f"another {role} holds this run directory ({where}: {held.who(now)}): stop it first; "
            f"a holder that stops renewing is replaced after {LEASE_S:g} s"
        )


def describe_holder(live: LiveRecords, role: str, now: float) -> str:
    """`triad status`'s line of a role: its holder and last progress, or that none holds it."""
    held = parse_record(live.read(role), live.describe(role))
    if held is None:
        return "no process holds it"
    gone = " (gone: the lease is free)" if held.holder_is_gone(now) else ""
    return f"{held.who(now)}{gone}; last progress: {held.last_progress(now)}"


class PeerWatch:
    """A waiter's view of its peer's progress: `check` ends a wait once the peer's progress has
    not changed for `stall_s` seconds of this process's clock."""

    def __init__(
        self,
        live: LiveRecords,
        role: str,
        stall_s: float,
        key: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.live, self.role, self.stall_s, self.key = live, role, stall_s, key
        self.clock, self.wall = clock, wall
        self.read_s = min(READ_S, stall_s / 4)
        self.seen: tuple[str, Any] | None = None
        self.seen_record: LiveRecord | None = None
        self.changed_at = self.read_at = -float("inf")
        self.stalled_since: float | None = None  # of `while_stalled`
        self.logged_at = 0.0
        self.reset()

    def reset(self) -> None:
        """Start the stall clock now (a new wait)."""
        self.changed_at = self.clock()

    def observe(self) -> None:
        """Read the peer's record (at most every `read_s`); a change of progress or holder resets
        the stall clock."""
        now = self.clock()
        if now - self.read_at < self.read_s:
            return
        self.read_at = now
        record = parse_record(self.live.read(self.role), self.live.describe(self.role))
        if record is None:
            return
        seen = (record.holder, record.progress)
        if seen != self.seen:
            self.seen, self.seen_record, self.changed_at = seen, record, now
        self.seen_record = record

    def stalled_for(self) -> float:
        return self.clock() - self.changed_at

    def check(self, what: str) -> None:
        """WaitTimeout naming the peer and its last sign of life if it has stalled."""
        self.observe()
        if self.stalled_for() > self.stall_s:
            raise WaitTimeout(f"{self.describe_stall()} ({self.key}); waited for {what}")

    async def acheck(self, what: str) -> None:
        """`check`, with the store read in a thread (never on the event loop)."""
        if self.clock() - self.read_at >= self.read_s:
            await asyncio.to_thread(self.observe)
        if self.stalled_for() > self.stall_s:
            raise WaitTimeout(f"{self.describe_stall()} ({self.key}); waited for {what}")

    async def while_stalled(self, stalled: bool, what: str, log_every: float = 15.0) -> None:
        """For a wait that only this peer can end while `stalled` is true: the stall clock runs
        from the first such call (restarting after a call with `stalled` false), a long wait is
        logged with the peer's last sign of life, and WaitTimeout ends it once the peer stalled."""
        if not stalled:
            self.end_stall()
            return
        now = self.clock()
        if self.stalled_since is None:
            self.stalled_since = self.logged_at = now
            self.reset()
        await self.acheck(what)
        if now - self.logged_at >= log_every:
            self.logged_at = now
            log.info("still waiting for %s (%.0f s; %s)", what, now - self.stalled_since, self.last_sign())

    def end_stall(self) -> None:
        """The wait of `while_stalled` is over: the next one starts its stall clock afresh."""
        self.stalled_since = None

    def describe_stall(self) -> str:
        record, now = self.seen_record, self.wall()
        if record is None:
            return (
                f"no heartbeat from the {self.role} in {self.live.describe(self.role)} for "
                f"{self.stall_s:g} s: is it running?"
            )
        return (
            f"the {self.role} ({record.who(now)}) made no progress for {self.stall_s:g} s; "
            f"its last: {record.last_progress(now)}"
        )

    def last_sign(self) -> str:
        """The peer's last progress, for a log line of a long wait."""
        if self.seen_record is None:
            return f"no heartbeat from the {self.role} yet"
        return f"the {self.role}'s last progress: {self.seen_record.last_progress(self.wall())}"
