"""`triad merge-lora`: a run's published LoRA adapter merged into the base model it trained, as
a plain Hugging Face directory (config, safetensors, tokenizer and generation files) that
transformers and vLLM load without peft.

The adapter is read through `RunDir` (a local or an object-store run directory), checked
against its marker's digest, merged in float32 and saved in the base model's dtype. The
directory is written under a temporary name beside `out` and renamed into place, so `out`
is either absent, or complete.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

import torch

from shared.digest import tensor_digest, version_digest
from shared.errors import TriadError
from shared.rundir import AdapterFiles, Marker, RunDir, pull_step_dir
from shared.storage import TMP_PREFIX
from trainer.lora import ties_output_to_input

log = logging.getLogger("triad.merge")


def check_out_dir(out: Path) -> None:
    """`out` must not exist, or be an empty directory: merging overwrites nothing."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TriadError(f"output directory {out} is not empty: merge-lora writes a new directory only")


def is_adapter(marker: Marker | None) -> bool:
    return marker is not None and bool(getattr(marker, "adapter", False))


def adapter_version(rundir: RunDir, run_id: str, version: int | None) -> tuple[int, Marker]:
    """`version` if it was published as a LoRA adapter, by default the newest adapter version,
    with its marker; TriadError naming the run directory and version otherwise."""
    if version is None:
        markers = {v: rundir.weights.marker(v, run_id) for v in rundir.weights.done_steps(run_id)}
        adapters = [v for v, m in markers.items() if is_adapter(m)]
        if not adapters:
            raise TriadError(
                f"run directory {rundir.name} has no published LoRA adapter (no version whose "
                f"{RunDir.marker_name()} says adapter: true; was trainer.lora.rank set?)"
            )
        return adapters[-1], markers[adapters[-1]]
    marker = rundir.weights.marker(version, run_id)
    if marker is None:
        raise TriadError(
            f"version {version} of run directory {rundir.name} is not published "
            f"(no valid {rundir.weights.describe_marker(version)})"
        )
    if not is_adapter(marker):
        raise TriadError(
            f"version {version} of run directory {rundir.name} is full weights, not a LoRA adapter: "
            f"{rundir.weights.relative(version)} is a Hugging Face directory already"
        )
    return version, marker


def check_digest(adapter_dir: Path, marker: Marker, where: str) -> None:
    """The adapter's tensors must be the ones its marker vouches for (`shared/digest.py`)."""
    from safetensors.torch import load_file

    expected = getattr(marker, "digest", None)
    if expected is None:
        return
    tensors = load_file(AdapterFiles.file_at(adapter_dir))
    got = version_digest({name: tensor_digest(t) for name, t in tensors.items()})
    if got != expected:
        raise TriadError(f"adapter {where} does not match its marker's digest ({got} != {expected})")


def untie_output(model: torch.nn.Module) -> None:
    """Give the output layer a weight of its own, so merging into it leaves the input
    embeddings as trained; the saved config says the weights are untied."""
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    model.config.get_text_config().tie_word_embeddings = False
    model.config.tie_word_embeddings = False


def merged_model(base: str, adapter_dir: Path) -> torch.nn.Module:
    """The base model with the adapter merged into its weights (in float32), in the base's dtype.
    An adapter on a tied `lm_head` (the trainer refuses one; made elsewhere) is merged into an
    untied copy of the head."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(AutoConfig.from_pretrained(base), "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    targets = PeftConfig.from_pretrained(adapter_dir).target_modules or ()
    if "lm_head" in targets and ties_output_to_input(model):
        log.warning(
            "the adapter takes lm_head, tied to the input embeddings in %s: merging into an untied copy", base
        )
        untie_output(model)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    return merged.to(dtype).eval()


def save_merged(model: torch.nn.Module, base: str, directory: Path) -> None:
    """Config, safetensors and generation config; the tokenizer files if the base has them."""
    from transformers import AutoTokenizer

    model.save_pretrained(directory, safe_serialization=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
    except (OSError, ValueError) as e:
        log.warning("base model %s has no tokenizer (%s): the merged directory has none either", base, e)
        return
    tokenizer.save_pretrained(directory)


def merge_lora(rundir: RunDir, base: str, out: Path, version: int | None = None) -> int:
    """Merge the run's adapter `version` (default: the newest) into `base` and write `out`;
    returns the version merged."""
    check_out_dir(out)
    run_id = rundir.read_run().run_id
    version, marker = adapter_version(rundir, run_id, version)
    name, local = pull_step_dir(rundir, rundir.weights.relative(version))
    tmp = out.parent / f"{TMP_PREFIX}{out.name}-{uuid.uuid4().hex[:8]}"
    try:
        if not AdapterFiles.is_adapter_at(local):
            raise TriadError(f"{rundir.store.describe(name)} holds no adapter files")
        check_digest(local, marker, rundir.store.describe(name))
        model = merged_model(base, local)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_merged(model, base, tmp)
        try:
            if out.exists():
                out.rmdir()  # empty when checked; a file written there since makes this fail
            tmp.rename(out)
        except OSError as e:
            raise TriadError(f"cannot put the merged model at {out}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        rundir.store.drop_local(name)
    log.info("merged version %d of %s into %s: %s", version, rundir.name, base, out)
    return version
