"""Metrics as JSON lines in `run_dir/metrics/<service>.jsonl`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, **values: Any) -> dict[str, Any]:
        row = {"step": step, "time": time.time(), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row


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
