"""Reading the trainer's published weights: newest, loadable, this run's, lineage."""

from __future__ import annotations

import pytest

from orchestrator.published import PublishedWeights, TrainerRewound
from shared.admin_api import WeightsInfo
from shared.rundir import RunDir, clear_step_dir, ensure_run, read_marker, write_marker


def publish(rundir: RunDir, run_id: str, version: int, files: bool = True) -> float:
    return write_marker(rundir.weights_dir(version), run_id, version, version=version, files=files).created_at


def test_newest_loadable_and_this_runs(tmp_path):
    run_id = ensure_run(tmp_path, {}).run_id
    rundir, published = RunDir(tmp_path), PublishedWeights(RunDir(tmp_path), run_id)
    publish(rundir, run_id, 1)
    publish(rundir, run_id, 2, files=False)  # broadcast only
    write_marker(rundir.weights_dir(3), "another-run", 3)
    assert published.newest(after=0) == 2 and published.newest(after=0, loadable=True) == 1
    assert published.newest(after=2) is None
    assert published.holds(WeightsInfo(version=2, path="weights/step_000002", base_path="/m"))
    assert published.holds(WeightsInfo(version=0, path="/m", base_path="/m"))
    assert not published.holds(WeightsInfo(version=3, path="weights/step_000003", base_path="/m"))


def test_lineage_breaks_when_the_followed_version_is_gone_or_republished(tmp_path):
    run_id = ensure_run(tmp_path, {}).run_id
    rundir, published = RunDir(tmp_path), PublishedWeights(RunDir(tmp_path), run_id)
    publish(rundir, run_id, 3)
    created = publish(rundir, run_id, 4)
    published.check_lineage(4, created)  # unchanged: fine
    clear_step_dir(rundir.weights_dir(4))  # a trainer resumed from checkpoint 3
    with pytest.raises(TrainerRewound, match="from version 4 to 3"):
        published.check_lineage(4, created)
    publish(rundir, run_id, 4)  # ... and already published its own version 4
    assert read_marker(rundir.weights_dir(4), run_id).created_at != created
    with pytest.raises(TrainerRewound, match="published again"):
        published.check_lineage(4, created)
