"""`fleet/`: the records of the inference servers that joined a run."""

from __future__ import annotations

from shared.rundir.names import _FLEET, _FLEET_SUFFIX
from shared.storage import Storage


class FleetRegistry:
    """`fleet/`: one record per inference server that joined the run (`shared/fleet.py`)."""

    def __init__(self, store: Storage) -> None:
        self.store = store

    def key(self, server_id: str) -> str:
        return f"{_FLEET}/{server_id}{_FLEET_SUFFIX}"

    def write(self, server_id: str, body: bytes) -> None:
        self.store.write_bytes(self.key(server_id), body)

    def remove(self, server_id: str) -> None:
        self.store.remove(self.key(server_id))

    def read_all(self) -> dict[str, bytes]:
        """The records by server id (one that vanished between listing and reading is left out)."""
        out = {}
        for name in self.store.children(_FLEET, dirs=False):
            server_id = name.removesuffix(_FLEET_SUFFIX)
            raw = self.store.read_bytes(self.key(server_id)) if name.endswith(_FLEET_SUFFIX) else None
            if raw is not None:
                out[server_id] = raw
        return out

    def describe(self) -> str:
        """The registry's location, for messages."""
        return self.store.describe(_FLEET)
