import json

import pytest

from services.report import plot_timeline, status_lines, step_window
from services.timeline import Span, breakdown, spans
from shared.errors import TriadError
from shared.rundir import RunDir


def write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def run(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.ensure_run({"max_steps": 3})
    write_rows(
        rundir.metrics_file("trainer"),
        [  # written after publishing
            {
                "step": s,
                "time": 100.0 + 10 * s,
                "wait_s": 1.0,
                "train_s": 2.0 * s,
                "publish_s": 0.5,
                "loss": 0.0,
                "grad_norm": 1.0,
            }
            for s in (1, 2, 3)
        ],
    )
    write_rows(
        rundir.metrics_file("orchestrator"),
        [
            {
                "step": s,
                "time": 95.0 + 10 * s,
                "step_time_s": 4.0,
                "samples_per_s": 32.0,
                "reward_mean": 0.5,
                "lag_mean": 1.0,
                "lag_max": 1,
            }
            for s in (1, 2, 3)
        ],
    )
    write_rows(
        rundir.metrics_file("inference"),
        [
            {"step": 1, "time": 111.0, "version": 1, "load_s": 0.25},
            {"step": 2, "time": 121.0, "version": 2},
        ],
    )
    return rundir


def test_phases_end_at_the_row_and_lie_back_to_back(run):
    got = {(s.service, s.phase, s.step): (s.start, s.end) for s in spans(run, 2, 2)}
    assert got == {
        ("trainer", "publish", 2): (119.5, 120.0),
        ("trainer", "train", 2): (115.5, 119.5),
        ("trainer", "wait", 2): (114.5, 115.5),
        ("orchestrator", "generate", 2): (111.0, 115.0),
        ("inference", "load", 2): (121.0, 121.0),  # no load_s: a point in time
    }
    assert Span("inference", "load", 1, 110.75, 111.0) in spans(run, 1, 1)


def test_breakdown_gives_mean_phase_times_over_the_last_steps(run):
    lines = breakdown(run, last_n=2)  # steps 2 and 3: train 4 and 6 s -> 5 s
    assert lines[0] == (
        "  trainer      last 2 steps: 6.500 s/step = "
        "wait 1.000 s (15%), train 5.000 s (77%), publish 0.500 s (8%)"
    )
    assert lines[1] == "  orchestrator last 2 steps: 4.000 s/step, 32 samples/s"
    assert lines[2] == "  inference    last 1 loads: 0.250 s each"
    assert "where the time went:" in status_lines(run, now=200.0)


def test_timeline_window_and_figure(run):
    assert step_window(run, None) == (1, 3)
    assert step_window(run, "2:3") == (2, 3)
    for bad in ("3:2", "x:3", "3"):
        with pytest.raises(TriadError, match="--window expects FIRST:LAST"):
            step_window(run, bad)
    with pytest.raises(TriadError, match="no metrics for steps 7..9"):
        plot_timeline(run, 7, 9)
    out = plot_timeline(run, 1, 3)
    assert out == run.plot_file(timeline=True) and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finer_phases_are_drawn_and_broken_down_where_rows_have_them(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.ensure_run({"max_steps": 2})
    fine = {
        "wait_s": 0.01,
        "read_s": 0.02,
        "forward_backward_s": 0.05,
        "optimizer_s": 0.03,
        "gather_s": 0.01,
        "write_s": 0.02,
        "mark_s": 0.01,
    }
    write_rows(
        rundir.metrics_file("trainer"),
        [
            {
                "step": s,
                "time": 10.0 * s,
                "train_s": 0.08,
                "publish_s": 0.04,
                "loss": 0.0,
                "grad_norm": 1,
                **fine,
            }
            for s in (1, 2)
        ],
    )
    write_rows(
        rundir.metrics_file("orchestrator"),
        [
            {
                "step": s,
                "time": 10.0 * s - 1,
                "step_time_s": 0.2,
                "generate_s": 0.15,
                "assemble_s": 0.02,
                "write_batch_s": 0.03,
                "samples_per_s": 640.0,
                "reward_mean": 0.5,
                "lag_mean": 1.0,
                "lag_max": 1,
            }
            for s in (1, 2)
        ],
    )
    got = {(s.service, s.phase): (round(s.start, 6), round(s.end, 6)) for s in spans(rundir, 2, 2)}
    assert got[("trainer", "mark")] == (19.99, 20.0) and got[("trainer", "wait")] == (19.85, 19.86)
    assert got[("orchestrator", "write_batch")] == (18.97, 19.0)
    assert got[("orchestrator", "generate")] == (18.8, 18.95)
    lines = breakdown(rundir, last_n=2)
    assert lines[0].startswith("  trainer      last 2 steps: 0.150 s/step = wait 0.010 s (7%), read 0.020 s")
    assert "mark 0.010 s (7%)" in lines[0]
    assert lines[1].endswith("= generate 0.150 s (75%), assemble 0.020 s (10%), write_batch 0.030 s (15%)")
    assert plot_timeline(rundir, 1, 2).is_file()


def with_guard(rundir, guard_wait_s: float) -> RunDir:
    """The fixture's orchestrator rows (4 s a step) with the staleness guard's wait in them."""
    rows = [dict(r, guard_wait_s=guard_wait_s) for r in rundir.metrics.rows("orchestrator")]
    write_rows(rundir.metrics_file("orchestrator"), rows)
    return rundir


@pytest.mark.parametrize(
    ("guard_wait_s", "side", "line"),
    [
        (  # the trainer waits 1 s of 6.5 (15%), generation is held 3 s of 4 (75%)
            3.0,
            "trainer",
            "the trainer bounds the step: the trainer waited for batches 15% of its time, "
            "the staleness guard held generation back 75% of its time",
        ),
        (
            0.2,
            "generation",
            "generation bounds the step: the trainer waited for batches 15% of its time, "
            "the staleness guard held generation back 5% of its time",
        ),
    ],
)
def test_the_side_that_waited_the_smaller_share_bounds_the_step(run, guard_wait_s, side, line):
    from services.timeline import bound

    assert bound(run, last_n=2) is None  # no guard figures in the orchestrator's rows yet
    found = bound(with_guard(run, guard_wait_s), last_n=2)
    assert found is not None and (found.side, found.line, found.steps) == (side, line, 2)
    assert breakdown(run, last_n=2)[-1] == f"  {line}"


def test_the_launch_s_wait_does_not_decide_which_side_bounds_a_short_run(run):
    """The trainer's first wait is vLLM's start and the first batch: 40 s of the fixture's first
    step would make a run whose trainer never waited after it look bound by generation."""
    from services.timeline import bound

    rows = run.metrics.rows("trainer")
    rows[0] = dict(rows[0], wait_s=40.0)
    rows[1:] = [dict(r, wait_s=0.0) for r in rows[1:]]
    write_rows(run.metrics_file("trainer"), rows)
    found = bound(with_guard(run, 3.0), last_n=20)
    assert found is not None and (found.side, found.steps) == ("trainer", 2)
    assert found.line.startswith("the trainer bounds the step: the trainer waited for batches 0% of its time")
    write_rows(run.metrics_file("trainer"), rows[:1])  # the trainer's only row is the first step's
    assert bound(run, last_n=20).steps == 1
