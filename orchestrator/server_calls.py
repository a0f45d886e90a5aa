"""One HTTP call to an inference server's own routes, and what its failures mean to the caller.

- `ServerUnreachable`: no answer at all (refused, name not resolved, timed out): the server may
  come back;
- `RequestRejected`: the server refused the request itself (4xx): retrying elsewhere will not help;
- `TriadError`: any other failure, naming the method, the URL and what the server answered.
"""

from __future__ import annotations

import httpx

from shared.errors import TriadError


class RequestRejected(TriadError):
    """The server refused the request itself (4xx): retrying elsewhere will not help."""


class ServerUnreachable(TriadError):
    """No answer at all (refused, name not resolved, timed out): the server may come back."""


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
    error = RequestRejected if rejects and 400 <= r.status_code < 500 else TriadError
    url = r.request.url.copy_with(query=None)
    raise error(f"{r.request.method} {url} answered {r.status_code}: {detail}")


async def call(http: httpx.AsyncClient, method: str, route: str, **kwargs) -> httpx.Response:
    """`send`, then `answered`: the 200 answer to one request to a server's own routes."""
    return answered(await send(http, method, route, **kwargs))
