"""One HTTP call to an inference server's own routes, and what its failures mean to the caller.

- `ServerUnreachable`: no answer at all (refused, name not resolved, timed out): the server may
  come back;
- `RequestRejected`: the server refused the request itself (4xx but 408 and 429): retrying elsewhere
  will not help;
- `RequestFailed`: an error answer that may pass (5xx, 408, 429, a cut or invalid body): retried,
  after the server's `Retry-After` if it named one;
- `TriadError`: any other failure, naming the method, the URL and what the server answered.
"""

from __future__ import annotations

import httpx

from shared.errors import TriadError


class RequestRejected(TriadError):
    """The server refused the request itself (4xx): retrying elsewhere will not help. `cause` names
    the request, for the episode it ends (`orchestrator/failures.py`)."""

    def __init__(self, message: str, cause: str = "generate") -> None:
        super().__init__(message)
        self.cause = cause


class ServerUnreachable(TriadError):
    """No answer at all (refused, name not resolved, timed out): the server may come back."""


def refused(status: int) -> bool:
    """A 4xx answer other than a timeout (408) or a busy server (429): retrying will not help."""
    return 400 <= status < 500 and status not in (408, 429)


class RequestFailed(TriadError):
    """The server answered with an error that may pass (5xx, 408, 429, a cut or invalid body): the
    pool retries, after `retry_after` seconds if the server named them (`Retry-After`)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_after(headers: httpx.Headers) -> float | None:
    """Seconds of a `Retry-After` header; None without one, or for an HTTP date (the pool's backoff)."""
    try:
        return max(0.0, float(headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def answer_error(status: int, headers: httpx.Headers, message: str, cause: str) -> TriadError:
    """The one mapping of a server's error answer: a refusal (RequestRejected, not retried) or a
    failed request (RequestFailed, retried)."""
    if refused(status):
        return RequestRejected(message, cause)
    return RequestFailed(message, retry_after(headers))


async def send(http: httpx.AsyncClient, method: str, route: str, **kwargs) -> httpx.Response:
    """The server's answer to `method route`, whatever its status; ServerUnreachable when none came."""
    try:
        return await http.request(method, route, **kwargs)
    except httpx.TransportError as e:
        raise ServerUnreachable(f"{method} {url_of(http, route)} failed: {e!r}") from None
    except httpx.HTTPError as e:
        raise TriadError(f"{method} {url_of(http, route)} failed: {e!r}") from None


def url_of(http: httpx.AsyncClient, route: str) -> str:
    return str(http.base_url).rstrip("/") + route


def answered(r: httpx.Response, rejects: bool = False) -> httpx.Response:
    """`r` if the server answered 200; else TriadError naming the call and the answer
    (RequestRejected for a 4xx where `rejects`: the request, not the server, was at fault)."""
    if r.status_code == 200:
        return r
    detail = " ".join(r.text[:300].split())
    error = RequestRejected if rejects and refused(r.status_code) else TriadError
    url = r.request.url.copy_with(query=None)
    raise error(f"{r.request.method} {url} answered {r.status_code}: {detail}")


async def call(http: httpx.AsyncClient, method: str, route: str, **kwargs) -> httpx.Response:
    """`send`, then `answered`: the 200 answer to one request to a server's own routes."""
    return answered(await send(http, method, route, **kwargs))
