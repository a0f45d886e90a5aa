"""kill -9 one service in the middle of a run, restart it, and the run finishes correctly.

Each test runs the three services as separate processes on one run directory:

- the trainer starts while the orchestrator is writing batch 1 (held there until the trainer
  has resumed and waits for it), and leaves it to be finished;
- the trainer dies mid-step (after its backward pass, before the optimizer
  step); it resumes from its last checkpoint, and the orchestrator, seeing the
  weights it followed disappear, starts over from there; later in the same run
  the orchestrator dies while writing a batch (the Parquet file written, its
  `DONE` not), and the restarted one rewrites that batch;
- the inference server dies mid-generation; the orchestrator retries, takes it
  out, and when a new server answers on the same address gives it the current
  weights before it serves rollouts again.

In each: every step 1..N is trained exactly once (the trainer's metrics), every
batch obeys max_async_level, and no reader ever opened a step without `DONE`
(`TRIAD_AUDIT_READS` records each open).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shared.errors import WaitTimeout
from shared.faults import (
    AUDIT_VAR,
    FAILPOINT_VAR,
    ORCHESTRATOR_BEFORE_MARKER,
    ORCHESTRATOR_HOLD_BATCH,
    RELEASE_VAR,
    TRAINER_MID_STEP,
)
from shared.liveness import parse_record
from shared.rundir import TRAINER, RunDir
from shared.waiting import wait_for
from tests.helpers import REPO, Server, check_reads, trainer_cmd, triad_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 8
ASYNC = 1


class Run:
    def __init__(self, root: Path, model: str) -> None:
        self.root, self.model = root, model
        self.run_dir = root / "run"
        self.audit = root / "reads.jsonl"
        self.inference = Server(self.run_dir, model, root / "inference.log", *self.shared_sets())
        self.url = self.inference.url
        self.procs: dict[str, subprocess.Popen] = {}

    def shared_sets(self) -> list[str]:
        return [f"max_steps={STEPS}", f"max_async_level={ASYNC}", "trainer.checkpoint.every=3"]

    def sets(self) -> list[str]:
        return [
            f"run_dir={self.run_dir}",
            f"model={self.model}",
            *self.shared_sets(),
            f'orchestrator.servers.urls=["{self.url}"]',
            "orchestrator.batch_size=4",
            "orchestrator.group_size=4",
            "orchestrator.sampling.max_tokens=6",
            "orchestrator.servers.health_interval_s=1",
            "orchestrator.servers.retry_backoff_s=0.2",
            "orchestrator.servers.ready_timeout_s=240",
            "orchestrator.keep_rollouts=100",
            "weights.keep=100",
            "trainer.optim.lr=1e-4",
        ]

    def start(self, service: str, failpoint: str | None = None, release: Path | None = None) -> None:
        flags = [f"--set={s}" for s in self.sets()]
        cmd = triad_cmd(service, *flags)
        if service == "trainer":
            cmd = trainer_cmd(*flags)
        env = {**os.environ}
        env.pop(FAILPOINT_VAR, None)
        env.pop(RELEASE_VAR, None)
        if failpoint:
            env[FAILPOINT_VAR] = failpoint
        if release:
            env[RELEASE_VAR] = str(release)
        log = open(self.root / f"{service}.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.procs[service] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self, service: str) -> str:
        return (self.root / f"{service}.log").read_text(errors="replace")

    def wait(self, service: str, timeout: float = 300) -> int:
        try:
            return self.procs[service].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{service} did not finish:\n{self.log(service)[-4000:]}") from None

    def finish(self) -> None:
        for service in ("orchestrator", "trainer"):
            code = self.wait(service)
            assert code == 0, f"{service} exited {code}:\n{self.log(service)[-4000:]}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.inference.stop()

    def wait_for_batch(self, step: int, timeout: float = 240) -> None:
        rollouts = RunDir(self.run_dir).rollouts
        try:
            wait_for(lambda: rollouts.has_marker(step) or None, f"batch {step}", timeout, poll=0.05)
        except WaitTimeout as e:
            raise AssertionError(f"{e}:\n{self.log('orchestrator')[-3000:]}") from None

    def check(self) -> None:
        rundir = RunDir(self.run_dir)
        trained = [r["step"] for r in rundir.metrics.rows("trainer")]
        assert trained == list(range(1, STEPS + 1)), trained
        for step in rundir.rollouts.steps():
            versions = pq.read_table(rundir.batch_file(step), columns=["policy_version"]).column(0)
            assert all(0 <= step - 1 - v <= ASYNC for v in versions.to_pylist()), (step, versions)
        check_reads(self.audit)
        assert rundir.read_run().run_id  # the run directory is still this run's


@pytest.fixture
def run(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv(AUDIT_VAR, str(tmp_path / "reads.jsonl"))  # inference inherits it too
    r = Run(tmp_path, tiny_model)
    try:
        r.inference.wait_healthy()
        yield r
    finally:
        r.stop()


def trainer_waits_for_batch(run_dir: Path) -> bool | None:
    """Whether the trainer has resumed and waits for a batch (its live record's progress)."""
    record = parse_record(RunDir(run_dir).live.read(TRAINER), "the trainer's live record")
    return (record is not None and record.progress.get("phase") == "waiting for its batch") or None


def test_trainer_killed_mid_step_then_orchestrator_killed_mid_write_each_resumes(run):
    """A trainer started while the orchestrator writes batch 1, then two kills in one run: the trainer
    after step 5's backward pass, then the orchestrator writing batch 7, which it can write only once
    the resumed trainer has rewound it. Before 2026-11-28 the trainer, resuming after update 0,
    deleted batch 1's directory under the orchestrator's write (FileNotFoundError, a traceback)."""
    release = run.root / "release"
    held = f"{ORCHESTRATOR_HOLD_BATCH}:1,{ORCHESTRATOR_BEFORE_MARKER}:7"
    run.start("orchestrator", failpoint=held, release=release)
    batch_1 = RunDir(run.run_dir).rollouts.path(1)
    wait_for(lambda: (batch_1.is_dir() and any(batch_1.iterdir())) or None, "batch 1 being written", 240)
    run.start("trainer", failpoint=f"{TRAINER_MID_STEP}:5")
    wait_for(lambda: trainer_waits_for_batch(run.run_dir), "the trainer waiting for batch 1", 240, poll=0.2)
    assert batch_1.is_dir() and any(batch_1.iterdir()), "the trainer deleted the batch being written"
    release.touch()
    assert run.wait("trainer") != 0  # killed by its own SIGKILL after the step-5 backward pass
    rundir = RunDir(run.run_dir)
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == [1, 2, 3, 4]
    run.start("trainer")
    assert run.wait("orchestrator") != 0
    assert rundir.batch_file(7).exists() and not rundir.rollouts.has_marker(7)  # half-written
    run.start("orchestrator")
    run.finish()
    run.check()
    assert "resumed from the checkpoint after update 3" in run.log("trainer")
    # the orchestrator notices either the old version 4 gone or, if it polled only after the
    # resumed trainer's update 4, version 4 published again; both are the same rewind
    orchestrator = run.log("orchestrator")
    assert re.search(r"went back from version 4 to 3|version 4 was published again", orchestrator)
    assert "discarded weights" not in orchestrator  # the resumed trainer's versions are its own
    assert "resuming: batches 1..6 are already published" in orchestrator


def test_inference_killed_mid_generation_is_re_detected_and_realigned(run):
    run.start("orchestrator")
    run.start("trainer")
    run.wait_for_batch(3)
    killed = run.inference
    [sockets] = killed.socket_dirs()
    assert any(p.is_socket() for p in sockets.iterdir()), "vLLM's sockets are not in the server's directory"
    killed.kill_server_alone()  # generation for the next batches is in flight; vLLM's engine ends
    assert sockets.is_dir()  # a kill -9 leaves it
    served_before = max(r["version"] for r in RunDir(run.run_dir).metrics.rows("inference"))
    time.sleep(3)
    run.inference = Server(
        run.run_dir, run.model, run.root / "inference.log", *run.shared_sets(), port=run.inference.port
    )
    run.inference.wait_healthy()
    assert not sockets.exists(), "the next server did not remove the killed one's sockets"
    run.finish()
    run.check()
    [restarted] = run.inference.socket_dirs()
    run.inference.stop()
    assert not restarted.exists(), "a stopped server left its sockets"
    log = run.log("orchestrator")
    assert "out of rotation" in log and f"{run.url} is back, serving version" in log
    loads = [r["version"] for r in RunDir(run.run_dir).metrics.rows("inference")]
    restart = len(loads) - 1 - loads[::-1].index(0)  # the restarted server's first row: version 0
    assert loads[restart + 1] >= served_before, loads  # current weights before it served rollouts
