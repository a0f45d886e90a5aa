"""LoRA through peft: the check that the adapter fits the model, the wrap, and the adapter's
published form (PEFT's layout: tensor names without the adapter name, and its config)."""

from __future__ import annotations

import json

import torch

from shared.config import TIED_LM_HEAD, LoraConfig
from shared.errors import TriadError

ADAPTER = "default"  # peft's name for the one adapter a trainer holds


def linear_layers(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The model's linear layers by their last name, one example each (the smallest)."""
    found: dict[str, torch.nn.Linear] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            smallest = found.get(leaf)
            size = min(module.in_features, module.out_features)
            if smallest is None or size < min(smallest.in_features, smallest.out_features):
                found[leaf] = module
    return found


def ties_output_to_input(model: torch.nn.Module) -> bool:
    """Whether the model's output layer shares its weight with the input embeddings."""
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    return output is not None and inputs is not None and output.weight is inputs.weight


def check_lora_fits(model: torch.nn.Module, lora: LoraConfig) -> None:
    """One-line TriadError unless every target module is a linear layer of the model, the rank
    is below each one's smaller dimension, and `lm_head` is a target only if it has a weight of
    its own (merging W+BA into a tied one would change the input embeddings too)."""
    if "lm_head" in lora.target_modules and ties_output_to_input(model):
        raise TriadError(TIED_LM_HEAD)
    linears = linear_layers(model)
    missing = [m for m in lora.target_modules if m not in linears]
    if missing:
        raise TriadError(
            f"trainer.lora.target_modules: {missing} are not linear layers of the model "
            f"(it has {sorted(linears)})"
        )
    for name in lora.target_modules:
        layer = linears[name]
        limit = min(layer.in_features, layer.out_features)
        if lora.rank >= limit:
            raise TriadError(
                f"trainer.lora.rank = {lora.rank} is not below {limit}, the smaller dimension of "
                f"{name} ({layer.in_features} -> {layer.out_features})"
            )


def peft_config(lora: LoraConfig):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """The model with LoRA adapters on the target modules; only the adapters train."""
    from peft import get_peft_model

    check_lora_fits(model, lora)
    return get_peft_model(model, peft_config(lora), adapter_name=ADAPTER)


def adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a (full) state dict of the wrapped model, under PEFT's saved names.
    With `lm_head` a target, peft would also save its frozen base weight (a vocabulary-sized
    copy of the base model's); the adapter is only what trains."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(
        model, state_dict=state, adapter_name=ADAPTER, save_embedding_layers=False
    )


def adapter_config(model: torch.nn.Module) -> dict:
    """`adapter_config.json`'s body."""
    config = model.peft_config[ADAPTER].to_dict()
    return json.loads(json.dumps(config, default=sorted))  # target_modules is a set in peft
