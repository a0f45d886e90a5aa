"""A full disk is one line naming where, how much is free and what to do, from every writer a
run uses (safetensors, Parquet, plain files, appends), on a real filesystem that fills: a tmpfs."""

from __future__ import annotations

import errno
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import save_file

from shared.diskspace import DiskFull, is_disk_full
from shared.storage import LocalStore
from shared.storecall import StoreCall
from shared.tmpname import TMP_PREFIX
from tests.helpers import small_disk

BIG = torch.zeros(64 * 1024)  # 256 KiB of float32: more than the disk below holds


@pytest.fixture
def store(tmp_path):
    with small_disk(tmp_path / "disk", "128k") as disk:
        yield LocalStore(disk / "run")


def leftovers(store: LocalStore) -> list[str]:
    return [p.name for p in store.root.rglob("*") if p.name.startswith(TMP_PREFIX)]


def assert_one_line_about(error: DiskFull, where: str) -> None:
    text = str(error)
    assert "\n" not in text
    assert f"no space left on the disk of {where}" in text, text
    assert re.search(r"\(\d+ KiB free of 128 KiB\)", text), text
    assert "weights.keep" in text and "resumes" in text, text


def test_text_and_errno_both_say_full():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    )
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("write failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("no space here"))


def test_safetensors_into_a_full_disk_is_one_line_and_leaves_nothing(store):
    with pytest.raises(DiskFull) as caught, store.writing("version_dir/tensors.bin") as tmp:
        save_file({"w": BIG}, tmp)
    assert_one_line_about(caught.value, str(store.root / "version_dir"))
    assert "tensors.bin" in str(caught.value)
    assert leftovers(store) == [] and not store.exists("version_dir/tensors.bin")
    store.write_bytes("version_dir/small", b"fits")  # the partial file's space came back
    assert store.read_bytes("version_dir/small") == b"fits"


def test_parquet_into_a_full_disk_is_one_line(store):
    table = pa.table({"logprobs": torch.rand(64 * 1024).tolist()})  # random: no encoding shrinks it
    with pytest.raises(DiskFull) as caught, store.writing("batch_dir/table.parquet") as tmp:
        pq.write_table(table, tmp)
    assert_one_line_about(caught.value, str(store.root / "batch_dir"))
    assert leftovers(store) == []


def test_plain_writes_appends_and_directories_into_a_full_disk(store):
    with pytest.raises(DiskFull):
        store.write_bytes("big", bytes(256 * 1024))
    with pytest.raises(DiskFull):
        store.create_once("once", bytes(256 * 1024))
    assert leftovers(store) == [] and not store.exists("once")
    store.append("rows/trainer.jsonl", b'{"step": 1}\n')
    with pytest.raises(DiskFull) as caught:
        store.append("rows/trainer.jsonl", bytes(256 * 1024))
    assert_one_line_about(caught.value, str(store.root / "rows"))
    with pytest.raises(DiskFull) as caught, store.writing_dir("state_dir") as directory:
        dcp.save({"model": {"w": BIG}}, checkpoint_id=directory)  # as trainer/checkpoint.py does
    assert_one_line_about(caught.value, str(store.root / "state_dir"))


def test_other_errors_pass_unchanged(store):
    with pytest.raises(ValueError, match="not about disks"), store.writing("a") as _:
        raise ValueError("not about disks")
    with pytest.raises(PermissionError), store.writing("b") as _:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))


def test_a_full_local_disk_under_an_object_store_call_is_not_retried():
    """The store answered; this machine's disk is full: retrying cannot help, and the caller that
    knows the local directory says it (`test_objectstore.py`: a fetch into a full cache)."""
    calls = []

    def download():
        calls.append(1)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        StoreCall("s3://bucket/run", timeout_s=60)("fetching version_dir", download)
    assert calls == [1]
