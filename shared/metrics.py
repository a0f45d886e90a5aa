"""Metrics as JSON lines under `run_dir/metrics/`, through the run directory's store.

Each writer has files of its own (`shared/rundir/` names them: one per service, and one per
inference server, since several servers may serve one run). On a local store rows are appended
in place; on an object store, where an object cannot be appended to, each row rewrites the
writer's current part, which is rotated every `part_rows` rows so a rewrite stays small.
Readers always see whole files of complete rows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.storage import atomic_write_bytes

if TYPE_CHECKING:
    from shared.storage import Storage


class MetricsWriter:
    """Appends rows to `key` (a local store), or with `part_rows` to the parts `part_key(n)`
    (an object store): a part that holds `part_rows` rows is left as it is and the next begins.
    The part to continue, and what it holds, are read at the first row (after a restart's
    `drop_after`); later rows rewrite it from this writer's copy (one PUT a row, no GET: the
    writer is its files' only one)."""

    def __init__(
        self,
        store: Storage,
        key: str,
        part_rows: int = 0,
        part_key: Callable[[int], str] | None = None,
        last_part: Callable[[], int] | None = None,
    ) -> None:
        self.store, self.key, self.part_rows = store, key, part_rows
        self.part_key, self.last_part = part_key, last_part
        self.part: int | None = None
        self.written = b""  # the current part as this writer last wrote it
        self.lock = threading.Lock()  # callers may log from threads (off an event loop)

    def log(self, step: int, **values: Any) -> dict[str, Any]:
        row = {"step": step, "time": time.time(), **values}
        with self.lock:
            self.write((json.dumps(row) + "\n").encode())
        return row

    @property
    def rewrites_parts(self) -> bool:
        """Whether each row rewrites a part (an object store: a round trip), not an append."""
        return bool(self.part_rows) and self.part_key is not None

    async def log_from_loop(self, step: int, **values: Any) -> None:
        """`log` from an event loop: on a local store the append is written in place (well under a
        millisecond; a thread hop cost a weight hand-off more, ~7 ms on a busy core); in an object
        store a row is a round trip, made in a thread so that the loop keeps answering."""
        if self.rewrites_parts:
            await asyncio.to_thread(self.log, step, **values)
        else:
            self.log(step, **values)

    def write(self, line: bytes) -> None:
        if not self.rewrites_parts:
            self.store.append(self.key, line)
            return
        if self.part is None:
            part = self.last_part() if self.last_part else 0
            self.written = self.store.read_bytes(self.part_key(part)) or b""
            self.part = part
        part, current = self.part, self.written
        if current.count(b"\n") >= self.part_rows:
            part, current = part + 1, b""
        self.store.write_bytes(self.part_key(part), current + line)
        self.part, self.written = part, current + line


def drop_rows_after(path: Path, step: int) -> int:
    """Rewrite `path` without rows of steps after `step` (a resumed lineage); returns how many."""
    rows = read_metrics(path)
    kept = [r for r in rows if r.get("step", 0) <= step]
    if len(kept) < len(rows):
        atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    return len(rows) - len(kept)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete rows of a local metrics file; a torn last line (writer killed mid-write) is skipped."""
    return parse_metrics(path.read_bytes() if path.exists() else None)


def parse_metrics(raw: bytes | None) -> list[dict[str, Any]]:
    rows = []
    for line in (raw or b"").decode(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
