"""Logging for every triad process: triad's own lines survive what libraries do to the root.

Every triad module logs through a logger named `triad.<part>`. The `triad` logger has its own
handler and level and does not propagate, so a library that sets the root logger's level
(vLLM's `model_hosting_container_standards` sets it to ERROR while vLLM builds its app) cannot
hide triad's INFO and WARNING lines, such as what a service waits for during a store outage.
Other libraries log through the root handler, as `logging.basicConfig` sets it up.
"""

from __future__ import annotations

import logging
import os
import sys

TRIAD = "triad"
NOISY = ("httpx", "httpx2", "httpcore", "openai")


def formatter() -> logging.Formatter:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    return logging.Formatter(f"%(asctime)s {prefix}%(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")


def setup_logging(level: int = logging.INFO) -> None:
    """The root logger for libraries, and `triad.*` with a handler and level of its own."""
    fmt = formatter()
    logging.basicConfig(level=level, format=fmt._fmt, datefmt=fmt.datefmt)
    triad = logging.getLogger(TRIAD)
    for old in [h for h in triad.handlers if getattr(h, "triad_handler", False)]:
        triad.removeHandler(old)  # set up again (tests, a second `main` in one process)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    handler.triad_handler = True  # type: ignore[attr-defined]
    triad.addHandler(handler)
    triad.setLevel(level)
    triad.propagate = False
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


RootLevels = tuple[int, list[tuple[logging.Handler, int]]]


def root_levels() -> RootLevels:
    """The root logger's level and its handlers' levels, to put back with `restore_root_levels`."""
    root = logging.getLogger()
    return root.level, [(h, h.level) for h in root.handlers]


def restore_root_levels(saved: RootLevels) -> None:
    """Put back what a library changed since `saved` (`model_hosting_container_standards`
    raises the root logger and its handlers to ERROR)."""
    root = logging.getLogger()
    level, handlers = saved
    if root.level != level:
        logging.getLogger(f"{TRIAD}.logs").info(
            "restoring the root log level %s (a library set it to %s)",
            logging.getLevelName(level),
            logging.getLevelName(root.level),
        )
        root.setLevel(level)
    for handler, handler_level in handlers:
        handler.setLevel(handler_level)
