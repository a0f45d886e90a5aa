"""inference/model_output_log.py: a model output vLLM's parser cannot parse is one line in the
server's log, not a traceback; other tracebacks stay."""

from __future__ import annotations

import io
import logging

import pytest

from inference.model_output_log import ParserErrorsInOneLine, parser_errors_in_one_line
from tests.templates import qwen3_tokenizer


@pytest.fixture
def vllm_log():
    """What vLLM's logger writes, through a handler of its own beside vLLM's."""
    import vllm.tool_parsers.hermes_tool_parser  # noqa: F401 (sets up vLLM's handlers; logs on import)

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        for h in logger.handlers:
            for f in [f for f in h.filters if isinstance(f, ParserErrorsInOneLine)]:
                h.removeFilter(f)


def test_a_tool_call_vllms_parser_cannot_read_is_one_warning_line(vllm_log):
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser  # imported by the fixture

    parser = Hermes2ProToolParser(qwen3_tokenizer())
    cut = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+\n</tool_call>'
    parser_errors_in_one_line()
    parsed = parser.extract_tool_calls(cut, None)
    assert not parsed.tools_called and parsed.content == cut  # vLLM handled it: plain content
    lines = vllm_log.getvalue().splitlines()
    assert len(lines) == 1 and "Traceback" not in vllm_log.getvalue()
    assert lines[0].startswith("WARNING [vllm.tool_parsers.hermes_tool_parser] Error in extracting tool call")
    assert "JSONDecodeError: " in lines[0] and lines[0].endswith("(the model's output)")


def test_without_the_filter_vllm_logs_the_traceback_and_other_loggers_keep_theirs(vllm_log):
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    Hermes2ProToolParser(qwen3_tokenizer()).extract_tool_calls("<tool_call>{</tool_call>", None)
    assert "Traceback" in vllm_log.getvalue()  # what the filter is for
    parser_errors_in_one_line()
    vllm_log.seek(0)
    vllm_log.truncate(0)
    try:
        raise RuntimeError("the engine failed")
    except RuntimeError:
        logging.getLogger("vllm.v1.engine.async_llm").exception("AsyncLLM output_handler failed.")
    text = vllm_log.getvalue()
    assert text.startswith("ERROR [vllm.v1.engine.async_llm]") and "Traceback" in text


STOCK_PARSE = """
import logging
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from tests.templates import qwen3_tokenizer

configure_logging(LoggingConfig())  # what vLLM's engine client does at start (AsyncLLM)
parser = Hermes2ProToolParser(qwen3_tokenizer())
cut = '<tool_call>\\n{"name": "calc", "arguments": {"x": "2+\\n</tool_call>'
assert not parser.extract_tool_calls(cut, None).tools_called
try:
    raise RuntimeError("the engine failed")
except RuntimeError:
    logging.getLogger("vllm.v1.engine.async_llm").exception("AsyncLLM output_handler failed.")
"""


def test_a_process_that_reads_the_stock_logging_config_logs_parser_errors_in_one_line(tmp_path):
    """A stock `vllm serve` runs no code of triad's: the filter reaches it through the logging
    configuration vLLM reads at import (`VLLM_LOGGING_CONFIG_PATH`), in a process of its own."""
    import os
    import subprocess
    import sys

    from inference.model_output_log import write_stock_logging_config

    path = write_stock_logging_config(tmp_path)
    assert write_stock_logging_config(tmp_path) == path  # the same settings, the same file
    env = {**os.environ, "VLLM_LOGGING_CONFIG_PATH": str(path)}
    result = subprocess.run(
        [sys.executable, "-c", STOCK_PARSE], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    [line] = [x for x in log.splitlines() if "Error in extracting tool call" in x]
    assert " WARNING " in line and "JSONDecodeError: " in line and line.endswith("(the model's output)")
    assert log.count("Traceback") == 1 and "RuntimeError: the engine failed" in log  # others keep theirs
