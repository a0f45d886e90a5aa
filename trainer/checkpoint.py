"""Trainer checkpoints: torch.distributed.checkpoint of model and optimizer.

`checkpoints/step_N/trainer/` holds the sharded state after update N (every
rank writes its own shards); `checkpoints/step_N/DONE` is written by rank 0
after all ranks have finished. Only a checkpoint with a valid marker of this
run is ever loaded. On an object store every rank uploads its own files, and a resumed
trainer fetches a copy per machine, loads it and drops it.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from shared.rundir import RunDir


def save_checkpoint(
    rundir: RunDir,
    run_id: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    keep_last: int,
    trained_only: bool = False,
) -> None:
    """Collective: every rank writes its shards; rank 0 vouches with `DONE`. With
    `trained_only` (LoRA) frozen parameters are left out: the base model is not saved again."""
    if dist.get_rank() == 0:
        rundir.checkpoints.clear(step)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer, options=options(trained_only))
    with rundir.store.writing_dir(rundir.trainer_state_key(step)) as directory:
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    dist.barrier()
    if dist.get_rank() == 0:
        rundir.checkpoints.write_marker(step, run_id)
        rundir.checkpoints.prune(keep_last, done_upto=step)
    dist.barrier()


def options(trained_only: bool) -> StateDictOptions:
    return StateDictOptions(ignore_frozen_params=trained_only, strict=not trained_only)


def load_checkpoint(
    rundir: RunDir,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trained_only: bool = False,
) -> None:
    """Collective: load the state after update `step` into the (sharded) model and optimizer.

    `get_state_dict` creates the optimizer's lazily-made state first, so there is
    something to load into."""
    model_state, optim_state = get_state_dict(model, optimizer, options=options(trained_only))
    state = {"model": model_state, "optim": optim_state}
    leader = int(os.environ.get("LOCAL_RANK", "0")) == 0  # one copy per machine
    if leader:
        rundir.store.fetch(rundir.trainer_state_key(step))
    dist.barrier()
    dcp.load(state, checkpoint_id=rundir.trainer_state_dir(step))
    dist.barrier()
    if leader:
        rundir.store.drop_local(rundir.trainer_state_key(step))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options(trained_only),
    )
