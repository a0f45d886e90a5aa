"""Progress on the long waits before a run's first step: the tiny models' builds and the services' start."""

from __future__ import annotations

import io
import json

from services.progress import ProgressPrinter, StartProgress, StartTimes, StepProgress, Ticker
from shared.rundir import INFERENCE, ORCHESTRATOR, RunDir


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pipe_gets_a_plain_line_every_few_seconds():
    clock, out = Clock(), io.StringIO()
    ticker = Ticker(out, every_s=5.0, live=False, clock=clock)
    for t, text in [(0, "a"), (1, "b"), (4.9, "c"), (5, "d"), (12, "e"), (13, "f")]:
        clock.now = 100.0 + t
        ticker.update(text)
    ticker.done()
    assert out.getvalue() == "a\nd\ne\n"


def test_a_terminal_gets_one_line_rewritten_in_place():
    out = io.StringIO()
    ticker = Ticker(out, live=True)
    ticker.update("step 1/10, long text")
    ticker.update("step 2/10")
    ticker.done()
    assert out.getvalue() == "\rstep 1/10, long text\rstep 2/10           \n"


def test_a_build_says_its_step_of_steps_and_the_time_left():
    clock, out = Clock(), io.StringIO()
    progress = StepProgress("building builtin:x", Ticker(out, every_s=0, live=False, clock=clock), clock)
    clock.now += 20  # loading: not part of the steps' pace
    progress.step(0, 100, "warm-up")
    clock.now += 30
    progress.step(25, 100, "warm-up")
    clock.now += 95
    progress.phase("checking it by sampling 64 held-out episodes")
    assert out.getvalue().splitlines() == [
        "building builtin:x: warm-up, step 0/100, 0m20s",
        "building builtin:x: warm-up, step 25/100, 0m50s, about 1m30s left",
        "building builtin:x: checking it by sampling 64 held-out episodes, 2m25s",
    ]


def test_the_tiny_model_s_warm_up_reports_every_step(tmp_path):
    from services.tiny_model import SHAPE, make_model, make_tokenizer, warm_up

    tokenizer, out = make_tokenizer(), io.StringIO()
    model = make_model(tokenizer, 0, **{**SHAPE, "hidden_size": 16, "intermediate_size": 32})
    progress = StepProgress("b", Ticker(out, 0, False))
    warm_up(model, tokenizer, "addition", 3, 1e-3, 0, batch=2, progress=progress)
    assert [line.split(", ")[1] for line in out.getvalue().splitlines()] == [f"step {i}/3" for i in range(3)]


def test_the_start_says_what_inference_does_then_waits_for_the_first_batch(tmp_path):
    rundir, clock = RunDir(tmp_path / "run"), Clock()
    rundir.logs_dir.mkdir(parents=True)
    times = StartTimes(tmp_path / "start_times.json", "builtin:tiny-addition on CPU")
    start = StartProgress(rundir, times, clock)
    assert start.line() == "starting: inference (vLLM) 0m00s: (no output yet)"
    rundir.log_file(INFERENCE).write_text(
        "INFO 11-26 14:00:00 [api_server.py:1] vLLM API server version 0.32.0\n"
        "(EngineCore pid=12) \x1b[32mINFO\x1b[0m 11-26 14:00:09 [cpu_worker.py:88] Loading weights\ttook "
        "0.05 seconds\n\n"
    )
    clock.now += 40
    assert start.line() == "starting: inference (vLLM) 0m40s: Loading weights took 0.05 seconds"
    connected = "triad.orchestrator connected to inference at [...], serving version 0"
    rundir.log_file(ORCHESTRATOR).write_text(connected + "\n")
    waiting = "starting: inference serves; waiting for the first batch"
    assert start.line() == f"{waiting} 0m00s: {connected}"
    clock.now += 7
    start.first_batch()
    assert json.loads(times.path.read_text()) == {
        "builtin:tiny-addition on CPU": {"inference_s": 40.0, "first_batch_s": 7.0}
    }
    again = StartProgress(rundir, times, clock)
    assert again.line() == "starting: inference (vLLM) 0m00s (last time 0m40s): (no output yet)"
    with open(rundir.log_file(ORCHESTRATOR), "a") as f:
        f.write(connected + "\n")
    assert again.line() == f"{waiting} 0m00s (last time 0m07s): {connected}"


def test_a_second_start_waits_for_its_own_services_not_the_logs_of_the_first(tmp_path):
    """The logs of a run keep every start's output: the first start's orchestrator connected,
    this start's inference has printed nothing yet."""
    rundir, clock = RunDir(tmp_path / "run"), Clock()
    rundir.logs_dir.mkdir(parents=True)
    rundir.log_file(INFERENCE).write_text("INFO 11-26 14:00:00 [launcher.py:1] Route: /health\n")
    rundir.log_file(ORCHESTRATOR).write_text("triad.orchestrator connected to inference at [...]\n")
    start = StartProgress(rundir, None, clock)
    assert start.line() == "starting: inference (vLLM) 0m00s: (no output yet)"
    with open(rundir.log_file(INFERENCE), "a") as f:
        f.write("INFO 11-29 02:00:00 [core.py:1] init engine\n")
    assert start.line() == "starting: inference (vLLM) 0m00s: init engine"
    with open(rundir.log_file(ORCHESTRATOR), "a") as f:
        f.write("triad.orchestrator connected to inference at [...], serving version 4\n")
    assert start.line().startswith("starting: inference serves; waiting for the first batch 0m00s: ")


def test_a_piped_up_prints_the_start_until_the_first_step(tmp_path, capsys):
    rundir = RunDir(tmp_path / "run")
    rundir.logs_dir.mkdir(parents=True)
    printer = ProgressPrinter(rundir, max_steps=3)
    rundir.log_file(INFERENCE).write_text("INFO 11-26 14:00:00 [core.py:1] init engine\n")
    printer.poll()
    assert capsys.readouterr().out == "starting: inference (vLLM) 0m00s: init engine\n"


def test_a_blocking_phase_repeats_its_line_until_it_ends():
    import time

    out = io.StringIO()
    progress = StepProgress("building builtin:x", Ticker(out, every_s=0, live=False))
    with progress.during("loading torch", every_s=0.05):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and set(lines) == {"building builtin:x: loading torch, 0m00s"}
    time.sleep(0.15)
    assert out.getvalue().splitlines() == lines  # the thread stopped with the phase


def test_a_build_that_fails_apart_is_one_line(tmp_path):
    import pytest

    from services.tiny_model import build_apart
    from shared.errors import TriadError

    with pytest.raises(TriadError, match=r"^building builtin:no-such stopped with exit code 1 \(its output"):
        build_apart(tmp_path / "dest", "no-such")


def test_a_build_another_process_holds_is_waited_for_in_a_line_saying_so(tmp_path, caplog):
    """The build lock's holder ends (here: lets go after 0.3 s); the wait said what it waits for."""
    import fcntl
    import logging
    import threading

    from services.tiny_model import wait_for_builder

    path = tmp_path / ".model.lock"
    with open(path, "w") as holder, open(path, "w") as waiter:
        fcntl.flock(holder, fcntl.LOCK_EX)
        threading.Timer(0.3, fcntl.flock, (holder, fcntl.LOCK_UN)).start()
        with caplog.at_level(logging.INFO):
            wait_for_builder(waiter, tmp_path / "model")
    assert f"waiting for another process that builds {tmp_path / 'model'} (it holds {path})" in caplog.text
