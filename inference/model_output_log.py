"""One line, not a traceback, for each model output vLLM's parsers cannot parse.

vLLM's tool and reasoning parsers catch what they cannot parse in a model's output (a tool
call's JSON cut short, say), return it as plain content, and log the exception with its
traceback (`hermes_tool_parser.py`: "Error in extracting tool call from response."). A small or
early model writes such calls all the time: the chat soak's inference log held a hundred
tracebacks in 20 steps, each for output the run handled (the orchestrator counts a malformed
call). A filter on vLLM's log handlers rewrites those records as one warning that keeps the
exception's type and message; every other record, and every traceback from anywhere else,
is left as it is.
"""

from __future__ import annotations

import logging

PARSER_LOGGERS = ("vllm.tool_parsers.", "vllm.reasoning.")


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
