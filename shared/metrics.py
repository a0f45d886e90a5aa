"""Metrics as JSON lines in `run_dir/metrics/<service>.jsonl`, through the run directory's store.

On a local store rows are appended in place; on an object store each row rewrites the
(small, single-writer) object, so readers always see whole files of complete rows."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.storage import atomic_write_bytes

if TYPE_CHECKING:
    from shared.storage import Storage


class MetricsWriter:
    def __init__(self, store: Storage, key: str) -> None:
        self.store, self.key = store, key

    def log(self, step: int, **values: Any) -> dict[str, Any]:
        row = {"step": step, "time": time.time(), **values}
        self.store.append(self.key, (json.dumps(row) + "\n").encode())
        return row


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
