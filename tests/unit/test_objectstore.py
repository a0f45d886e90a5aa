"""The object store against a real S3-compatible server (moto's, as its own process)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import pytest

from shared.diskspace import DiskFull
from shared.errors import TriadError, WaitTimeout
from shared.objectstore import ObjectStore
from shared.rundir import RunDir, pull_step_dir
from shared.storage import open_store
from shared.tmpname import TMP_PREFIX
from tests.helpers import small_disk
from tests.s3 import MotoServer

BUCKET = "triad-unit"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    server.create_bucket(BUCKET)
    yield server
    server.close()


@pytest.fixture
def moto_env(moto, monkeypatch):
    """The AWS variables that point the SDK at the moto server."""
    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    return moto


@pytest.fixture
def store(moto_env, tmp_path, request):
    return ObjectStore(f"s3://{BUCKET}/{request.node.name}", tmp_path / "cache", timeout_s=20)


def test_an_s3_run_dir_opens_an_object_store_and_a_path_a_local_one(store, tmp_path):
    assert isinstance(open_store(f"s3://{BUCKET}/x", tmp_path), ObjectStore)
    assert RunDir(tmp_path).store.__class__.__name__ == "LocalStore"
    for bad in ("s3://", "s3://b/../x"):
        with pytest.raises(TriadError, match="s3://bucket/prefix"):
            ObjectStore(bad, tmp_path)


def test_keys_round_trip_list_size_and_remove(store):
    assert store.read_bytes("a/b.txt") is None
    store.write_bytes("a/b.txt", b"hello")
    store.write_bytes("a/sub/c.bin", b"12345678")
    assert store.read_bytes("a/b.txt") == b"hello"
    assert store.exists("a/b.txt") and store.exists("a") and not store.exists("zz")
    assert store.children("a") == ["sub"] and store.children("a", dirs=False) == ["b.txt"]
    assert store.children("missing") == []
    assert store.size("a/b.txt") == 5 and store.size("a") == 13
    store.remove("a/sub")
    assert store.children("a") == [] and store.read_bytes("a/sub/c.bin") is None
    store.remove("a/b.txt")
    store.remove("never/there")
    assert not store.exists("a/b.txt")


class LosesTheRace:
    """The store's filesystem, with another process deleting a file right after each lookup."""

    def __init__(self, fs, other) -> None:
        self.fs, self.other = fs, other

    def get_file_info(self, path):
        info = self.fs.get_file_info(path)
        self.other.delete_file(path)
        return info

    def __getattr__(self, name):
        return getattr(self.fs, name)


def test_a_key_another_process_removes_between_lookup_and_delete_is_gone_not_an_error(store, tmp_path):
    """An orchestrator discarding batches while something else removes the same marker."""
    store.write_bytes("step/marker", b"{}")
    other = ObjectStore(store.url, tmp_path / "other", timeout_s=20)
    store.fs = LosesTheRace(store.fs, other.fs)
    store.remove("step/marker")
    store.fs = store.fs.fs
    assert store.read_bytes("step/marker") is None


def test_append_rewrites_the_object_and_create_once_keeps_the_first(store):
    store.append("m.jsonl", b"1\n")
    store.append("m.jsonl", b"2\n")
    assert store.read_bytes("m.jsonl") == b"1\n2\n"
    assert store.create_once("record.json", b"first", settle_s=0.1)
    assert not store.create_once("record.json", b"second", settle_s=0.1)
    assert store.read_bytes("record.json") == b"first"


def test_writers_upload_on_success_only_and_keep_nothing_local(store):
    with store.writing("w/file.bin") as tmp:
        tmp.write_bytes(b"x" * 1000)
    assert store.size("w/file.bin") == 1000
    with pytest.raises(RuntimeError), store.writing("w/failed.bin") as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("writer died")
    assert not store.exists("w/failed.bin")
    with store.writing_dir("w/dir") as d:
        (d / "nested").mkdir()
        (d / "nested" / "n.txt").write_text("n")
        (d / "top.txt").write_text("top")
    assert (
        store.children("w/dir", dirs=False) == ["top.txt"] and store.read_bytes("w/dir/nested/n.txt") == b"n"
    )
    assert not any(p.is_file() for p in store.local_path("").rglob("*"))


def test_a_step_is_trusted_only_with_its_marker_and_pulled_marker_last(store):
    rundir = RunDir(f"s3://{BUCKET}/steps", store)
    run_id = rundir.ensure_run({}).run_id
    with rundir.writing_tensors(3) as tmp:
        tmp.write_bytes(b"t" * 64)
    assert rundir.weights.marker(3, run_id) is None and rundir.weights.newest(run_id) == 0
    relative, half = pull_step_dir(rundir, rundir.weights.relative(3))
    assert not RunDir.has_marker_at(half)  # a copy without the marker is never trusted
    marker = rundir.weights.write_marker(3, run_id, version=3, bytes=64, files=True)
    assert rundir.weights.newest(run_id) == 3
    relative, path = pull_step_dir(rundir, relative)
    assert RunDir.marker_at(path) == marker and RunDir.payload_bytes_at(path) == 64
    assert relative == rundir.weights.relative(3) and path == rundir.root / relative
    rundir.store.drop_local(relative)
    assert not path.exists()
    rundir.weights.clear(3)
    assert rundir.weights.steps() == [] and rundir.weights.marker(3, run_id) is None
    for bad in ("../other", "/etc", ""):
        with pytest.raises(TriadError, match="outside the run directory"):
            pull_step_dir(rundir, bad)


def test_metrics_live_in_the_store(store):
    rundir = RunDir(f"s3://{BUCKET}/metrics", store)
    writer = rundir.metrics.writer("trainer")
    for step in (1, 2, 3):
        writer.log(step, loss=step / 10)
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == [1, 2, 3]
    assert rundir.metrics.drop_after("trainer", 1) == 2
    rundir.metrics.writer("trainer").log(2, loss=0.0)
    assert [(r["step"], r["loss"]) for r in rundir.metrics.rows("trainer")] == [(1, 0.1), (2, 0.0)]
    assert json.loads(store.read_bytes(rundir.metrics.key("trainer")).splitlines()[0])["step"] == 1


def test_a_metrics_writer_reads_its_part_at_its_first_row_only(store, monkeypatch):
    """Each row rewrites the writer's part: from the writer's own copy after the first row (a
    GET a row saved, ~30 ms each from moto here; the trainer's and a server's rows are on the
    step's and the hand-off's path)."""
    rundir = RunDir(f"s3://{BUCKET}/one-read", store)
    monkeypatch.setattr(rundir.metrics, "PART_ROWS", 2)
    rundir.metrics.writer("trainer").log(1, loss=0.1)  # an earlier process's row
    reads: list[str] = []
    read_bytes = store.read_bytes
    monkeypatch.setattr(store, "read_bytes", lambda key: reads.append(key) or read_bytes(key))
    writer = rundir.metrics.writer("trainer")
    for step in (2, 3, 4, 5):
        writer.log(step, loss=step / 10)
    assert reads == [rundir.metrics.key("trainer")]  # its part, once
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == [1, 2, 3, 4, 5]
    assert [part for _, part, _ in rundir.metrics.files("trainer")] == [0, 1, 2]


def test_metrics_of_several_servers_rotate_into_parts_and_merge(store, monkeypatch):
    rundir = RunDir(f"s3://{BUCKET}/parts", store)
    monkeypatch.setattr(rundir.metrics, "PART_ROWS", 2)
    a, b = rundir.metrics.writer("inference", "aaa1"), rundir.metrics.writer("inference", "bbb2")
    for version in range(5):
        a.log(version, version=version)
    b.log(4, version=4)
    assert [k.split("/")[-1] for _, _, k in rundir.metrics.files("inference")] == [
        "inference-aaa1.jsonl",
        "inference-aaa1.00001.jsonl",
        "inference-aaa1.00002.jsonl",
        "inference-bbb2.jsonl",
    ]
    rows = rundir.metrics.rows("inference")
    assert [(r["server"], r["version"]) for r in rows] == [("aaa1", v) for v in range(5)] + [("bbb2", 4)]
    # a restarted writer continues the last part; a rewind drops rows and the parts it empties
    assert rundir.metrics.drop_after("inference", 1) == 4
    assert len(rundir.metrics.files("inference")) == 2
    again = rundir.metrics.writer("inference", "aaa1")
    again.log(2, version=2)
    again.log(3, version=3)
    assert [r["version"] for r in rundir.metrics.rows("inference") if r["server"] == "aaa1"] == [0, 1, 2, 3]
    # aaa1's part 0 was full: the new rows began part 1; bbb2's part 0 is left empty
    assert [f[:2] for f in rundir.metrics.files("inference")] == [("aaa1", 0), ("aaa1", 1), ("bbb2", 0)]


def test_create_once_is_a_conditional_put_so_one_racer_wins(store):
    from concurrent.futures import ThreadPoolExecutor

    bodies = [f"writer {i}".encode() for i in range(4)]
    with ThreadPoolExecutor(4) as pool:  # settle_s=30: the write-wait-read fallback would show
        won = list(pool.map(lambda body: store.create_once("race.json", body, settle_s=30), bodies))
    assert won.count(True) == 1, won
    assert store.read_bytes("race.json") == bodies[won.index(True)]


def test_without_a_conditional_put_create_once_falls_back_logged(store, monkeypatch, caplog):
    import sys

    import boto3
    from botocore.exceptions import ClientError

    import shared.storecall as objectstore

    class Refusing:
        def put_object(self, **kw):
            raise ClientError({"Error": {"Code": "NotImplemented", "Message": "no"}}, "PutObject")

    monkeypatch.setattr(objectstore, "_no_conditional_put", set())
    caplog.set_level(logging.WARNING, logger="triad.store")
    monkeypatch.setattr(boto3, "client", lambda *a, **kw: Refusing())
    assert store.create_once("refused.json", b"a", settle_s=0.1)
    assert not store.create_once("refused.json", b"b", settle_s=0.1)
    assert "no conditional create (the store refused If-None-Match (NotImplemented))" in caplog.text
    monkeypatch.setitem(sys.modules, "boto3", None)  # not installed
    assert store.create_once("no-boto.json", b"a", settle_s=0.1)
    assert "no conditional create (boto3 is not installed)" in caplog.text


def test_an_outage_is_waited_out_with_a_log_naming_the_url(moto_env, tmp_path, caplog):
    moto = moto_env
    store = ObjectStore(f"s3://{BUCKET}/outage", tmp_path, timeout_s=20, stall_s=1)
    store.write_bytes("o.txt", b"before")
    caplog.set_level(logging.WARNING, logger="triad.store")
    with moto.stopped():
        threading.Timer(3.0, lambda: moto.proc.send_signal(signal.SIGCONT)).start()
        started = time.monotonic()
        assert store.read_bytes("o.txt") == b"before"
    assert time.monotonic() - started >= 2.5
    assert f"waiting for object store {store.url} (reading o.txt" in caplog.text


def test_an_outage_longer_than_the_timeout_is_an_error_naming_the_url(moto_env, tmp_path):
    moto = moto_env
    store = ObjectStore(f"s3://{BUCKET}/short", tmp_path, timeout_s=2, stall_s=1)
    with moto.stopped(), pytest.raises(WaitTimeout, match=rf"waiting for object store s3://{BUCKET}/short"):
        store.write_bytes("x", b"1")


def test_a_missing_bucket_is_an_error_at_once(store, moto, tmp_path):
    missing = ObjectStore("s3://no-such-bucket/run", tmp_path, timeout_s=60)
    started = time.monotonic()
    expected = r"^run directory s3://no-such-bucket/run at http\S+ is not writable: AWS Error NO_SUCH_BUCKET"
    with pytest.raises(TriadError, match=expected):
        missing.check_writable()
    with pytest.raises(TriadError, match="object store s3://no-such-bucket/run: writing k failed"):
        missing.write_bytes("k", b"")
    assert time.monotonic() - started < 5


def test_an_unreachable_endpoint_is_an_error_at_start_up(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(
        TriadError, match=r"run directory s3://b/run at http://127.0.0.1:9 is not writable: .*connect"
    ):
        ObjectStore("s3://b/run", tmp_path).check_writable()


def test_wrong_credentials_are_an_error_at_start_up(tmp_path, monkeypatch):
    server = MotoServer(tmp_path / "moto-auth.log", auth=True)
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(
            TriadError, match=r"s3://b/run at http\S+ is not writable: AWS Error INVALID_ACCESS_KEY_ID"
        ):
            ObjectStore("s3://b/run", tmp_path).check_writable()
    finally:
        server.close()


def test_sglang_which_reads_paths_on_its_own_disk_refuses_an_object_store():
    from orchestrator.servers.backends.sglang import SGLangUpdate

    with pytest.raises(
        TriadError, match="backend 'sglang' needs a mounted run_dir, not the object store s3://b/r"
    ):
        SGLangUpdate(None, "s3://b/r", 1.0)


def test_triad_up_progress_follows_metrics_in_the_store(store):
    from services.progress import StoreTail, tail_of

    rundir = RunDir(f"s3://{BUCKET}/progress", store)
    tail = tail_of(rundir, "trainer")
    assert isinstance(tail, StoreTail) and tail.read() == []
    writer = rundir.metrics.writer("trainer")
    for step in (1, 2):
        writer.log(step, lineage="first")
    assert [r["step"] for r in tail.read()] == [1, 2]
    rundir.metrics.drop_after("trainer", 1)  # a resumed trainer: its own step 2 comes next
    rundir.metrics.writer("trainer").log(2, lineage="resumed")
    assert [(r["step"], r["lineage"]) for r in tail.read()] == [(2, "resumed")]
    assert tail.read() == []


def test_triad_up_progress_reads_each_writers_newest_parts_only(store, monkeypatch):
    """A long run's metrics grow a part every 500 rows, and `triad up` polls them twice a second:
    a poll reads each writer's last part and those begun since the poll before (a day of steps
    is dozens of parts a service, each a GET), never a full part again; a rewound writer's
    part is read again."""
    from services.progress import tail_of

    rundir = RunDir(f"s3://{BUCKET}/long-tail", store)
    monkeypatch.setattr(rundir.metrics, "PART_ROWS", 2)
    tail = tail_of(rundir, "inference")
    a, b = rundir.metrics.writer("inference", "aaa1"), rundir.metrics.writer("inference", "bbb2")
    for version in range(1, 8):  # aaa1's parts 0-3
        a.log(version, version=version)
    b.log(7, version=7)
    assert [(r["server"], r["version"]) for r in tail.read()] == [("aaa1", v) for v in range(1, 8)] + [
        ("bbb2", 7)
    ]
    reads: list[str] = []
    read_bytes = store.read_bytes
    monkeypatch.setattr(
        store, "read_bytes", lambda key: reads.append(key.rsplit("/", 1)[-1]) or read_bytes(key)
    )
    a.log(8, version=8)  # fills part 3
    a.log(9, version=9)  # begins part 4
    assert [(r["server"], r["version"]) for r in tail.read()] == [("aaa1", 8), ("aaa1", 9)]
    assert sorted(reads) == [
        "inference-aaa1.00003.jsonl",
        "inference-aaa1.00004.jsonl",
        "inference-bbb2.jsonl",
    ]
    reads.clear()
    assert tail.read() == [] and sorted(reads) == ["inference-aaa1.00004.jsonl", "inference-bbb2.jsonl"]
    rundir.metrics.drop_after("inference", 3)  # rewound: aaa1 is left parts 0 and 1 (rows 1-3)
    rundir.metrics.writer("inference", "aaa1").log(4, version=4, lineage="resumed")
    assert [(r["version"], r.get("lineage")) for r in tail.read()] == [(4, "resumed")]


def test_a_request_that_hangs_is_named_while_it_hangs(moto_env, tmp_path, caplog):
    """A stopped store may hold a request open without failing it: the wait is logged anyway."""
    moto = moto_env
    store = ObjectStore(f"s3://{BUCKET}/hang", tmp_path, timeout_s=60, stall_s=60)
    store.write_bytes("h.txt", b"held")
    caplog.set_level(logging.WARNING, logger="triad.store")
    with moto.stopped():
        threading.Timer(7.0, lambda: moto.proc.send_signal(signal.SIGCONT)).start()
        assert store.read_bytes("h.txt") == b"held"
    assert f"waiting for object store {store.url} (reading h.txt): not done after" in caplog.text


class VanishingSource:
    """The store's filesystem, but the source of a copy is removed (pruned) just before the copy."""

    def __init__(self, fs) -> None:
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def copy_file(self, source: str, dest: str) -> None:
        self.fs.delete_file(source)
        self.fs.copy_file(source, dest)


def test_a_copy_whose_source_is_pruned_after_the_lookup_answers_false(store):
    store.write_bytes("w/1/config.json", b"{}")
    store.fs = VanishingSource(store.fs)
    assert store.copy("w/1/config.json", "w/2/config.json") is False
    assert not store.exists("w/2/config.json")


def test_a_directory_travels_in_one_threaded_copy_each_way_marker_last(store, monkeypatch):
    import pyarrow.fs as pafs

    calls = []
    real = pafs.copy_files

    def spy(source, destination, **kw):
        calls.append(kw.get("use_threads"))
        return real(source, destination, **kw)

    monkeypatch.setattr(pafs, "copy_files", spy)
    files = {f"part-{i:02d}.bin": bytes([i]) * (1000 + i) for i in range(12)}
    with store.writing_dir("d/step") as directory:
        for name, data in files.items():
            (directory / name).write_bytes(data)
    assert calls == [True]  # one call for twelve files, threaded
    store.write_bytes("d/step/marker.json", b"marker")
    store.drop_local("d/step")
    copy = store.fetch("d/step", last="marker.json")
    assert calls == [True, True]
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.name != "marker.json"} == files
    assert (copy / "marker.json").read_bytes() == b"marker"


def test_metadata_copies_in_a_bucket_are_whole_or_none(store):
    """The metadata files of a version are copied server-side all at once; one missing source
    leaves none of the others behind."""
    from shared.rundir.steps import Steps

    weights = Steps(store, "some-kind")
    names = [f"file{i}.json" for i in range(6)]
    for name in names:
        store.write_bytes(weights.key(1, name), name.encode())
    assert weights.copy_files(1, 2, names) is True
    assert {n: store.read_bytes(weights.key(2, n)) for n in names} == {n: n.encode() for n in names}
    assert weights.copy_files(1, 3, [*names[:3], "missing.json", *names[3:]]) is False
    assert store.children(weights.key(3), dirs=False) == []
    assert weights.copy_files(1, 4, []) is True


def test_one_process_dropping_its_copy_keeps_it_for_another_that_fetched_it(store, monkeypatch):
    """Two servers on one machine share the cache: the copy one drops stays while the other (alive)
    holds it, and goes once no live process does."""
    import subprocess
    import sys

    from shared import objectcache
    from shared.tmpname import this_host

    with store.writing_dir("w/5") as d:
        (d / "tensors.bin").write_bytes(b"w" * 256)
    store.write_bytes("w/5/marker.json", b"marker")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        mine = objectcache.owner_tag
        monkeypatch.setattr(objectcache, "owner_tag", lambda: f"{other.pid}@{this_host()}")
        theirs = store.fetch("w/5", last="marker.json")  # the other server's load
        monkeypatch.setattr(objectcache, "owner_tag", mine)
        copy = store.fetch("w/5", last="marker.json")  # this server finds it whole
        assert copy == theirs
        store.drop_local("w/5")  # this server moves on to the next version
        assert (copy / "tensors.bin").read_bytes() == b"w" * 256
    finally:
        other.kill()
        other.wait()
    store.fetch("w/5", last="marker.json")
    store.drop_local("w/5")  # the other is gone: its lease no longer holds the copy
    assert not copy.exists()
    assert [p.name for p in copy.parent.iterdir() if "lease" in p.name] == [
        f".tmp-{other.pid}@{this_host()}-lease-5"  # swept at the next start (sweep_dead_tmp)
    ]
    assert store.sweep() == [copy.parent / f".tmp-{other.pid}@{this_host()}-lease-5"]


def test_the_copy_a_killed_server_served_goes_at_the_next_start_and_a_living_ones_stays(store, monkeypatch):
    """A server killed while it serves a version never drops its copy: the sweep at the next
    start removes its lease and the copy with it, unless a living process also holds the copy."""
    import subprocess
    import sys

    from shared import objectcache
    from shared.tmpname import this_host

    for key in ("w/6", "w/7"):
        with store.writing_dir(key) as d:
            (d / "tensors.bin").write_bytes(b"w" * 256)
        store.write_bytes(f"{key}/marker.json", b"marker")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    mine = objectcache.owner_tag
    monkeypatch.setattr(objectcache, "owner_tag", lambda: f"{killed.pid}@{this_host()}")
    served = store.fetch("w/6", last="marker.json")
    shared = store.fetch("w/7", last="marker.json")
    monkeypatch.setattr(objectcache, "owner_tag", mine)
    assert store.fetch("w/7", last="marker.json") == shared  # this living process holds it too
    killed.kill()
    killed.wait()
    lease = f".tmp-{killed.pid}@{this_host()}-lease-"
    assert sorted(store.sweep()) == sorted([served.parent / f"{lease}6", served.parent / f"{lease}7", served])
    assert not served.exists() and (shared / "tensors.bin").read_bytes() == b"w" * 256


def test_scratch_names_carry_this_machines_name(store):
    import os

    from shared.tmpname import this_host

    with store.writing_dir("w/scratch") as d:
        assert d.name.startswith(f".tmp-{os.getpid()}@{this_host()}-write-")


def test_a_fetch_into_a_full_cache_is_one_line_naming_the_cache(moto_env, tmp_path):
    """A version bigger than the disk under this machine's cache: one line naming the cache's
    directory and TRIAD_CACHE, nothing of the copy left behind, and not retried."""
    writer = ObjectStore(f"s3://{BUCKET}/full-cache", tmp_path / "writer-cache", timeout_s=20)
    writer.write_bytes("version_dir/tensors.bin", os.urandom(512 * 1024))
    with small_disk(tmp_path / "disk", "256k") as disk:
        reader = ObjectStore(f"s3://{BUCKET}/full-cache", disk / "cache", timeout_s=20)
        with pytest.raises(DiskFull) as caught:
            reader.fetch("version_dir")
        text = str(caught.value)
        assert "\n" not in text
        where = disk / "cache" / BUCKET / "full-cache"
        assert f"no space left on the disk of {where} while writing a copy of version_dir" in text
        assert "TRIAD_CACHE" in text
        left = [p.name for p in where.iterdir() if p.name != f"{TMP_PREFIX}lock"]  # the cache's lock stays
        assert left == []  # neither the copy nor its staging directory


def test_a_lease_whose_conditional_create_lost_its_reply_still_acquires_and_renews(store, monkeypatch):
    """The conditional PUT of a lease's record succeeds on the store, but its reply is lost (a
    read timeout): the store call retries it and is told the record exists. Taken for another
    holder's, our own record refused us the role at start ("another trainer holds this run
    directory (host <us>, pid <us>)"), and a renewal after it was removed stopped the process;
    another's record is still refused."""
    from shared import objectstore
    from shared.liveness import Lease, Progress, parse_record
    from shared.rundir import TRAINER

    real = objectstore.put_if_absent

    def reply_lost(base: str, key: str, data: bytes) -> bool | None:
        created = real(base, key, data)
        if created and key == live.key(TRAINER):
            raise OSError("Read timeout on endpoint URL")  # what botocore's lost reply becomes
        return created

    monkeypatch.setattr(objectstore, "put_if_absent", reply_lost)
    live = RunDir(f"s3://{BUCKET}/lease", store).live
    lease = Lease(live, TRAINER, Progress())
    lease.acquire()
    assert lease.renew()
    live.remove(TRAINER)  # by hand, under the holder: ours again on the next renewal
    assert lease.renew() and lease.ours(parse_record(live.read(TRAINER), "here"))
    with pytest.raises(TriadError, match="another trainer holds this run directory"):
        Lease(live, TRAINER, Progress()).acquire()
