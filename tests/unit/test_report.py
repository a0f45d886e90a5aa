import contextlib
import io
import time
from contextlib import redirect_stdout

import pytest

from services.progress import MetricsTail, ProgressPrinter
from services.report import plot_run, rolling_mean, status_lines
from shared.errors import TriadError
from shared.metrics import MetricsWriter, drop_rows_after, read_metrics
from shared.rundir import RunDir
from shared.storage import LocalStore
from tests.helpers import small_disk

try:
    import tensorboard  # noqa: F401

    HAS_TENSORBOARD = True
except ImportError:
    HAS_TENSORBOARD = False


def log_steps(rundir: RunDir, steps: range, total: int) -> None:
    """The orchestrator's and the trainer's rows of `steps` (of `total`)."""
    orch, trainer = (
        rundir.metrics.writer("orchestrator"),
        rundir.metrics.writer("trainer"),
    )
    for s in steps:
        orch.log(
            s,
            reward_mean=s / total,
            lag_mean=1.0,
            lag_max=1,
            served_version=s - 1,
            samples_per_s=100.0,
            tokens_per_s=900.0,
        )
        trainer.log(s, loss=0.1, grad_norm=1.0)


def fake_run(tmp_path, steps: int = 30):
    rundir = RunDir(tmp_path)
    run = rundir.ensure_run({"max_steps": steps})
    log_steps(rundir, range(1, steps + 1), steps)
    for s in (steps - 1, steps):
        rundir.rollouts.path(s).mkdir(parents=True)
        rundir.rollouts.write_marker(s, run.run_id)
    return rundir


def test_rolling_mean():
    assert rolling_mean([1, 2, 3, 4], window=2) == [1, 1.5, 2.5, 3.5]


def test_status_names_each_service_and_the_newest_steps(tmp_path):
    rundir = fake_run(tmp_path)
    lines = status_lines(rundir, now=rundir.metrics_file("trainer").stat().st_mtime)
    text = "\n".join(lines)
    assert "newest batch 30" in text and "newest checkpoint 0" in text
    assert "orchestrator" in text and "reward 1.000" in text
    assert "inference    no metrics yet" in text


def test_status_shows_a_dataset_runs_epoch(tmp_path):
    rundir = fake_run(tmp_path, steps=3)
    rundir.metrics.writer("orchestrator").log(4, reward_mean=0.5, lag_mean=0.0, lag_max=0, epoch=2.25)
    lines = status_lines(rundir, now=rundir.metrics_file("trainer").stat().st_mtime)
    (line,) = [x for x in lines if x.strip().startswith("orchestrator step")]
    assert "step     4  reward 0.500, lag 0.00 (max 0), epoch 2.25" in line


def test_plot_writes_a_png(tmp_path):
    rundir = fake_run(tmp_path)
    out = plot_run(rundir)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_without_metrics_is_a_clear_error(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.ensure_run({})
    with pytest.raises(TriadError, match="no orchestrator metrics"):
        plot_run(rundir)


def test_progress_lines_are_plain_text(tmp_path):
    rundir = RunDir(tmp_path)
    printer = ProgressPrinter(rundir, max_steps=12)
    log_steps(rundir, range(1, 13), 12)
    out = io.StringIO()
    with redirect_stdout(out):
        printer.poll()
        printer.summary()
    text = out.getvalue()
    assert text.count("\n") == 13 and "step   12/12" in text
    assert all(ch == "\n" or ch.isprintable() for ch in text)  # no control characters
    assert "first 10 steps" in text


class Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[str, int]] = []

    def write(self, service: str, row: dict) -> None:
        self.rows.append((service, row["step"]))

    def close(self) -> None:
        pass


def test_a_resumed_start_shows_and_exports_only_its_own_rows(tmp_path):
    """A second `triad up` of a run made steps 1-6 before; it resumes after the checkpoint of 4:
    its printer, made before the services start, passes over the first start's rows, and then
    follows the trainer's rewritten file (steps 5-6 dropped, then trained again) and the
    orchestrator's new rows. Before 2026-11-29 it printed and exported steps 1-6 again."""
    rundir = RunDir(tmp_path)
    log_steps(rundir, range(1, 7), 8)
    recorder = Recorder()
    printer = ProgressPrinter(rundir, max_steps=8, exporters=[recorder])
    drop_rows_after(rundir.metrics_file("trainer"), 4)
    log_steps(rundir, range(5, 9), 8)
    out = io.StringIO()
    with redirect_stdout(out):
        printer.poll()
    printed = [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines()]
    assert printed == [5, 6, 7, 8]
    assert sorted(recorder.rows) == [
        (service, s) for service in ("orchestrator", "trainer") for s in range(5, 9)
    ]


def test_metrics_tail_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2')
    tail = MetricsTail(path)
    assert tail.read() == [{"step": 1}]
    with open(path, "a") as f:
        f.write("}\n")
    assert tail.read() == [{"step": 2}]


def test_metrics_tail_follows_a_resumed_writer(tmp_path):
    """triad up on a resume: the tail has read steps 1-4 when the resumed trainer rewrites the
    file without steps 3-4 (a new, shorter file) and writes its own 3 and 4; it used to seek
    the new file at the old offset, into the middle of a row, and stop triad up."""
    path = tmp_path / "trainer.jsonl"
    writer = MetricsWriter(LocalStore(tmp_path), path.name)
    for step in range(1, 5):
        writer.log(step, lineage="first")
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read()] == [1, 2, 3, 4]
    assert drop_rows_after(path, 2) == 2
    resumed = MetricsWriter(LocalStore(tmp_path), path.name)
    resumed.log(3, lineage="resumed")
    assert [(r["step"], r["lineage"]) for r in tail.read()] == [(3, "resumed")]
    resumed.log(4, lineage="resumed")
    assert [(r["step"], r["lineage"]) for r in tail.read()] == [(4, "resumed")]


def test_a_row_torn_by_a_killed_writer_is_skipped_not_fatal(tmp_path):
    path = tmp_path / "trainer.jsonl"
    MetricsWriter(LocalStore(tmp_path), path.name).log(1)
    with open(path, "a") as f:
        f.write('{"step": 2, "ti')  # killed mid-write
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read()] == [1]
    MetricsWriter(LocalStore(tmp_path), path.name).log(2)  # the restarted writer
    assert [r["step"] for r in tail.read()] == [2]
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="needs tensorboard")
def test_tensorboard_exporter_writes_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from services.exporters import TensorBoardExporter

    rundir = RunDir(tmp_path / "run")
    exporter = TensorBoardExporter(str(tmp_path / "tb"))
    printer = ProgressPrinter(rundir, max_steps=5, exporters=[exporter])
    log_steps(rundir, range(1, 6), 5)
    with redirect_stdout(io.StringIO()):
        printer.poll()
    printer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    rewards = events.Scalars("orchestrator/reward_mean")
    assert [(e.step, round(e.value, 3)) for e in rewards] == [(s, round(s / 5, 3)) for s in range(1, 6)]
    assert "trainer/loss" in events.Tags()["scalars"]


def test_exporters_follow_config(tmp_path):
    from services.exporters import TensorBoardExporter, make_exporters
    from shared.config import load_config

    cfg = load_config(None, [f"run_dir={tmp_path}", "metrics.tensorboard=false"])
    assert make_exporters(cfg, RunDir(tmp_path), "run") == []
    cfg = load_config(None, [f"run_dir={tmp_path}"])
    exporters = make_exporters(cfg, RunDir(tmp_path), "run")
    assert [type(e) for e in exporters] == ([TensorBoardExporter] if HAS_TENSORBOARD else [])


def test_wandb_exporter_in_offline_mode_logs_every_row(tmp_path):
    """Against the real wandb package (offline: nothing leaves the machine): the run is
    this run's id, and its history holds each step's metrics under `<service>/<key>`."""
    pytest.importorskip("wandb")
    from services.exporters import WandbExporter, make_exporters
    from shared.config import load_config

    rundir = RunDir(tmp_path / "run")
    cfg = load_config(
        None, [f"run_dir={rundir.root}", "metrics.tensorboard=false", 'metrics.wandb_project="triad-test"']
    )
    (exporter,) = make_exporters(cfg, rundir, "run-abc")
    assert isinstance(exporter, WandbExporter) and exporter.run.id == "run-abc"
    printer = ProgressPrinter(rundir, max_steps=5, exporters=[exporter])
    log_steps(rundir, range(1, 6), 5)
    with redirect_stdout(io.StringIO()):
        printer.poll()
    summary = dict(exporter.run.summary)
    printer.close()
    assert summary["orchestrator/reward_mean"] == pytest.approx(1.0) and summary["step"] == 5
    assert "trainer/loss" in summary
    (offline,) = (rundir.root / "wandb").glob("offline-run-*-run-abc")
    # the offline record log (uncompressed protobuf) holds one history item per logged row;
    # wandb's service process may still be writing it after `finish` returns
    from shared.waiting import wait_for

    log_file = offline / "run-run-abc.wandb"

    def logged() -> bool | None:
        records = log_file.read_bytes()
        return records.count(b"orchestrator/reward_mean") >= 5 and records.count(b"trainer/loss") >= 5 or None

    wait_for(logged, f"five logged rows of each service in {log_file}", 20, poll=0.05)


def test_a_full_disk_under_the_tensorboard_export_is_one_line_naming_it(tmp_path, monkeypatch):
    """TensorBoard's writer thread hits the full disk and raises at a later call: that call's
    error is the run directory's one line, and the thread's traceback is not printed."""
    import threading

    from services.exporters import TensorBoardExporter
    from shared.diskspace import DiskFull

    printed: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", printed.append)
    with small_disk(tmp_path / "disk", "256k") as disk:
        exporter = TensorBoardExporter(str(disk / "tb"))
        (disk / "filler").write_bytes(bytes(200 * 1024))  # what is left: less than a few rows
        row = {f"metric_{i}": 0.5 for i in range(50)}
        with pytest.raises(DiskFull) as e:
            for step in range(1, 100_000):
                exporter.write("trainer", {"step": step, **row})
                time.sleep(0.001)  # the writer thread's turn
        assert str(e.value).startswith(
            f"no space left on the disk of {disk / 'tb'} while writing TensorBoard events ("
        )
        assert "\n" not in str(e.value)
        with contextlib.suppress(DiskFull):
            exporter.close()
        assert threading.excepthook == printed.append
    assert [type(args.exc_value) for args in printed] == []
