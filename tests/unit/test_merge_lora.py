"""`triad merge-lora`: the merged directory gives peft's base+adapter logits without peft, from a
local and an object-store run directory; bad input is one line naming it."""

from __future__ import annotations

import pytest
import torch

from services.cli import main
from shared.config import LoraConfig
from shared.rundir import AdapterFiles, RunDir, pull_step_dir
from shared.storage import open_store
from tests.s3 import MotoServer

IDS = torch.tensor([[1, 5, 9, 14, 3, 22, 7]])
TARGETS = ["q_proj", "v_proj", "o_proj"]


def base(tiny_model: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def publish(rundir: RunDir, tiny_model: str, version: int, seed: int) -> None:
    """A trainer's adapter version with random B (peft starts it at zero, a no-op adapter)."""
    from trainer.lora import adapter_config, adapter_state, wrap_lora
    from trainer.publish import export_state_dict
    from trainer.versions import Adapter, write_version

    model = wrap_lora(base(tiny_model), LoraConfig(rank=4, alpha=8, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    state = export_state_dict(adapter_state(model, model.state_dict()), False, torch.float32)
    run_id = rundir.read_run().run_id
    write_version(rundir, run_id, version, Adapter(state, adapter_config(model)), keep_last=5)


def peft_logits(tiny_model: str, rundir: RunDir, version: int) -> torch.Tensor:
    from peft import PeftModel

    _, adapter_dir = pull_step_dir(rundir, rundir.weights.relative(version))
    with torch.no_grad():
        return PeftModel.from_pretrained(base(tiny_model), adapter_dir).eval()(IDS).logits


def merged_logits(out) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture(scope="module")
def lora_run(tiny_model: str, tmp_path_factory) -> RunDir:
    rundir = RunDir(tmp_path_factory.mktemp("lora-run"))
    rundir.ensure_run({"model": tiny_model})
    publish(rundir, tiny_model, 1, seed=1)
    publish(rundir, tiny_model, 2, seed=2)
    return rundir


def test_merged_directory_gives_base_plus_adapter_logits_without_peft(lora_run, tiny_model, tmp_path, capsys):
    out = tmp_path / "merged"
    main(["merge-lora", str(lora_run.root), str(out)])
    assert "merged adapter version 2" in capsys.readouterr().out  # the newest by default
    expected = peft_logits(tiny_model, lora_run, 2)
    got = merged_logits(out)
    assert (got - expected).abs().max() < 1e-5
    with torch.no_grad():
        assert (got - base(tiny_model)(IDS).logits).abs().max() > 1e-3
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer_config.json"} <= names
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    names = [n for f in RunDir.tensor_files_at(out) for n in load_file(f)]
    assert names and not [n for n in names if "lora" in n or "base_layer" in n]  # a plain model
    vocab = AutoTokenizer.from_pretrained(tiny_model).get_vocab()
    assert AutoTokenizer.from_pretrained(out).get_vocab() == vocab


def test_an_older_version_merges_that_version(lora_run, tiny_model, tmp_path):
    out = tmp_path / "v1"
    out.mkdir()  # an empty directory is fine
    main(["merge-lora", str(lora_run.root), "--version", "1", str(out)])
    assert (merged_logits(out) - peft_logits(tiny_model, lora_run, 1)).abs().max() < 1e-5


def error_line(capsys, *argv: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["merge-lora", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("triad merge-lora: error: ")
    return err


def test_bad_input_is_one_line_naming_it(lora_run, tiny_model, tmp_path, capsys):
    plain = RunDir(tmp_path / "plain")
    plain.weights.write_marker(5, plain.ensure_run({"model": tiny_model}).run_id, version=5, files=True)
    out = tmp_path / "out"
    assert "has no published LoRA adapter" in error_line(capsys, str(plain.root), str(out))
    assert "version 5 of run directory" in error_line(capsys, str(plain.root), "--version", "5", str(out))
    err = error_line(capsys, str(lora_run.root), "--version", "7", str(out))
    assert "version 7 of run directory" in err and "is not published" in err
    missing = error_line(capsys, str(tmp_path / "nope"), str(out))
    assert "does not exist: is this a triad run directory" in missing
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert f"output directory {out} is not empty" in error_line(capsys, str(lora_run.root), str(out))
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".tmp-*"))  # nothing left behind


def test_a_corrupted_adapter_is_refused_by_its_digest(tiny_model, tmp_path, capsys):
    rundir = RunDir(tmp_path / "run")
    rundir.ensure_run({"model": tiny_model})
    publish(rundir, tiny_model, 1, seed=3)
    publish(rundir, tiny_model, 9, seed=4)
    file = AdapterFiles.file_at(rundir.weights.path(1))
    file.write_bytes(AdapterFiles.file_at(rundir.weights.path(9)).read_bytes())
    err = error_line(capsys, str(rundir.root), "--version", "1", str(tmp_path / "out"))
    assert "does not match its marker's digest" in err and not (tmp_path / "out").exists()


def test_merges_from_an_object_store_run_directory(tiny_model, tmp_path, monkeypatch):
    moto = MotoServer(tmp_path / "moto.log")
    try:
        moto.create_bucket("merge")
        for key, value in moto.env().items():
            monkeypatch.setenv(key, value)
        url = "s3://merge/run"
        rundir = RunDir(url, open_store(url, tmp_path / "writer-cache"))
        rundir.ensure_run({"model": tiny_model})
        publish(rundir, tiny_model, 3, seed=5)
        out = tmp_path / "merged"
        main(["merge-lora", url, str(out)])
        assert (merged_logits(out) - peft_logits(tiny_model, rundir, 3)).abs().max() < 1e-5
    finally:
        moto.close()


def test_an_adapter_on_a_tied_lm_head_merges_into_what_was_trained(tiny_model, tmp_path):
    """Merging W+BA into a head tied to the embeddings would change the inputs too; the merged
    model must give the adapted model's logits (the trainer refuses such an adapter, but one made
    elsewhere still merges right)."""
    from peft import get_peft_model

    from trainer.lora import peft_config
    from trainer.merge import merged_model

    model = base(tiny_model)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # the tied model
    trained = get_peft_model(model, peft_config(LoraConfig(rank=4, alpha=8, target_modules=["lm_head"])))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        expected = trained.eval()(IDS).logits
    trained.save_pretrained(tmp_path / "adapter", save_embedding_layers=False)
    merged = merged_model(tiny_model, tmp_path / "adapter")
    with torch.no_grad():
        got = merged(IDS).logits
    assert (got - expected).abs().max() < 1e-5
    plain = base(tiny_model)
    assert torch.equal(merged.get_input_embeddings().weight, plain.get_input_embeddings().weight)
    merged.save_pretrained(tmp_path / "merged")
    assert (merged_logits(tmp_path / "merged") - expected).abs().max() < 1e-5  # stays untied on disk
