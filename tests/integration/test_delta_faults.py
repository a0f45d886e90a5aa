"""Delta versions over 30 updates with kill -9s: the trainer after uploading a delta and before
its `DONE`, and the inference server after rebuilding a delta and before loading it.

Real services (vLLM, torchrun trainer, orchestrator) on one run directory, with
`weights.snapshot_every = 4` and a checkpoint every 7 updates in bf16. The run must end with
every update 1..30 trained exactly once, every version the server loaded matching the trainer's
digests (the orchestrator stops the run on any mismatch, and the inference metrics say which
versions came from deltas), and no reader opening a step without `DONE`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from shared.faults import AUDIT_VAR, FAILPOINT_VAR, INFERENCE_MID_APPLY, TRAINER_BEFORE_DELTA_MARKER
from shared.rundir import DeltaFiles, RunDir
from tests.helpers import Server
from tests.integration.test_faults import Run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 30
EVERY = 4
KILL_TRAINER_AT = 10  # a delta (9 is its base); the checkpoint before it is 7
KILL_INFERENCE_AT = 18  # a delta the server rebuilds


class DeltaRun(Run):
    def shared_sets(self) -> list[str]:
        return [
            f"max_steps={STEPS}",
            "max_async_level=1",
            "trainer.checkpoint.every=7",
            f"weights.snapshot_every={EVERY}",
            'weights.dtype="bfloat16"',
        ]

    def sets(self) -> list[str]:
        return [*super().sets(), "weights.keep=3", "orchestrator.keep_rollouts=4"]


@pytest.fixture
def run(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv(AUDIT_VAR, str(tmp_path / "reads.jsonl"))
    monkeypatch.setenv(FAILPOINT_VAR, f"{INFERENCE_MID_APPLY}:{KILL_INFERENCE_AT}")  # the first server's
    r = DeltaRun(tmp_path, tiny_model)
    monkeypatch.delenv(FAILPOINT_VAR)
    try:
        r.inference.wait_healthy()
        yield r
    finally:
        r.stop()


def test_deltas_over_30_versions_with_kills_stay_exact(run, monkeypatch):
    import tests.integration.test_faults as faults

    monkeypatch.setattr(faults, "STEPS", STEPS)  # `Run.check` counts the steps
    run.start("orchestrator")
    run.start("trainer", failpoint=f"{TRAINER_BEFORE_DELTA_MARKER}:{KILL_TRAINER_AT}")
    assert run.wait("trainer") != 0  # killed between delta 10's upload and its marker
    rundir = RunDir(run.run_dir)
    assert not rundir.weights.has_marker(KILL_TRAINER_AT)
    assert DeltaFiles.file_at(rundir.weights.path(KILL_TRAINER_AT)).is_file()  # uploaded, never trusted
    run.start("trainer")
    deadline = time.monotonic() + 600
    while run.inference.proc.poll() is None:  # killed by its own failpoint mid-apply
        assert time.monotonic() < deadline, "the server never rebuilt version 18"
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.inference.proc.pid, signal.SIGKILL)  # the engine core it left
    run.inference.log.close()
    time.sleep(2)
    run.inference = Server(
        run.run_dir, run.model, run.root / "inference.log", *run.shared_sets(), port=run.inference.port
    )
    run.inference.wait_healthy()
    run.finish()
    run.check()
    assert "resumed from the checkpoint after update 7" in run.log("trainer")
    inference = run.log("inference")
    assert "rebuilt weights version" in inference
    loads = [r["version"] for r in rundir.metrics.rows("inference")]
    assert loads[-1] == STEPS and KILL_INFERENCE_AT not in loads[: loads.index(0, 1)], loads
    assert "other bytes than the trainer published" not in run.log("orchestrator")
