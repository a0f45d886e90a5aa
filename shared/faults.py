"""Fault injection and read auditing for the fault tests; both inert unless their variable is set.

- `TRIAD_FAILPOINT=<name>:<step>` makes the process kill itself with SIGKILL when it
  reaches that point (e.g. `orchestrator.before_marker:5`: batch 5 written, its
  `DONE` not yet), so a test can crash a service at an exact, otherwise unlikely moment;
  `hold` points pause there instead, and `trainer.corrupt_bucket` flips a bit.
- `TRIAD_AUDIT_READS=<file>` appends one JSON line per step payload a service opens
  (a batch, a weights directory), saying whether its `DONE` marker was there.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

FAILPOINT_VAR = "TRIAD_FAILPOINT"
AUDIT_VAR = "TRIAD_AUDIT_READS"
ORCHESTRATOR_BEFORE_MARKER = "orchestrator.before_marker"
TRAINER_MID_STEP = "trainer.mid_step"
TRAINER_CORRUPT_BUCKET = "trainer.corrupt_bucket"
TRAINER_HOLD_BROADCAST = "trainer.hold_broadcast"
TRAINER_BEFORE_DELTA_MARKER = "trainer.before_delta_marker"  # a delta version uploaded, its DONE not yet
INFERENCE_MID_APPLY = "inference.mid_apply"  # a delta applied in memory, the new version not yet loaded
HOLD_S = 3.0


def armed(name: str, step: int) -> bool:
    return os.environ.get(FAILPOINT_VAR) == f"{name}:{step}"


def failpoint(name: str, step: int) -> None:
    if armed(name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def hold(name: str, step: int, seconds: float = HOLD_S) -> None:
    """Pause `seconds` at that point: a window in which a test acts (kills a peer, say)
    at a moment that otherwise lasts milliseconds."""
    if armed(name, step):
        time.sleep(seconds)


def audit_read(step_dir: Path, done: bool, reader: str) -> None:
    """Record that `reader` opened `step_dir`, and whether its marker was there."""
    path = os.environ.get(AUDIT_VAR)
    if not path:
        return
    line = json.dumps({"reader": reader, "dir": str(step_dir), "done": done})
    with open(path, "a") as f:
        f.write(line + "\n")
