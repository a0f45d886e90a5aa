"""Errors a user can act on: printed as one line by the CLI, never as a traceback."""


class TriadError(Exception):
    """A problem with input, configuration or a peer, described for the user."""


class WaitTimeout(TriadError):
    """Something we waited for (a file, a marker, a peer) did not appear in time."""
