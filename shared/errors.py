"""Errors a user can act on: printed as one line by the CLI, never as a traceback."""

from __future__ import annotations

import re

MAX_ERROR_CHARS = 500
_LINE_BREAKS = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")


class TriadError(Exception):
    """A problem with input, configuration or a peer, described for the user."""


class WaitTimeout(TriadError):
    """Something we waited for (a file, a marker, a peer) did not appear in time."""


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` (a peer's or an environment's error) on one line, cut to `limit` characters."""
    text = _LINE_BREAKS.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
