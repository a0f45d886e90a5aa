"""One line, not a traceback, for each model output vLLM's parsers cannot parse.

vLLM's tool and reasoning parsers catch what they cannot parse in a model's output (a tool
call's JSON cut short, say), return it as plain content, and log the exception with its
traceback (`hermes_tool_parser.py`: "Error in extracting tool call from response."). A small or
early model writes such calls all the time: the chat soak's inference log held a hundred
tracebacks in 20 steps, each for output the run handled (the orchestrator counts a malformed
call). A filter on vLLM's log handlers rewrites those records as one warning that keeps the
exception's type and message; every other record, and every traceback from anywhere else,
is left as it is.

`triad inference` adds the filter to vLLM's handlers once vLLM has configured them. A stock
`vllm serve` (`inference.backend = "vllm"`) runs no code of triad's, so it reads the filter from
vLLM's own logging configuration, `VLLM_LOGGING_CONFIG_PATH`: vLLM's default one, with the filter
on its handlers (`stock_logging_config`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from shared.diskspace import CACHE_ADVICE
from shared.storage import atomic_write_bytes

PARSER_LOGGERS = ("vllm.tool_parsers.", "vllm.reasoning.")
FILTER = "triad_parser_errors_in_one_line"


class ParserErrorsInOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and record.name.startswith(PARSER_LOGGERS):
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()} {type(error).__name__}: {error} (the model's output)"
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def parser_errors_in_one_line() -> None:
    """On each handler of vLLM's logger. vLLM configures logging again (`dictConfig`, new
    handlers) when it builds its engine client: call this after."""
    for handler in logging.getLogger("vllm").handlers:
        if not any(isinstance(f, ParserErrorsInOneLine) for f in handler.filters):
            handler.addFilter(ParserErrorsInOneLine())


def stock_logging_config() -> dict[str, Any]:
    """vLLM's default logging configuration, as this environment sets it, with the filter on each
    handler. A file given in `VLLM_LOGGING_CONFIG_PATH` replaces vLLM's default whole."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["filters"] = {FILTER: {"()": f"{__name__}.{ParserErrorsInOneLine.__name__}"}}
    for handler in config["handlers"].values():
        handler["filters"] = [*handler.get("filters", []), FILTER]
    return config


def write_stock_logging_config(directory: Path) -> Path:
    """`stock_logging_config` as a file in `directory`, for `VLLM_LOGGING_CONFIG_PATH`, named by its
    content: servers started with other vLLM logging settings do not overwrite each other's."""
    data = json.dumps(stock_logging_config(), indent=1, sort_keys=True).encode()
    path = directory / f"vllm-logging-{hashlib.sha256(data).hexdigest()[:16]}.json"
    if not path.exists():
        atomic_write_bytes(path, data, CACHE_ADVICE)
    return path
