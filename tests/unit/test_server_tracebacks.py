"""tests/helpers.py `server_tracebacks`: what the integration tests count as a server's traceback."""

from __future__ import annotations

from tests.helpers import server_tracebacks

P = "(MainProcess pid=1) ERROR 11-27 06:35:38 [async_llm.py:906] "
SHUTDOWN = "(MainProcess pid=1) INFO 11-27 06:35:38 [core_client.py:777] [shutdown] MPClient: complete"
# as vLLM 0.32 logged it on a graceful stop here (paths shortened)
RACE = [
    P + "AsyncLLM output_handler failed.",
    P + "Traceback (most recent call last):",
    P + '  File "vllm/v1/engine/async_llm.py", line 849, in output_handler',
    P + "    outputs = await engine_core.get_output_async()",
    P + '  File "vllm/v1/engine/core_client.py", line 1235, in get_output_async',
    P + "    raise self._format_exception(outputs) from None",
    P + "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack"
    " trace (above) for the root cause.",
    "(MainProcess pid=1) INFO 11-27 06:35:38 [launcher.py:279] [shutdown] API server: engine client stopped",
]
OURS = [
    "Traceback (most recent call last):",
    '  File "inference/admin.py", line 10, in load',
    "ValueError: bad shard",
]


def test_vllms_own_traceback_on_a_graceful_stop_is_not_counted():
    assert server_tracebacks("\n".join(["INFO: serving", SHUTDOWN, *RACE])) == []


def test_an_engine_that_died_while_serving_is_counted():
    assert server_tracebacks("\n".join(["INFO: serving", *RACE, SHUTDOWN])) == [RACE[-2][len(P) :]]


def test_any_other_traceback_is_counted_before_or_after_the_stop():
    assert server_tracebacks("\n".join([*OURS, SHUTDOWN, *RACE])) == ["ValueError: bad shard"]
    assert server_tracebacks("\n".join([SHUTDOWN, *RACE, *OURS])) == ["ValueError: bad shard"]
