"""Every file and directory name of a run directory, and the names of its steps and services.
The only place they are spelled (`tests/unit/test_code_rules.py` checks it); the rest of the
package builds paths from them."""

from __future__ import annotations

import re
from enum import StrEnum

_DONE = "DONE"
_RUN_FILE = "run.json"
_BATCH_FILE = "batch.parquet"
_WEIGHTS_FILE = "model.safetensors"
_WEIGHTS_INDEX = "model.safetensors.index.json"
_WEIGHTS_SUFFIX = ".safetensors"
_ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's layout, which vLLM loads as a LoRA adapter
_ADAPTER_CONFIG = "adapter_config.json"
_DELTA_FILE = "model.delta"  # a delta version's difference from the one before (`shared/delta.py`)
_TRAINER_STATE = "trainer"
_ROLLOUTS, _WEIGHTS, _CHECKPOINTS = "rollouts", "weights", "checkpoints"
_METRICS, _LOGS, _TENSORBOARD, _PLOT = "metrics", "logs", "tensorboard", "plot.png"
_FLEET, _FLEET_SUFFIX = "fleet", ".json"
_LIVE, _LIVE_SUFFIX = "live", ".json"  # one heartbeat and lease record per role
_METRICS_SUFFIX = ".jsonl"
_METRICS_NAME = re.compile(r"(?P<service>[a-z]+)(-(?P<server>[0-9a-f]+))?(\.(?P<part>\d{5}))?\.jsonl")
_SERVER_ID = re.compile(r"[0-9a-f]+")
_TIMELINE = "timeline.png"
_STEP_PREFIX = "step_"
_STEP_DIGITS = 6

INFERENCE, ORCHESTRATOR, TRAINER = "inference", "orchestrator", "trainer"
SERVICES = (ORCHESTRATOR, TRAINER, INFERENCE)  # also the names of their metrics and log files
EVAL = "eval"  # the orchestrator's evaluation metrics


class Handshake(StrEnum):
    """The weight-broadcast handshake files in a weights step directory (`shared/broadcast.py`)."""

    SEND_READY = "SEND_READY"
    RECEIVING = "RECEIVING"
    FALLBACK = "FALLBACK"


def step_name(step: int) -> str:
    return f"{_STEP_PREFIX}{step:0{_STEP_DIGITS}d}"


def parse_step(name: str) -> int | None:
    digits = name.removeprefix(_STEP_PREFIX)
    if name == digits or len(digits) != _STEP_DIGITS or not digits.isdigit():
        return None
    return int(digits)
