"""`metrics/`: every service's metrics rows, through the store."""

from __future__ import annotations

import json
from typing import Any

from shared.errors import TriadError
from shared.metrics import MetricsWriter, parse_metrics
from shared.rundir.names import _METRICS, _METRICS_NAME, _METRICS_SUFFIX, _SERVER_ID
from shared.storage import LocalStore, Storage


class MetricsFiles:
    """The metrics of every service under `metrics/`, through the store.

    A service's rows are in `<service>.jsonl`; each inference server (several may serve one
    run) writes its own `inference-<server id>.jsonl`. On an object store a writer's rows are
    rotated into parts of `PART_ROWS` (`<name>.jsonl`, then `<name>.00001.jsonl`, ...), since
    each row rewrites its part. `rows` reads and merges them all."""

    PART_ROWS = 500

    def __init__(self, store: Storage) -> None:
        self.store = store

    @staticmethod
    def key(service: str, server_id: str | None = None, part: int = 0) -> str:
        name = service if server_id is None else f"{service}-{server_id}"
        return f"{_METRICS}/{name}{f'.{part:05d}' if part else ''}{_METRICS_SUFFIX}"

    def files(self, service: str) -> list[tuple[str, int, str]]:
        """(server id or "", part, key) of each of a service's metrics files, in that order."""
        found = []
        for name in self.store.children(_METRICS, dirs=False):
            match = _METRICS_NAME.fullmatch(name)
            if match and match["service"] == service:
                found.append((match["server"] or "", int(match["part"] or 0), f"{_METRICS}/{name}"))
        return sorted(found)

    def writer(self, service: str, server_id: str | None = None) -> MetricsWriter:
        if server_id is not None and not _SERVER_ID.fullmatch(server_id):
            raise TriadError(f"server id {server_id!r} is not a lowercase hex string")
        key = self.key(service, server_id)
        if isinstance(self.store, LocalStore):
            return MetricsWriter(self.store, key)

        def last_part() -> int:
            return max((p for s, p, _ in self.files(service) if s == (server_id or "")), default=0)

        part_key = lambda part: self.key(service, server_id, part)  # noqa: E731
        return MetricsWriter(self.store, key, self.PART_ROWS, part_key, last_part)

    def rows(self, service: str) -> list[dict[str, Any]]:
        """All complete rows of a service's metrics (a torn last line is skipped): one writer's
        in the order written, several writers' merged by time; an inference server's rows
        carry its id as `server`."""
        files = self.files(service)
        rows = [row for server, _, key in files for row in self.file_rows(server, key)]
        return merge_writers(rows, len({server for server, _, _ in files}))

    def file_rows(self, server: str, key: str) -> list[dict[str, Any]]:
        """The complete rows of one metrics file (`files`); a server's carry its id as `server`."""
        return [
            {**row, "server": server} if server else row for row in parse_metrics(self.store.read_bytes(key))
        ]

    def drop_after(self, service: str, step: int) -> int:
        """Rewrite a service's metrics without rows of steps after `step`; returns how many.
        A part left empty is removed (a writer continues at the last part there is)."""
        dropped = 0
        for _, part, key in self.files(service):
            rows = parse_metrics(self.store.read_bytes(key))
            kept = [r for r in rows if r.get("step", 0) <= step]
            if len(kept) == len(rows):
                continue
            dropped += len(rows) - len(kept)
            if part and not kept:
                self.store.remove(key)
            else:
                self.store.write_bytes(key, "".join(json.dumps(r) + "\n" for r in kept).encode())
        return dropped


def merge_writers(rows: list[dict[str, Any]], writers: int) -> list[dict[str, Any]]:
    """One writer's rows as they are (in the order written); several writers' merged by time."""
    return sorted(rows, key=lambda r: r.get("time", 0.0)) if writers > 1 else rows
