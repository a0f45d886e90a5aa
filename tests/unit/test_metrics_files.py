"""Per-server inference metrics and parts, merged by one reader (`MetricsFiles`), on a local
store (the object store's case is in test_objectstore.py)."""

from __future__ import annotations

import pytest

from services.progress import tail_of
from shared.errors import TriadError
from shared.rundir import INFERENCE, TRAINER, RunDir


def test_each_inference_server_writes_its_own_file_and_rows_merges_them(tmp_path):
    rundir = RunDir(tmp_path)
    a, b = rundir.metrics.writer(INFERENCE, "aaa1"), rundir.metrics.writer(INFERENCE, "bbb2")
    a.log(0, version=0)
    b.log(0, version=0)
    a.log(1, version=1)
    b.log(2, version=2)
    names = sorted(p.name for p in rundir.metrics_file(INFERENCE).parent.iterdir())
    assert names == ["inference-aaa1.jsonl", "inference-bbb2.jsonl"]
    rows = rundir.metrics.rows(INFERENCE)
    assert [(r["server"], r["version"]) for r in rows] == [("aaa1", 0), ("bbb2", 0), ("aaa1", 1), ("bbb2", 2)]
    assert rows[-1]["version"] == 2  # readers take the newest load as the last row
    assert rundir.metrics.drop_after(INFERENCE, 0) == 2
    assert [r["version"] for r in rundir.metrics.rows(INFERENCE)] == [0, 0]


def test_a_local_writer_appends_one_file_without_parts(tmp_path, monkeypatch):
    rundir = RunDir(tmp_path)
    monkeypatch.setattr(rundir.metrics, "PART_ROWS", 2)  # parts are for object stores only
    writer = rundir.metrics.writer(TRAINER)
    for step in range(1, 6):
        writer.log(step)
    assert [f[2] for f in rundir.metrics.files(TRAINER)] == [rundir.metrics.key(TRAINER)]
    assert [r["step"] for r in rundir.metrics.rows(TRAINER)] == [1, 2, 3, 4, 5]
    assert "server" not in rundir.metrics.rows(TRAINER)[0]


def test_progress_follows_a_server_that_starts_later(tmp_path):
    rundir = RunDir(tmp_path)
    tail = tail_of(rundir, INFERENCE)
    assert tail.read() == []
    rundir.metrics.writer(INFERENCE, "aaa1").log(1, version=1)
    assert [r["version"] for r in tail.read()] == [1]
    rundir.metrics.writer(INFERENCE, "bbb2").log(1, version=1)
    rundir.metrics.writer(INFERENCE, "aaa1").log(2, version=2)
    assert [r["version"] for r in tail.read()] == [1, 2]
    assert tail.read() == []


def test_a_server_id_that_is_not_hex_is_refused(tmp_path):
    with pytest.raises(TriadError, match="server id 'a/b' is not a lowercase hex string"):
        RunDir(tmp_path).metrics.writer(INFERENCE, "a/b")
