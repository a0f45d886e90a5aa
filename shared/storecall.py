"""Requests to an object store: each retried with backoff until a deadline, a request that
hangs named while it hangs, and the one conditional PUT pyarrow cannot send (through boto3).
`shared/objectstore.py` builds the store on them."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from shared.diskspace import is_disk_full
from shared.errors import TriadError, WaitTimeout

ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
PERMANENT = (
    "NO_SUCH_BUCKET",
    "ACCESS_DENIED",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "NoSuchBucket",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.2, 5.0
CONNECT_TIMEOUT_S, STALL_TIMEOUT_S = 3.0, 5.0
LOG_EVERY_S = 5.0
T = TypeVar("T")
log = logging.getLogger("triad.store")


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
                log.warning("waiting for object store %s (%s): not done after %.0f s", url, what, now - start)


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
                if is_disk_full(e):
                    raise  # this machine's disk, not the store: the caller that knows where says so
                waited = time.monotonic() - start
                if waited >= self.timeout_s:
                    raise WaitTimeout(
                        f"gave up after {self.timeout_s:.0f} s waiting for object store {self.url} "
                        f"({what}): {short(e)}"
                    ) from None
                if last_log is None or time.monotonic() - last_log >= LOG_EVERY_S:
                    last_log = time.monotonic()
                    log.warning(
                        "waiting for object store %s (%s, %.0f s of %.0f s): %s",
                        self.url,
                        what,
                        waited,
                        self.timeout_s,
                        short(e),
                    )
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
