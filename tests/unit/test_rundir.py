import json
import logging
import re

import pytest

from shared.batch import wait_for_batch
from shared.errors import TriadError, WaitTimeout
from shared.rundir import TRAINER, RunDir, parse_step, step_name
from shared.storage import atomic_path, atomic_write_bytes
from shared.waiting import wait_for


def test_step_names_round_trip():
    name = step_name(7)
    assert name.endswith("000007") and len(name) == len(step_name(999999)) and parse_step(name) == 7
    assert parse_step(step_name(123456)) == 123456
    # the same prefix without the zero padding, and a name of another form, are not step names
    assert parse_step(name.replace("00000", "")) is None and parse_step("other") is None


def test_marker_is_written_last_and_read_back(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.rollouts.path(1).mkdir(parents=True)
    assert rundir.rollouts.marker(1, "run-a") is None
    rundir.rollouts.write_marker(1, "run-a", samples=3)
    m = rundir.rollouts.marker(1, "run-a")
    assert m is not None and m.step == 1 and m.samples == 3
    assert json.loads(rundir.rollouts.marker_path(1).read_text())["run_id"] == "run-a"


def test_marker_of_another_run_is_ignored_and_logged(tmp_path, caplog):
    rundir = RunDir(tmp_path)
    rundir.rollouts.path(1).mkdir(parents=True)
    rundir.rollouts.write_marker(1, "old-run")
    with caplog.at_level(logging.WARNING):
        assert rundir.rollouts.marker(1, "new-run") is None
    assert "old-run" in caplog.text


def test_malformed_marker_is_ignored(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.rollouts.path(1).mkdir(parents=True)
    done = rundir.rollouts.marker_path(1)
    done.write_text("{not json")
    assert rundir.rollouts.marker(1, "run") is None
    done.write_text('{"run_id": "run"}')  # missing fields
    assert rundir.rollouts.marker(1, "run") is None


def test_reader_never_opens_a_step_without_done(tmp_path):
    """A half-written batch (no DONE) is never read: the reader times out naming the file."""
    rundir = RunDir(tmp_path)
    rundir.rollouts.path(1).mkdir(parents=True)
    rundir.batch_file(1).write_bytes(b"PAR1 half-written garbage")
    with pytest.raises(WaitTimeout, match=re.escape(rundir.rollouts.describe_marker(1))):
        wait_for_batch(rundir, 1, "run", timeout=0.3, reader=TRAINER)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"one")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"two-partial")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"one"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_clear_and_prune(tmp_path):
    rundir = RunDir(tmp_path)
    for s in range(1, 7):
        rundir.rollouts.path(s).mkdir(parents=True)
        rundir.rollouts.write_marker(s, "r")
    # steps <= 4 are done with; keep the newest 2 of those, and step 1 is protected
    assert rundir.rollouts.prune(keep_last=2, done_upto=4, protect=frozenset({1})) == [2]
    assert rundir.rollouts.steps() == [1, 3, 4, 5, 6]
    assert [s for s in range(1, 7) if rundir.rollouts.path(s).exists()] == [1, 3, 4, 5, 6]
    rundir.rollouts.clear(5)
    assert not rundir.rollouts.path(5).exists() and rundir.rollouts.steps() == [1, 3, 4, 6]


def test_ensure_run_creates_once(tmp_path):
    a = RunDir(tmp_path / "run").ensure_run({"x": 1})
    b = RunDir(tmp_path / "run").ensure_run({"x": 2})
    assert a.run_id == b.run_id and b.config == {"x": 1}


def test_unwritable_run_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(TriadError, match="is not writable"):
        RunDir(blocker / "run").ensure_run({})


def test_wait_for_returns_value_or_times_out_with_message():
    values = iter([None, None, 5])
    assert wait_for(lambda: next(values), "five", timeout=5, poll=0.01) == 5
    with pytest.raises(WaitTimeout, match="waiting for the moon"):
        wait_for(lambda: None, "the moon", timeout=0.05, poll=0.01)


def test_published_files_are_readable_by_other_users(tmp_path):
    atomic_write_bytes(tmp_path / "f", b"x")
    assert (tmp_path / "f").stat().st_mode & 0o044 == 0o044  # not mkstemp's 0600


def batch_with_versions(rundir, run_id, step, max_version):
    rundir.rollouts.path(step).mkdir(parents=True)
    rundir.rollouts.write_marker(step, run_id, max_policy_version=max_version)


def test_resume_keeps_only_an_unbroken_run_of_batches_after_the_checkpoint(tmp_path):
    from shared.resume import discard_after_checkpoint

    rundir = RunDir(tmp_path)
    for step, version in [(9, 8), (10, 9), (11, 9), (12, 10), (13, 11), (14, 10)]:
        batch_with_versions(rundir, "r", step, version)
    for v in (10, 11, 12):
        rundir.weights.path(v).mkdir(parents=True)
        rundir.weights.write_marker(v, "r")
    discard_after_checkpoint(rundir, "r", checkpoint_step=10)
    # 13 was sampled from version 11 (discarded); 14 comes after the break, so it goes too
    assert rundir.rollouts.steps() == [9, 10, 11, 12]
    assert rundir.weights.steps() == [10]


def test_resume_drops_batches_after_a_gap(tmp_path):
    from shared.resume import discard_after_checkpoint

    rundir = RunDir(tmp_path)
    for step in (11, 13):
        batch_with_versions(rundir, "r", step, 10)
    discard_after_checkpoint(rundir, "r", checkpoint_step=10)
    assert rundir.rollouts.steps() == [11]


def test_resume_leaves_a_batch_being_written_and_drops_what_is_published_after_it(tmp_path):
    """A trainer started after the orchestrator (or restarted beside it) found batch 1 being written.
    Before: it deleted the batch's directory, and the orchestrator's write failed (FileNotFoundError,
    a soak of 2026-11-28). Another run's batch, published, still goes."""
    from shared.resume import discard_after_checkpoint

    rundir = RunDir(tmp_path)
    half_written = rundir.batch_file(1).with_name(".tmp-half-written")
    half_written.parent.mkdir(parents=True)
    half_written.write_bytes(b"half a batch")
    batch_with_versions(rundir, "r", 2, 0)  # after a batch that is not published: not kept
    batch_with_versions(rundir, "another run", 3, 0)
    removed = discard_after_checkpoint(rundir, "r", checkpoint_step=0)
    assert removed == [rundir.rollouts.relative(2), rundir.rollouts.relative(3)]
    assert rundir.rollouts.steps() == [1] and half_written.is_file()


def test_an_orchestrator_following_a_rewind_leaves_the_resumed_trainers_weights(tmp_path):
    """The resumed trainer (checkpoint 3) has already published version 4 again when the
    orchestrator notices: only the old lineage's batches go, not the new weights."""
    from orchestrator.loop import follow_rewound_trainer

    rundir = RunDir(tmp_path)
    rundir.checkpoints.path(3).mkdir(parents=True)
    rundir.checkpoints.write_marker(3, "r")
    for step, version in [(4, 3), (5, 3), (6, 4)]:  # batch 6 was sampled from the old version 4
        batch_with_versions(rundir, "r", step, version)
    for v in (3, 4):
        rundir.weights.path(v).mkdir(parents=True)
        rundir.weights.write_marker(v, "r")
    follow_rewound_trainer(rundir, "r")
    assert rundir.rollouts.steps() == [4, 5]
    assert rundir.weights.steps() == [3, 4]


def test_polls_start_at_the_floor_back_off_to_the_cap_and_reset():
    from shared.waiting import Backoff, poll_cap

    b = Backoff(0.002, 0.1)
    got = [b.next() for _ in range(12)]
    assert got[:3] == pytest.approx([0.002, 0.003, 0.0045]) and got[-1] == 0.1 and got == sorted(got)
    b.reset()
    assert b.next() == 0.002
    assert Backoff(0.5, 0.1).next() == 0.1  # a floor above the cap is the cap
    assert (poll_cap(0.002), poll_cap(0.1), poll_cap(2.0)) == (0.02, 0.1, 2.0)  # local, object store, slow
    values = iter([None, None, None, 7])
    assert wait_for(lambda: next(values), "seven", timeout=5, poll=0.1, floor=0.001) == 7


def test_metadata_files_are_linked_from_the_previous_version(tmp_path):
    from trainer.versions import Metadata

    rundir = RunDir(tmp_path)
    calls = []

    def save(directory):
        calls.append(directory)
        (directory / "config.json").write_text('{"a": 1}')
        (directory / "tokenizer.json").write_text("{}")

    metadata = Metadata(rundir, save)
    for version in (1, 2, 3):
        metadata.put(version)
    assert len(calls) == 1  # rendered once, then linked
    first, third = rundir.weights.path(1) / "config.json", rundir.weights.path(3) / "config.json"
    assert third.read_text() == '{"a": 1}' and third.stat().st_ino == first.stat().st_ino
    rundir.weights.clear(3)  # gone: the next version renders them again
    rundir.weights.clear(2)
    assert rundir.weights.copy_files(3, 4, ["config.json"]) is False
    metadata.put(4)
    assert len(calls) == 2 and (rundir.weights.path(4) / "tokenizer.json").is_file()
    assert first.read_text() == '{"a": 1}'  # version 1's files untouched throughout


def test_a_failed_copy_of_several_files_leaves_none_behind(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.weights.path(1).mkdir(parents=True)
    (rundir.weights.path(1) / "a.json").write_text("a")
    assert rundir.weights.copy_files(1, 2, ["a.json", "missing.json"]) is False
    assert not (rundir.weights.path(2) / "a.json").exists()
    assert rundir.weights.copy_files(1, 2, ["a.json"]) is True
    assert (rundir.weights.path(2) / "a.json").read_text() == "a"
