"""The whole loop with real parts: `triad up` = vLLM + 2-rank FSDP2 torchrun + orchestrator, the
model given as a hub id from a Hugging Face cache (the embedded model's files in its layout).

Everything is asserted from the run directory alone.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from services.placement import has_gpu
from shared.rundir import RunDir
from tests.helpers import free_port, hub_cache_of, run_triad

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 4


REPO_ID = "triad-test/tiny-addition"


def triad_up(run_dir: Path, max_async_level: int, env: dict[str, str]) -> None:
    """Run from the run directory's parent with a relative `run_dir`, as a user would."""
    sets = [
        f"model={REPO_ID}",
        f"run_dir={run_dir.name}",
        f"max_steps={STEPS}",
        f"max_async_level={max_async_level}",
        f"inference.port={free_port()}",
        "orchestrator.batch_size=4",
        "orchestrator.group_size=4",
        "orchestrator.keep_rollouts=100",
        "trainer.nproc=2",
        "trainer.optim.lr=1e-3",
        "weights.keep=100",
    ]
    result = run_triad("up", *[f"--set={s}" for s in sets], timeout=900, cwd=run_dir.parent, env=env)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(RunDir(run_dir).logs_dir.glob("*.log")))
    assert result.returncode == 0, f"triad up failed:\n{result.stdout}\n{result.stderr}\n{logs}"
    bound = (  # every step but the first, the launch (`services/timeline.py` after_launch)
        r"^triad up: (the trainer|generation) bounds the step: the trainer waited for batches \d+% of its "
        rf"time, the staleness guard held generation back \d+% of its time \(its last {STEPS - 1} steps\)$"
    )
    assert re.search(bound, result.stdout, re.MULTILINE), result.stdout
    check_api_server_moved(RunDir(run_dir), result.stdout)


def check_api_server_moved(rundir: RunDir, stdout: str) -> None:
    """On a machine `inference.cpus = "auto"` splits, vLLM's API server runs beside the trainer
    once its engine has started; the engine keeps inference's cores."""
    if has_gpu() or len(os.sched_getaffinity(0)) < 2:  # nothing is split (`services.placement`)
        return
    placed = re.search(
        r"^triad up: inference on cores (\S+) \(vLLM's API server on (\S+) once started\), the trainer "
        r"on (\S+), and on (\S+) too while it bounds the step \(cpus auto\)$",
        stdout,
        re.MULTILINE,
    )
    assert placed, stdout
    engine, frontend, trainer, borrowed = placed.groups()
    assert frontend == trainer and frontend != engine and borrowed == engine
    moved = f"vLLM's API server moved to cores {frontend} (its engine core stays where it started)"
    assert moved in rundir.log_file("inference").read_text()


def batch_versions(rundir: RunDir, step: int) -> list[int]:
    return pq.read_table(rundir.batch_file(step), columns=["policy_version"]).column(0).to_pylist()


def check_markers(rundir: RunDir, run_id: str) -> None:
    for area in (rundir.rollouts, rundir.weights):
        steps = area.steps()
        assert steps == list(range(1, STEPS + 1)), f"{area.kind}: {steps}"
        for step in steps:
            marker = json.loads(area.marker_path(step).read_text())
            assert marker["run_id"] == run_id and marker["step"] == step
            assert marker["created_at"] > 0


def check_training(rundir: RunDir) -> None:
    trainer = rundir.metrics.rows("trainer")
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in trainer)
    served = [r["version"] for r in rundir.metrics.rows("inference")]
    assert served[0] == 0 and served[-1] == STEPS and served == sorted(served), served
    orchestrator = rundir.metrics.rows("orchestrator")
    seen = [r["served_version"] for r in orchestrator]
    assert seen == sorted(seen) and seen[-1] >= 1, seen
    for row in orchestrator:  # the sizes `triad simulate --from` fits: all tokens, and those sampled
        batch = pq.read_table(rundir.batch_file(row["step"]), columns=["input_ids", "loss_mask"]).to_pylist()
        assert row["tokens"] == sum(len(r["input_ids"]) for r in batch)
        assert row["completion_tokens"] == sum(sum(r["loss_mask"]) for r in batch) > 0


def test_triad_up_overlaps_by_one_step_and_no_more(tmp_path: Path, tiny_model: str) -> None:
    """max_async_level 1; level 0 is test_disk_bound.py's run (100 on-policy steps). Every service
    reads the hub id's snapshot, and vLLM serves it under the id (under `triad up` it used to be
    served under the snapshot's path)."""
    snapshot = hub_cache_of(tiny_model, tmp_path / "hub", REPO_ID)
    run_dir = tmp_path / "run"
    triad_up(run_dir, max_async_level=1, env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    rundir = RunDir(run_dir)
    assert rundir.read_run().config["model"] == REPO_ID
    assert rundir.metrics.rows("inference")[0]["path"] == str(snapshot)  # version 0: the base model
    assert f"(model '{REPO_ID}'), serving version 0" in rundir.log_file("orchestrator").read_text()
    check_markers(rundir, rundir.read_run().run_id)
    check_training(rundir)
    lags = {step: [step - 1 - v for v in batch_versions(rundir, step)] for step in range(1, STEPS + 1)}
    all_lags = [x for step_lags in lags.values() for x in step_lags]
    assert min(all_lags) >= 0 and max(all_lags) <= 1, lags
    assert 1 in all_lags, f"no sample was off-policy by one: the overlap never happened {lags}"
