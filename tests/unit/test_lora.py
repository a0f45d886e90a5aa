"""LoRA in the trainer: the fit check, the peft wrap, and the adapter's published layout."""

from __future__ import annotations

import json

import pytest
import torch

from shared.config import LoraConfig, load_config
from shared.errors import TriadError
from shared.rundir import AdapterFiles, RunDir


@pytest.fixture(scope="module")
def base(tiny_model: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def fresh(tiny_model: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def test_config_section_parses_and_is_off_by_default():
    assert not load_config(None).trainer.lora.enabled
    cfg = load_config(None, ["trainer.lora.rank=4", "trainer.lora.target_modules=['q_proj']"])
    assert cfg.trainer.lora.enabled and cfg.trainer.lora.target_modules == ["q_proj"]


def test_target_modules_the_model_lacks_are_one_line_errors(base):
    from trainer.lora import check_lora_fits

    with pytest.raises(TriadError) as e:
        check_lora_fits(base, LoraConfig(rank=4, target_modules=["q_proj", "query_key_value"]))
    assert "['query_key_value'] are not linear layers" in str(e.value) and "\n" not in str(e.value)


def test_a_rank_the_layers_cannot_hold_is_a_one_line_error(base):
    from trainer.lora import check_lora_fits

    smallest = min(
        min(m.in_features, m.out_features) for n, m in base.named_modules() if n.endswith("q_proj")
    )
    with pytest.raises(
        TriadError, match=rf"rank = {smallest} is not below {smallest}, the smaller dimension of q_proj"
    ):
        check_lora_fits(base, LoraConfig(rank=smallest, target_modules=["q_proj"]))


def test_only_the_adapters_train(tiny_model: str):
    from trainer.lora import wrap_lora

    model = wrap_lora(fresh(tiny_model), LoraConfig(rank=2, target_modules=["q_proj", "v_proj"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    layers = len([n for n, _ in model.named_modules() if n.endswith("q_proj") and "lora" not in n])
    assert len(trainable) == 2 * 2 * layers  # A and B on two modules per block
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)


def test_published_adapter_is_a_peft_directory_giving_the_trainers_logits(tiny_model: str, tmp_path):
    from peft import PeftModel

    from trainer.lora import adapter_config, adapter_state, wrap_lora
    from trainer.publish import export_state_dict
    from trainer.versions import Adapter, write_version

    model = wrap_lora(fresh(tiny_model), LoraConfig(rank=2, alpha=4, target_modules=["q_proj", "o_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # peft starts B at zero: make the adapter change the output
    rundir = RunDir(tmp_path)
    state = export_state_dict(adapter_state(model, model.state_dict()), False, torch.float32)
    write_version(rundir, "run-a", 3, Adapter(state, adapter_config(model)), keep_last=3)

    directory = rundir.weights.path(3)
    assert AdapterFiles.is_adapter_at(directory) and RunDir.has_marker_at(directory)
    assert len(list(directory.iterdir())) == 3  # adapter config, adapter tensors, marker: no base weights
    marker = rundir.weights.marker(3, "run-a")
    assert marker.adapter and marker.version == 3 and len(marker.tensor_digests) == len(state)
    assert json.loads((directory / "adapter_config.json").read_text())["r"] == 2
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    loaded = PeftModel.from_pretrained(fresh(tiny_model), directory).eval()
    with torch.no_grad():
        expected, got = model.eval()(input_ids=ids).logits, loaded(input_ids=ids).logits
        plain = fresh(tiny_model)(input_ids=ids).logits
    assert torch.allclose(expected, got, atol=1e-6)
    assert (expected - plain).abs().max() > 1e-3


def test_an_adapter_on_lm_head_publishes_only_what_trains():
    """peft would add lm_head's frozen base weight (vocabulary x hidden) to the adapter."""
    from services.tiny_model import make_model, make_tokenizer
    from trainer.lora import adapter_state, wrap_lora

    base = make_model(make_tokenizer(), seed=0, untied=True)
    assert base.lm_head.weight.data_ptr() != base.model.embed_tokens.weight.data_ptr()
    model = wrap_lora(base, LoraConfig(rank=2, alpha=4, target_modules=["q_proj", "lm_head"]))
    names = sorted(adapter_state(model, model.state_dict()))
    assert "base_model.model.lm_head.lora_B.weight" in names, names
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in names), names


class NoLoraEngine:
    class vllm_config:  # noqa: N801 (vLLM's attribute names)
        lora_config = None


def test_a_server_without_lora_support_refuses_adapters_in_one_line(tmp_path):
    import asyncio

    from inference.adapters import AdapterManager
    from inference.admin import AdminError
    from shared.admin_api import LoadAdapterRequest

    manager = AdapterManager(NoLoraEngine(), RunDir(tmp_path), metrics=None)
    request = LoadAdapterRequest(name="run-a", run_id="r1", version=1, path="some/dir")
    with pytest.raises(AdminError) as e:
        asyncio.run(manager.load(request))
    assert e.value.status == 409 and "no LoRA support" in e.value.detail and "--enable-lora" in e.value.detail
    assert manager.info().lora is False and manager.info().adapters == []


def test_adapter_names_are_checked_before_anything_loads():
    from pydantic import ValidationError

    from shared.admin_api import LoadAdapterRequest

    with pytest.raises(ValidationError):
        LoadAdapterRequest(name="../evil", run_id="r1", version=1, path="some/dir")


def test_a_lora_directory_sent_as_weights_is_refused_and_named(tmp_path):
    from inference.admin import AdminError, WeightManager

    rundir = RunDir(tmp_path)
    rundir.adapters.write_config(1, {})
    with rundir.adapters.writing(1) as tmp:
        tmp.write_bytes(b"{}")
    manager = WeightManager.__new__(WeightManager)
    manager.rundir = rundir
    with pytest.raises(
        AdminError, match="holds a LoRA adapter, not weights: load it with POST /admin/adapters"
    ):
        manager._check_pulled(rundir.weights.relative(1), rundir.weights.path(1), 1)


def test_an_adapter_on_a_tied_lm_head_is_refused_in_one_line(base):
    """The tiny model ties lm_head to the embeddings: an adapter there cannot be merged as trained."""
    from trainer.lora import check_lora_fits

    with pytest.raises(TriadError) as e:
        check_lora_fits(base, LoraConfig(rank=2, target_modules=["q_proj", "lm_head"]))
    assert "lm_head shares its weight with the input embeddings" in str(e.value)
    assert "\n" not in str(e.value)
