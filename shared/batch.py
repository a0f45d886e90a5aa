"""The Parquet batch: one row per sample, schema defined once for both sides, and how a
batch is published (rows, then the `DONE` marker) and waited for."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shared.errors import TriadError
from shared.faults import ORCHESTRATOR_BEFORE_MARKER, ORCHESTRATOR_HOLD_BATCH, audit_read, failpoint, hold
from shared.rundir import Marker, RunDir
from shared.waiting import Peer, poll_cap, wait_for
from shared.watch import DirWatch

BATCH_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("group_id", pa.string()),
        ("step", pa.int32()),
        ("policy_version", pa.int32()),
        ("server", pa.string()),  # the URL of the server that sampled it (space-separated if several)
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.bool_())),
        ("logprobs", pa.list_(pa.float32())),
        ("advantage", pa.float32()),
        ("reward", pa.float32()),
        ("truncated", pa.bool_()),
        ("env", pa.string()),
        ("metrics", pa.string()),
    ]
)
COLUMNS = tuple(BATCH_SCHEMA.names)


def check_row(row: dict[str, Any]) -> None:
    """Reject a sample whose token-aligned columns disagree in length."""
    n = len(row["input_ids"])
    if len(row["loss_mask"]) != n or len(row["logprobs"]) != n:
        raise ValueError(
            f"sample {row['sample_id']}: input_ids, loss_mask and logprobs lengths differ "
            f"({n}, {len(row['loss_mask'])}, {len(row['logprobs'])})"
        )


def write_batch(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the rows to `path` (a temporary path from `RunDir.writing_batch`)."""
    for row in rows:
        check_row(row)
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), path)


def load_batch_reader() -> None:
    """Import what `pq.read_table` imports on its first call (`pyarrow.dataset`, which imports
    pandas: 0.2-0.3 s), so that the first batch read does not."""
    import pyarrow.dataset  # noqa: F401


def read_batch(source: Path | pa.BufferReader, where: str | None = None) -> pa.Table:
    """Read a batch (a file, or its bytes from `where`) and check it has exactly the
    contract's columns and types."""
    path = where or source
    try:
        table = pq.read_table(source)
    except (OSError, pa.ArrowException) as e:
        raise TriadError(f"cannot read batch {path}: {e}") from None
    if not table.schema.equals(BATCH_SCHEMA):
        raise TriadError(
            f"batch {path} does not match the batch schema: has {table.schema.names}, "
            f"expected {list(COLUMNS)}"
        )
    return table


def publish_batch(
    rundir: RunDir, run_id: str, step: int, rows: list[dict[str, Any]], temperature: float, **producer: Any
) -> int:
    """Write batch `step` and then its marker (sizes, policy versions, sampling temperature, and the
    producer's own fields: the orchestrator's `draws` and `prompt_draws`); returns its token count."""
    rundir.rollouts.clear(step)
    with rundir.writing_batch(step) as tmp:
        write_batch(tmp, rows)
        hold(ORCHESTRATOR_HOLD_BATCH, step)  # tests only: a trainer starts meanwhile
    failpoint(ORCHESTRATOR_BEFORE_MARKER, step)
    tokens = sum(len(r["input_ids"]) for r in rows)
    versions = [r["policy_version"] for r in rows]
    rundir.rollouts.write_marker(
        step,
        run_id,
        samples=len(rows),
        tokens=tokens,
        min_policy_version=min(versions),
        max_policy_version=max(versions),
        temperature=temperature,
        **producer,
    )
    return tokens


def batch_temperature(marker: Marker, where: str) -> float:
    """The temperature batch `marker` was sampled at (`publish_batch` writes it): the trainer's
    logprobs divide the logits by it, so a marker without one is refused, never trained at 1."""
    value = getattr(marker, "temperature", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TriadError(
            f"{where} holds no sampling temperature (temperature = {value!r}): its batch was not written by "
            "this orchestrator's publish_batch; remove that step's directory and restart the orchestrator"
        )
    return float(value)


def wait_for_batch_marker(
    rundir: RunDir,
    step: int,
    run_id: str,
    timeout: float | None,
    watch: DirWatch | None = None,
    peer: Peer | None = None,
) -> Marker:
    """Block until batch `step` of this run is published (polls from the store's floor up;
    `watch`, from `rundir.rollouts.watch()`, wakes the wait as soon as the marker is written),
    for `timeout` seconds or, with `peer` (the orchestrator's `PeerWatch`), as long as the
    orchestrator makes progress."""
    return wait_for(
        lambda: rundir.rollouts.marker(step, run_id),
        f"{rundir.rollouts.describe_marker(step)} from the orchestrator",
        timeout,
        poll=poll_cap(rundir.store.poll_floor_s),
        floor=rundir.store.poll_floor_s,
        sleep=time.sleep if watch is None else watch.wait,
        peer=peer,
    )


def read_batch_rows(rundir: RunDir, step: int, reader: str) -> list[dict[str, Any]]:
    """The rows of batch `step`, whose marker the caller has seen."""
    audit_read(rundir.rollouts.path(step), rundir.rollouts.has_marker(step), reader)
    return load_batch(rundir, step).to_pylist()


def wait_for_batch(
    rundir: RunDir, step: int, run_id: str, timeout: float, reader: str
) -> tuple[Marker, list[dict[str, Any]]]:
    """Block until batch `step` of this run is published, then read it."""
    marker = wait_for_batch_marker(rundir, step, run_id, timeout)
    return marker, read_batch_rows(rundir, step, reader)


def load_batch(rundir: RunDir, step: int) -> pa.Table:
    """Batch `step` from the run directory's store (its marker is the caller's to check)."""
    raw, where = rundir.batch_source(step)
    if raw is None:
        raise TriadError(f"batch {where} is missing although its marker is there")
    return read_batch(pa.BufferReader(raw), where)


def token_count(table: pa.Table) -> int:
    return sum(len(ids) for ids in table.column("input_ids").to_pylist())
