"""One HTTP call to an inference server's own routes, and what its failures mean to the caller.

- `ServerUnreachable`: no answer at all (refused, name not resolved, timed out): the server may
  come back;
- `RequestRejected`: the server refused the request itself (4xx but 408 and 429): retrying elsewhere
  will not help;
- `RequestFailed`: an error answer that may pass (5xx, 408, 429, a cut or invalid body): retried,
  after the server's `Retry-After` if it named one;
- `TriadError`: any other failure, naming the method, the URL and what the server answered.

Each of the three carries the `kind` of failure it was (`failure_kind`), for the step's counts of
failed requests by kind: `http_<status>`, `bad_body` (a cut or invalid answer), `timeout`,
`dropped` (the connection closed without an answer), `refused` (no connection) or
`context_full` (`client.ContextFull`: no room left for a token, so never sent).
"""

from __future__ import annotations

import httpx

from shared.errors import TriadError


class RequestRejected(TriadError):
    """The server refused the request itself (4xx): retrying elsewhere will not help. `cause` names
    the request, for the episode it ends (`orchestrator/failures.py`)."""

    def __init__(self, message: str, cause: str = "generate", kind: str = "http_4xx") -> None:
        super().__init__(message)
        self.cause, self.kind = cause, kind


class ServerUnreachable(TriadError):
    """No answer at all (refused, name not resolved, timed out): the server may come back."""

    def __init__(self, message: str, kind: str = "refused") -> None:
        super().__init__(message)
        self.kind = kind


def transport_kind(error: BaseException | None) -> str:
    """The kind of a failure to get any answer: `timeout`, `refused` (no connection) or `dropped`."""
    if isinstance(error, httpx.TimeoutException):
        return "timeout"
    if isinstance(error, httpx.ConnectError):
        return "refused"
    return "dropped"


def failure_kind(error: BaseException) -> str:
    """What went wrong with one request, as its error names it; `other` for a failure of no kind."""
    return getattr(error, "kind", None) or "other"


def refused(status: int) -> bool:
    """A 4xx answer other than a timeout (408) or a busy server (429): retrying will not help."""
    return 400 <= status < 500 and status not in (408, 429)


class RequestFailed(TriadError):
    """The server answered with an error that may pass (5xx, 408, 429, a cut or invalid body): the
    pool retries, after `retry_after` seconds if the server named them (`Retry-After`)."""

    def __init__(self, message: str, retry_after: float | None = None, kind: str = "bad_body") -> None:
        super().__init__(message)
        self.retry_after, self.kind = retry_after, kind


def retry_after(headers: httpx.Headers) -> float | None:
    """Seconds of a `Retry-After` header; None without one, or for an HTTP date (the pool's backoff)."""
    try:
        return max(0.0, float(headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def answer_error(status: int, headers: httpx.Headers, message: str, cause: str) -> TriadError:
    """The one mapping of a server's error answer: a refusal (RequestRejected, not retried) or a
    failed request (RequestFailed, retried)."""
    kind = f"http_{status}"
    if refused(status):
        return RequestRejected(message, cause, kind)
    return RequestFailed(message, retry_after(headers), kind)


async def send(http: httpx.AsyncClient, method: str, route: str, **kwargs) -> httpx.Response:
    """The server's answer to `method route`, whatever its status; ServerUnreachable when none came."""
    try:
        return await http.request(method, route, **kwargs)
    except httpx.TransportError as e:
        raise ServerUnreachable(f"{method} {url_of(http, route)} failed: {e!r}", transport_kind(e)) from None
    except httpx.HTTPError as e:
        raise TriadError(f"{method} {url_of(http, route)} failed: {e!r}") from None


def url_of(http: httpx.AsyncClient, route: str) -> str:
    return str(http.base_url).rstrip("/") + route


def answered(r: httpx.Response) -> httpx.Response:
    """`r` if the server answered 200; else TriadError naming the call and the answer."""
    if r.status_code == 200:
        return r
    detail = " ".join(r.text[:300].split())
    url = r.request.url.copy_with(query=None)
    raise TriadError(f"{r.request.method} {url} answered {r.status_code}: {detail}")


async def call(http: httpx.AsyncClient, method: str, route: str, **kwargs) -> httpx.Response:
    """`send`, then `answered`: the 200 answer to one request to a server's own routes."""
    return answered(await send(http, method, route, **kwargs))
