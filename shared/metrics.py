"""Metrics as JSON lines in `run_dir/metrics/<service>.jsonl`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from shared.storage import atomic_write_bytes


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        seal_torn_row(path)

    def log(self, step: int, **values: Any) -> dict[str, Any]:
        row = {"step": step, "time": time.time(), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row


def seal_torn_row(path: Path) -> None:
    """End a row torn by a writer killed mid-write with a newline, so that the next row
    appended is a line of its own (readers skip the torn one)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            torn = f.read(1) != b"\n"
    except FileNotFoundError:
        return
    if torn:  # appended, not written at the end seen: another writer may have added a row since
        with open(path, "ab") as f:
            f.write(b"\n")


def drop_rows_after(path: Path, step: int) -> int:
    """Rewrite `path` without rows of steps after `step` (a resumed lineage); returns how many."""
    rows = read_metrics(path)
    kept = [r for r in rows if r.get("step", 0) <= step]
    if len(kept) < len(rows):
        atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    return len(rows) - len(kept)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete rows; a torn last line (writer killed mid-write) is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
