"""Reading the trainer's published weights: newest, loadable, this run's, lineage."""

from __future__ import annotations

import pytest

from orchestrator.weights.published import PublishedWeights, TrainerRewound
from shared.admin_api import WeightsInfo
from shared.rundir import RunDir


def publish(rundir: RunDir, run_id: str, version: int, files: bool = True) -> float:
    return rundir.weights.write_marker(version, run_id, version=version, files=files).created_at


def test_newest_loadable_and_this_runs(tmp_path):
    run_id = RunDir(tmp_path).ensure_run({}).run_id
    rundir, published = RunDir(tmp_path), PublishedWeights(RunDir(tmp_path), run_id)
    publish(rundir, run_id, 1)
    publish(rundir, run_id, 2, files=False)  # broadcast only
    rundir.weights.write_marker(3, "another-run")
    assert published.newest(after=0) == 2 and published.newest(after=0, loadable=True) == 1
    assert published.newest(after=2) is None and published.newest_marked(after=2) is None
    version, marker = published.newest_marked(after=0, loadable=True)  # the marker it read, for the load
    assert (version, marker.step, marker.run_id) == (1, 1, run_id)
    assert published.holds(WeightsInfo(version=2, path=rundir.weights.relative(2), base_path="/m"))
    assert published.holds(WeightsInfo(version=0, path="/m", base_path="/m"))
    assert not published.holds(WeightsInfo(version=3, path=rundir.weights.relative(3), base_path="/m"))


def test_lineage_breaks_when_the_followed_version_is_gone_or_republished(tmp_path):
    run_id = RunDir(tmp_path).ensure_run({}).run_id
    rundir, published = RunDir(tmp_path), PublishedWeights(RunDir(tmp_path), run_id)
    publish(rundir, run_id, 3)
    created = publish(rundir, run_id, 4)
    published.check_lineage(4, created)  # unchanged: fine
    rundir.weights.clear(4)  # a trainer resumed from checkpoint 3
    with pytest.raises(TrainerRewound, match="from version 4 to 3"):
        published.check_lineage(4, created)
    publish(rundir, run_id, 4)  # ... and already published its own version 4
    assert rundir.weights.marker(4, run_id).created_at != created
    with pytest.raises(TrainerRewound, match="published again"):
        published.check_lineage(4, created)
