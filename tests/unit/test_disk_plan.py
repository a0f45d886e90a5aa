"""`triad up`'s disk plan: what a run's versions and checkpoints can take, from the model's
safetensors headers and the config, and the warning when the run directory's disk has less room
(a real tmpfs). test_disk_bound.py checks the plan against what a real run wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub.constants import SAFETENSORS_INDEX_FILE, SAFETENSORS_SINGLE_FILE
from safetensors.torch import save_file

from services.disk_plan import ModelSize, disk_plan, model_size, room_warning
from shared.config import load_config
from shared.rundir import RunDir
from tests.helpers import small_disk

KIB = 1024


def a_model(path: Path) -> Path:
    """Two files: 3 x 64 x 256 bfloat16 and 64 x 256 float32 (65,536 parameters, 163,840 bytes)."""
    path.mkdir(parents=True)
    layers = {f"layer.{i}": torch.zeros(64, 256, dtype=torch.bfloat16) for i in range(3)}
    save_file(layers, path / "model-00001-of-00002.safetensors")
    save_file({"norm": torch.zeros(64, 256)}, path / "model-00002-of-00002.safetensors")
    return path


def test_the_size_is_read_from_every_files_header(tmp_path):
    assert model_size(a_model(tmp_path / "model")) == ModelSize(params=65_536, stored_bytes=163_840)
    assert model_size(tmp_path) is None  # no safetensors: nothing to plan with
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / SAFETENSORS_SINGLE_FILE).write_bytes(b"not a header")
    assert model_size(tmp_path / "broken") is None  # left to the services that load it


def test_only_the_files_transformers_loads_are_counted(tmp_path):
    model = a_model(tmp_path / "model")
    save_file({"all": torch.zeros(64, 1024)}, model / "consolidated.safetensors")  # another format's copy
    index = {
        "weight_map": {
            "layer.0": "model-00001-of-00002.safetensors",
            "norm": "model-00002-of-00002.safetensors",
        }
    }
    (model / SAFETENSORS_INDEX_FILE).write_text(json.dumps(index))
    assert model_size(model) == ModelSize(params=65_536, stored_bytes=163_840)
    single = tmp_path / "single"
    single.mkdir()
    save_file({"w": torch.zeros(8, 8)}, single / SAFETENSORS_SINGLE_FILE)
    save_file({"all": torch.zeros(64, 1024)}, single / "consolidated.safetensors")
    assert model_size(single) == ModelSize(params=64, stored_bytes=256)


@pytest.mark.parametrize(
    "sets, versions, version_bytes, checkpoints",
    [
        ([], 3 + 2 + 1, 163_840, 2 + 1),  # the newest 3, those of 2 kept checkpoints, one being written
        (["weights.keep=5", "trainer.checkpoint.keep=1"], 5 + 1 + 1, 163_840, 1 + 1),
        (["trainer.checkpoint.every=0"], 3 + 1, 163_840, 0),  # no checkpoints, none of their versions
        (["weights.snapshot_every=4"], 3 + 2 + 1 + 1, 163_840, 3),  # and the deltas' snapshot
        (["inference.dtype=float32"], 6, 65_536 * 4, 3),  # published as served
        (["weights.dtype=bfloat16"], 6, 65_536 * 2, 3),
        (["inference.dtype=float32", "weights.dtype=model"], 6, 163_840, 3),
    ],
)
def test_the_plan_follows_the_bounds_of_the_docs(sets, versions, version_bytes, checkpoints):
    plan = disk_plan(load_config(None, sets), ModelSize(params=65_536, stored_bytes=163_840))
    assert (plan.versions, plan.version_bytes, plan.checkpoints) == (versions, version_bytes, checkpoints)
    assert plan.checkpoint_bytes == 65_536 * 4 * 3  # float32 weights and AdamW's two moments
    assert plan.total == versions * version_bytes + checkpoints * 65_536 * 12


def test_a_lora_run_is_not_planned():
    cfg = load_config(None, ["trainer.lora.rank=8"])
    assert disk_plan(cfg, ModelSize(params=65_536, stored_bytes=163_840)) is None


def test_a_disk_too_small_for_the_plan_is_one_warning_naming_the_figures(tmp_path):
    model = a_model(tmp_path / "model")  # plan: 6 x 160 KiB + 3 x 768 KiB = 3.2 MiB
    with small_disk(tmp_path / "disk", "2m") as disk:
        cfg = load_config(None, [f"run_dir={disk / 'run'}"])
        warning = room_warning(cfg, model, RunDir.of(cfg))
        assert warning is not None and "\n" not in warning
        assert warning.startswith(
            f"the disk of {disk / 'run'} has 2.0 MiB free, and this run can keep 3.2 MiB there: "
            "6 weights versions of 160 KiB (weights.keep, those of kept checkpoints, one being written) "
            "and 3 checkpoints of 768 KiB (trainer.checkpoint.keep + 1"
        )
        no_checkpoints = load_config(None, [f"run_dir={disk / 'run'}", "trainer.checkpoint.every=0"])
        assert room_warning(no_checkpoints, model, RunDir.of(cfg)) is None  # 4 x 160 KiB fit


def test_what_the_run_directory_holds_counts_as_room(tmp_path):
    """A resumed run's own versions and checkpoints are part of its plan: they are replaced, not
    added to; another file on the disk is not."""
    model = a_model(tmp_path / "model")  # plan: 3.2 MiB
    with small_disk(tmp_path / "disk", "4m") as disk:
        cfg = load_config(None, [f"run_dir={disk / 'run'}"])
        (disk / "run").mkdir()
        (disk / "run" / "a version").write_bytes(bytes(1536 * KIB))
        assert room_warning(cfg, model, RunDir.of(cfg)) is None  # 2.5 MiB free, 1.5 MiB its own
        (disk / "run" / "a version").rename(disk / "another file")
        assert room_warning(cfg, model, RunDir.of(cfg)) is not None
