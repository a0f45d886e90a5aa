"""Trainer checkpoints: torch.distributed.checkpoint of model and optimizer.

`checkpoints/step_N/trainer/` holds the sharded state after update N (every
rank writes its own shards); `checkpoints/step_N/DONE` is written by rank 0
after all ranks have finished. Only a checkpoint with a valid marker of this
run is ever loaded.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from shared.rundir import CHECKPOINTS, RunDir, clear_step_dir, prune_steps, write_marker

TRAINER_STATE = "trainer"


def save_checkpoint(
    rundir: RunDir,
    run_id: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    keep_last: int,
) -> None:
    """Collective: every rank writes its shards; rank 0 vouches with `DONE`."""
    step_dir = rundir.checkpoint_dir(step)
    if dist.get_rank() == 0:
        clear_step_dir(step_dir)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=step_dir / TRAINER_STATE)
    dist.barrier()
    if dist.get_rank() == 0:
        write_marker(step_dir, run_id, step)
        prune_steps(rundir.root / CHECKPOINTS, keep_last, done_upto=step)
    dist.barrier()


def load_checkpoint(
    rundir: RunDir, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Collective: load the state after update `step` into the (sharded) model and optimizer.

    `get_state_dict` creates the optimizer's lazily-made state first, so there is
    something to load into."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=rundir.checkpoint_dir(step) / TRAINER_STATE)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
