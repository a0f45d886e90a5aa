import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.batch import BATCH_SCHEMA, COLUMNS, read_batch, token_count, write_batch
from shared.errors import TriadError
from shared.rundir import RunDir


def sample(i: int, n_prompt: int = 2, n_completion: int = 3) -> dict:
    n = n_prompt + n_completion
    return dict(
        sample_id=f"s{i}",
        group_id="g0",
        step=4,
        policy_version=3,
        server="http://127.0.0.1:8000",
        input_ids=list(range(100, 100 + n)),
        loss_mask=[False] * n_prompt + [True] * n_completion,
        logprobs=[0.0] * n_prompt + [-0.5] * n_completion,
        advantage=0.25 * i,
        reward=1.0,
        truncated=i % 2 == 0,
        env="reverse",
        metrics='{"k": 1}',
    )


def test_round_trip_keeps_values_and_schema(tmp_path):
    rows = [sample(i) for i in range(3)]
    rundir = RunDir(tmp_path)
    with rundir.writing_batch(4) as tmp:
        write_batch(tmp, rows)
    table = read_batch(rundir.batch_file(4))
    assert table.schema.equals(BATCH_SCHEMA)
    assert tuple(table.column_names) == COLUMNS
    assert table.to_pylist() == rows
    assert token_count(table) == 15


def test_mismatched_token_columns_are_rejected(tmp_path):
    bad = sample(0)
    bad["logprobs"] = bad["logprobs"][:-1]
    with pytest.raises(ValueError, match="lengths differ"):
        write_batch(tmp_path / "b.parquet", [bad])


def test_wrong_schema_and_corrupt_files_name_the_path(tmp_path):
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    with pytest.raises(TriadError, match="other.parquet does not match"):
        read_batch(path)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1garbage")
    with pytest.raises(TriadError, match="cannot read batch .*corrupt.parquet"):
        read_batch(corrupt)
