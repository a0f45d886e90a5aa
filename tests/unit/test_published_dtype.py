"""`weights.dtype = "auto"` publishes what inference serves, so no version is rounded on loading."""

from __future__ import annotations

import pytest
import torch

from shared.errors import TriadError
from trainer.publish import published_dtype, served_dtype


@pytest.mark.parametrize(
    ("inference", "model", "published"),
    [
        ("auto", torch.float32, torch.float32),  # an fp32 model served as fp32: not rounded to bf16
        ("auto", torch.float16, torch.float16),
        ("auto", torch.bfloat16, torch.bfloat16),
        ("bfloat16", torch.float32, torch.bfloat16),  # inference serves bf16: the trainer sends bf16
        ("half", torch.float32, torch.float16),
        ("float", torch.bfloat16, torch.float32),
    ],
)
def test_auto_is_the_dtype_inference_serves(inference, model, published):
    assert published_dtype("auto", inference, model) == published


def test_explicit_choices_stay_as_given():
    assert published_dtype("model", "bfloat16", torch.float32) == torch.float32
    assert published_dtype("float16", "bfloat16", torch.float32) == torch.float16


def test_an_inference_dtype_vllm_does_not_serve_is_one_line():
    with pytest.raises(TriadError, match=r"inference.dtype = 'int8' is not a dtype vLLM serves: use auto"):
        served_dtype("int8", torch.float32)
