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
from) `fetch` a copy into the cache, which they drop when done.

Every call is retried with backoff until `timeout_s` has passed, logging what it waits for
and the URL; an answer that retrying cannot change (no such bucket, refused credentials) is
an error at once.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TypeVar

import pyarrow.fs as pafs

from shared.errors import TriadError, WaitTimeout
from shared.storage import TMP_PREFIX

SCHEME = "s3://"
ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
PERMANENT = ("NO_SUCH_BUCKET", "ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH",
             "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")  # fmt: skip
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.2, 5.0
CONNECT_TIMEOUT_S, STALL_TIMEOUT_S = 3.0, 5.0
LOG_EVERY_S = 5.0
T = TypeVar("T")
log = logging.getLogger("triad.store")


def is_object_url(root: str | os.PathLike) -> bool:
    return str(root).startswith(SCHEME)


def endpoint() -> str | None:
    return next((os.environ[v] for v in ENDPOINT_VARS if os.environ.get(v)), None)


def short(error: BaseException) -> str:
    """The first line of a pyarrow/AWS error, without the request id."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = text[text.find("AWS Error") :] if "AWS Error" in text else text
    return text.split(" (Request ID")[0]


class StallWatch:
    """One daemon thread that logs every store call in flight for longer than LOG_EVERY_S, so a
    store that stops answering is named while a request hangs, not only once it fails."""

    def __init__(self) -> None:
        self.calls: dict[int, list] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def begin(self, url: str, what: str) -> int:
        token = threading.get_ident() ^ id(what) ^ time.monotonic_ns()
        now = time.monotonic()
        with self.lock:
            self.calls[token] = [url, what, now, now]
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, name="store-stall-watch", daemon=True)
                self.thread.start()
        return token

    def end(self, token: int) -> None:
        with self.lock:
            self.calls.pop(token, None)

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            with self.lock:
                stalled = [c for c in self.calls.values() if now - c[3] >= LOG_EVERY_S]
                for call in stalled:
                    call[3] = now
            for url, what, start, _ in stalled:
                log.warning("waiting for object store %s (%s): no answer for %.0f s", url, what, now - start)


WATCH = StallWatch()


class StoreCall:
    """Retry one store operation with backoff until a deadline, saying what it waits for."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s

    def __call__(self, what: str, fn: Callable[[], T]) -> T:
        token = WATCH.begin(self.url, what)
        try:
            return self.retrying(what, fn)
        finally:
            WATCH.end(token)

    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        start, last_log = time.monotonic(), None
        delay = FIRST_BACKOFF_S
        while True:
            try:
                return fn()
            except FileNotFoundError:
                raise
            except OSError as e:
                if any(p in str(e) for p in PERMANENT):
                    raise TriadError(f"object store {self.url}: {what} failed: {short(e)}") from None
                waited = time.monotonic() - start
                if waited >= self.timeout_s:
                    raise WaitTimeout(
                        f"gave up after {self.timeout_s:.0f} s waiting for object store {self.url} "
                        f"({what}): {short(e)}"
                    ) from None
                if last_log is None or time.monotonic() - last_log >= LOG_EVERY_S:
                    last_log = time.monotonic()
                    log.warning("waiting for object store %s (%s, %.0f s of %.0f s): %s",
                                self.url, what, waited, self.timeout_s, short(e))  # fmt: skip
                time.sleep(min(delay, max(self.timeout_s - waited, 0.0)))
                delay = min(delay * 2, MAX_BACKOFF_S)


_no_conditional_put: set[str] = set()  # endpoints (or "boto3") told of once


def put_if_absent(base: str, key: str, data: bytes) -> bool | None:
    """PUT `base/key` with `If-None-Match: *`: True if created, False if it exists, None if
    that cannot be done here (no boto3, or the store refuses the header). Connection
    errors are OSErrors, so `StoreCall` retries them."""
    try:
        import boto3
        import botocore.exceptions as bce
    except ImportError:
        return _fallback("boto3", "boto3 is not installed")
    bucket, _, prefix = base.partition("/")
    from botocore.config import Config

    limits = Config(
        connect_timeout=CONNECT_TIMEOUT_S, read_timeout=STALL_TIMEOUT_S, retries={"max_attempts": 1}
    )
    client = boto3.client("s3", endpoint_url=endpoint(), config=limits)
    try:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}".lstrip("/"), Body=data, IfNoneMatch="*")
    except bce.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
            return False
        if code in ("NotImplemented", "InvalidArgument", "InvalidRequest", "501", "400"):
            return _fallback(endpoint() or "s3", f"the store refused If-None-Match ({code})")
        raise OSError(f"AWS Error {code}: {e}") from None
    except (bce.BotoCoreError, ValueError) as e:
        raise OSError(str(e)) from None
    return True


def _fallback(where: str, why: str) -> None:
    if where not in _no_conditional_put:
        _no_conditional_put.add(where)
        log.warning("no conditional create (%s): creating objects once by write, wait and read back", why)
    return None


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; TriadError naming the URL if it has no bucket."""
    rest = url.removeprefix(SCHEME).strip("/")
    bucket, _, prefix = rest.partition("/")
    if not bucket or ".." in PurePosixPath(prefix).parts:
        raise TriadError(f"run_dir {url!r} is not an object-store URL of the form s3://bucket/prefix")
    return bucket, prefix


def sweep_dead_tmp(cache: Path) -> list[Path]:
    """Remove the `.tmp-<pid>-...` directories under `cache` whose process (on this machine)
    is gone: a writer or fetcher killed mid-way leaves them behind. Those of live processes
    stay. Returns what was removed."""
    swept = []
    for tmp in sorted(cache.rglob(f"{TMP_PREFIX}*")) if cache.is_dir() else []:
        pid = tmp.name.removeprefix(TMP_PREFIX).split("-")[0]
        if tmp.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            swept.append(tmp)
    if swept:
        log.info("swept %d directories of dead processes from the cache %s", len(swept), cache)
    return swept


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_path(fs: pafs.FileSystem, path: str) -> None:
    info = fs.get_file_info(path)
    try:
        if info.type == pafs.FileType.File:
            fs.delete_file(path)
        elif info.type == pafs.FileType.Directory:
            fs.delete_dir(path)
    except FileNotFoundError:
        pass  # removed by another process since the lookup


class ObjectStore:
    """A run directory under `s3://bucket/prefix`; see the module docstring."""

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

    def path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def local_path(self, key: str) -> Path:
        """Where this machine keeps its copy of `key` (see `fetch`); for local-only outputs too."""
        return self.cache / key if key else self.cache

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
        self.call(f"copying {source} to {key}", lambda: self.fs.copy_file(self.path(source), self.path(key)))
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

    @contextmanager
    def writing(self, key: str) -> Iterator[Path]:
        with self._scratch() as scratch:
            tmp = scratch / PurePosixPath(key).name
            yield tmp
            self._upload(tmp, key)

    @contextmanager
    def writing_dir(self, key: str) -> Iterator[Path]:
        """A private local directory; every file in it is uploaded under `key` on success."""
        with self._scratch() as scratch:
            yield scratch
            for file in sorted(p for p in scratch.rglob("*") if p.is_file()):
                self._upload(file, f"{key}/{file.relative_to(scratch).as_posix()}")

    @contextmanager
    def _scratch(self) -> Iterator[Path]:
        self.cache.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-write-", dir=self.cache))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _upload(self, file: Path, key: str) -> None:
        self.call(
            f"uploading {key}",
            lambda: pafs.copy_files(
                str(file), self.path(key), source_filesystem=self.local, destination_filesystem=self.fs
            ),  # fmt: skip
        )

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

    def fetch(self, key: str, last: str | None = None) -> Path:
        """A local copy of everything under `key` (a directory), in the cache. `last` (a marker)
        is read first and written last, so a copy that has it is whole and matches it."""
        target = self.local_path(key)
        marker = self.read_bytes(f"{key}/{last}") if last else None
        if marker is not None and (target / last).is_file() and (target / last).read_bytes() == marker:
            return target  # whole already (its marker came last): another process on this machine fetched it
        files = [i for i in self._infos(key, recursive=True) if i.type == pafs.FileType.File]
        staging = target.parent / f"{TMP_PREFIX}{os.getpid()}-fetch-{uuid.uuid4().hex}"
        try:
            for info in files:
                relative = info.path.removeprefix(self.path(key) + "/")
                if PurePosixPath(relative).is_absolute() or ".." in PurePosixPath(relative).parts:
                    raise TriadError(f"object store {self.url}: refusing key {info.path!r} (it leaves {key})")
                if relative == last or PurePosixPath(relative).name.startswith(TMP_PREFIX):
                    continue
                (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                self._download(info.path, staging / relative)
            staging.mkdir(parents=True, exist_ok=True)
            if marker is not None:
                (staging / last).write_bytes(marker)
            shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(staging, target)
            except OSError:  # another process on this machine fetched the same copy first
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def _download(self, source: str, dest: Path) -> None:
        self.call(
            f"downloading {source.removeprefix(self.base + '/')}",
            lambda: pafs.copy_files(
                source, str(dest), source_filesystem=self.fs, destination_filesystem=self.local
            ),  # fmt: skip
        )

    def drop_local(self, key: str) -> None:
        """Forget this machine's copy of `key` (keeps the cache bounded)."""
        shutil.rmtree(self.local_path(key), ignore_errors=True)

    def sweep(self) -> list[Path]:
        """At start: remove the cache's scratch and staging directories of dead processes."""
        return sweep_dead_tmp(self.cache)

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
