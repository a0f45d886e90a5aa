"""Fault injection and read auditing for the fault tests; both inert unless their variable is set.

- `TRIAD_FAILPOINT=<name>:<step>[,<name>:<step>...]` makes the process kill itself with
  SIGKILL when it reaches that point (e.g. `orchestrator.before_marker:5`: batch 5 written,
  its `DONE` not yet), so a test can crash a service at an exact, otherwise unlikely moment;
  `hold` points pause there instead (`HOLD_S`, or until the file `TRIAD_RELEASE` names
  exists), and `trainer.corrupt_bucket` flips a bit.
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
RELEASE_VAR = "TRIAD_RELEASE"
ORCHESTRATOR_BEFORE_MARKER = "orchestrator.before_marker"
ORCHESTRATOR_HOLD_BATCH = "orchestrator.hold_batch"  # a batch's file being written, in its directory
TRAINER_MID_STEP = "trainer.mid_step"
TRAINER_CORRUPT_BUCKET = "trainer.corrupt_bucket"
TRAINER_HOLD_BROADCAST = "trainer.hold_broadcast"
TRAINER_BEFORE_DELTA_MARKER = "trainer.before_delta_marker"  # a delta version uploaded, its DONE not yet
INFERENCE_MID_APPLY = "inference.mid_apply"  # a delta applied in memory, the new version not yet loaded
HOLD_S = 3.0
RELEASE_WAIT_S = 600.0


def armed(name: str, step: int) -> bool:
    return f"{name}:{step}" in os.environ.get(FAILPOINT_VAR, "").split(",")


def failpoint(name: str, step: int) -> None:
    if armed(name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def hold(name: str, step: int, seconds: float = HOLD_S) -> None:
    """Pause `seconds` at that point: a window in which a test acts (kills a peer, say)
    at a moment that otherwise lasts milliseconds. With `TRIAD_RELEASE`, pause until the test
    creates that file instead (at most `RELEASE_WAIT_S`): a window as long as its act takes."""
    if not armed(name, step):
        return
    release = os.environ.get(RELEASE_VAR)
    if not release:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + RELEASE_WAIT_S
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def audit_read(step_dir: Path, done: bool, reader: str) -> None:
    """Record that `reader` opened `step_dir`, and whether its marker was there."""
    path = os.environ.get(AUDIT_VAR)
    if not path:
        return
    line = json.dumps({"reader": reader, "dir": str(step_dir), "done": done})
    with open(path, "a") as f:
        f.write(line + "\n")
