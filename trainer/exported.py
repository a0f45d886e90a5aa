"""What of a model is published: its parameters under their Hugging Face names, a tied head
once (as the embedding). Shared by the file publisher (`trainer/publish.py`) and the broadcast
sender (`trainer/broadcast.py`), which the publisher drives."""

from __future__ import annotations

import torch


def export_state_dict(state: dict[str, torch.Tensor], tied_embeddings: bool, dtype: torch.dtype) -> dict:
    """Contiguous CPU tensors in the published dtype; a tied head is stored once."""
    out = {}
    for name, tensor in state.items():
        if tied_embeddings and name == "lm_head.weight":
            continue
        out[name] = tensor.detach().to("cpu", dtype).contiguous()
    return out


def published_parameters(model: torch.nn.Module, tied: bool) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters under their Hugging Face names; a tied head is published once, as the embedding."""
    return [(n, p) for n, p in model.named_parameters() if not (tied and n == "lm_head.weight")]
