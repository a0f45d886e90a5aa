"""`live/`: one record per role (trainer, orchestrator, inference): its holder's lease on the role
and its heartbeat of progress (`shared/liveness.py` writes and reads them)."""

from __future__ import annotations

from shared.rundir.names import _LIVE, _LIVE_SUFFIX
from shared.storage import Storage


class LiveRecords:
    """`live/<role>.json`: the record of the process that holds `role` in this run directory."""

    def __init__(self, store: Storage) -> None:
        self.store = store

    def key(self, role: str) -> str:
        return f"{_LIVE}/{role}{_LIVE_SUFFIX}"

    def read(self, role: str) -> bytes | None:
        return self.store.read_bytes(self.key(role))

    def create(self, role: str, body: bytes) -> bool:
        """Write the record only if none exists (the store's conditional create); whether this
        call's last attempt wrote it (an earlier attempt whose reply was lost may have: the record
        then says whose it is)."""
        return self.store.create_once(self.key(role), body)

    def write(self, role: str, body: bytes) -> None:
        self.store.write_bytes(self.key(role), body)

    def remove(self, role: str) -> None:
        self.store.remove(self.key(role))

    def describe(self, role: str) -> str:
        return self.store.describe(self.key(role))
