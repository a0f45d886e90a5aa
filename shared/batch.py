"""The Parquet batch: one row per sample, schema defined once for both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shared.errors import TriadError
from shared.rundir import atomic_path

BATCH_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("group_id", pa.string()),
        ("step", pa.int32()),
        ("policy_version", pa.int32()),
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
    for row in rows:
        check_row(row)
    table = pa.Table.from_pylist(rows, schema=BATCH_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_batch(path: Path) -> pa.Table:
    """Read a batch and check it has exactly the contract's columns and types."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise TriadError(f"cannot read batch {path}: {e}") from None
    if not table.schema.equals(BATCH_SCHEMA):
        raise TriadError(
            f"batch {path} does not match the batch schema: has {table.schema.names}, "
            f"expected {list(COLUMNS)}"
        )
    return table


def token_count(table: pa.Table) -> int:
    return sum(len(ids) for ids in table.column("input_ids").to_pylist())
