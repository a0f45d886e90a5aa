"""A run directory in an S3-compatible object store, through `pyarrow.fs.S3FileSystem`.

`run_dir = "s3://bucket/prefix"`. The endpoint comes from `AWS_ENDPOINT_URL_S3` or
`AWS_ENDPOINT_URL` (read here: pyarrow's constructor does not look at them); credentials
and region from the AWS SDK's default chain, which pyarrow uses: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, `AWS_DEFAULT_REGION`/`AWS_REGION`,
`~/.aws/credentials` and `~/.aws/config`.

Every object is written whole (one PUT, or a multipart upload completed at once), so a
reader sees the old object, the new one or none; nothing needs a temporary name. Writers
that need a real path write into a private local directory that is uploaded, then deleted,
on success. Readers that need a real path (weights for inference, a checkpoint to resume
from) `fetch` a copy into the cache, which they drop when done. Both move a directory's
objects concurrently (`shared/objectcache.py`).

Every call (`shared/storecall.py`) is retried with backoff until `timeout_s` has passed,
logging what it waits for and the URL; an answer that retrying cannot change (no such
bucket, refused credentials) is an error at once.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs

from shared.errors import TriadError
from shared.objectcache import CacheTransfers
from shared.storecall import CONNECT_TIMEOUT_S, STALL_TIMEOUT_S, StoreCall, endpoint, put_if_absent, short
from shared.tmpname import TMP_PREFIX

SCHEME = "s3://"


def is_object_url(root: str | os.PathLike) -> bool:
    return str(root).startswith(SCHEME)


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; TriadError naming the URL if it has no bucket."""
    rest = url.removeprefix(SCHEME).strip("/")
    bucket, _, prefix = rest.partition("/")
    if not bucket or ".." in PurePosixPath(prefix).parts:
        raise TriadError(f"run_dir {url!r} is not an object-store URL of the form s3://bucket/prefix")
    return bucket, prefix


def remove_path(fs: pafs.FileSystem, path: str) -> None:
    info = fs.get_file_info(path)
    try:
        if info.type == pafs.FileType.File:
            fs.delete_file(path)
        elif info.type == pafs.FileType.Directory:
            fs.delete_dir(path)
    except FileNotFoundError:
        pass  # removed by another process since the lookup


class ObjectStore(CacheTransfers):
    """A run directory under `s3://bucket/prefix`: its keys here, the local copies of its
    directories in `CacheTransfers`; see the module docstring."""

    poll_floor_s = 0.1  # each look at a marker is an HTTP round trip

    def __init__(
        self, url: str, cache_dir: Path, timeout_s: float = 300.0, stall_s: float = STALL_TIMEOUT_S
    ) -> None:
        bucket, prefix = parse_url(url)
        self.url = f"{SCHEME}{bucket}/{prefix}".rstrip("/")
        self.base = f"{bucket}/{prefix}".rstrip("/")
        self.cache = Path(cache_dir) / bucket / prefix
        self.call = StoreCall(self.url, timeout_s)
        self.fs = pafs.S3FileSystem(
            endpoint_override=endpoint(),
            connect_timeout=CONNECT_TIMEOUT_S,
            request_timeout=stall_s,  # the SDK's stall limit: a request that moves no data for that long
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
        self.local = pafs.LocalFileSystem()

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def read_bytes(self, key: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                with self.fs.open_input_stream(self.path(key)) as f:
                    return f.read()
            except FileNotFoundError:
                return None

        return self.call(f"reading {key}", read)

    def write_bytes(self, key: str, data: bytes) -> None:
        def write() -> None:
            with self.fs.open_output_stream(self.path(key)) as f:
                f.write(data)

        self.call(f"writing {key}", write)

    def copy(self, source: str, key: str) -> bool:
        """Copy object `source` to `key` inside the store (a server-side copy); False if
        `source` does not exist."""
        if not self.exists(source):
            return False
        try:
            self.call(
                f"copying {source} to {key}", lambda: self.fs.copy_file(self.path(source), self.path(key))
            )
        except FileNotFoundError:
            return False  # removed (pruned) between the lookup and the copy
        return True

    def append(self, key: str, data: bytes) -> None:
        """Append by rewriting the whole object: for small, single-writer objects (metrics)."""
        self.write_bytes(key, (self.read_bytes(key) or b"") + data)

    def create_once(self, key: str, data: bytes, settle_s: float = 1.0) -> bool:
        """Write `key` unless it exists; whether this call wrote it. A conditional PUT
        (`If-None-Match: *`, through boto3: pyarrow cannot send it) lets exactly one of
        racing writers win. Where that is not available (no boto3, or a store that refuses
        the header; logged), writers that both saw no object both write, and after
        `settle_s` all of them read the same (last) one."""
        created = self.call(f"creating {key} if absent", lambda: put_if_absent(self.base, key, data))
        if created is not None:
            return created
        if self.exists(key):
            return False
        self.write_bytes(key, data)
        time.sleep(settle_s)
        return self.read_bytes(key) == data

    def _infos(self, key: str, recursive: bool) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.path(key), allow_not_found=True, recursive=recursive)
        return self.call(f"listing {key or '/'}", lambda: self.fs.get_file_info(selector))

    def exists(self, key: str) -> bool:
        info = self.call(f"looking up {key}", lambda: self.fs.get_file_info(self.path(key)))
        return info.type != pafs.FileType.NotFound

    def children(self, key: str, dirs: bool = True) -> list[str]:
        wanted = pafs.FileType.Directory if dirs else pafs.FileType.File
        return sorted(i.base_name for i in self._infos(key, recursive=False) if i.type == wanted)

    def size(self, key: str) -> int:
        info = self.call(f"looking up {key}", lambda: self.fs.get_file_info(self.path(key)))
        if info.type == pafs.FileType.File:
            return info.size
        return sum(i.size for i in self._infos(key, recursive=True) if i.type == pafs.FileType.File)

    def remove(self, key: str) -> None:
        """Gone afterwards, as `LocalStore.remove`: a key already missing, or removed by another
        process between the lookup and the delete, is no error."""
        self.call(f"removing {key}", lambda: remove_path(self.fs, self.path(key)))

    def flush(self, key: str) -> None:
        """Nothing to do: an object is durable once its upload completed."""

    def check_writable(self) -> None:
        """Write and delete a probe object once, without retrying: a bad bucket, refused
        credentials or an unreachable endpoint fail at start-up, naming the URL."""
        probe = self.path(f"{TMP_PREFIX}probe-{uuid.uuid4().hex}")
        try:
            with self.fs.open_output_stream(probe) as f:
                f.write(b"")
            self.fs.delete_file(probe)
        except OSError as e:
            where = f" at {endpoint()}" if endpoint() else ""
            raise TriadError(f"run directory {self.url}{where} is not writable: {short(e)}") from None

    def watch(self, key: str) -> None:
        """None: an object store sends no events, its waits poll."""
