"""A hub id (`model = "Org/Name"`) is read from the Hugging Face cache's snapshot, as vLLM and
transformers read it: the chat template, the dtype and the parsers every service uses."""

from __future__ import annotations

import json
from pathlib import Path

from shared.config import load_config
from tests.helpers import REPO, run_triad
from tests.unit.test_cli_errors import assert_one_line_error

COMMIT = "c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4"
QWEN3_TEMPLATE = (REPO / "shared" / "data" / "templates" / "qwen3.jinja").read_text()


def cached_model(cache: Path, repo_id: str, dtype: str, revision: str = "main", commit: str = COMMIT) -> Path:
    """`repo_id` in huggingface_hub's cache layout: refs/<revision> naming snapshots/<commit>."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / revision).write_text(commit)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3", "torch_dtype": dtype}))
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN3_TEMPLATE}))
    return snapshot


def offline_cache(monkeypatch, cache: Path) -> None:
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE, as huggingface_hub read them when imported."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))


def test_a_hub_ids_template_dtype_and_parsers_come_from_its_cached_snapshot(tmp_path, monkeypatch):
    from inference.server import vllm_cli_args
    from services.models import resolve_model

    snapshot = cached_model(tmp_path, "Org/Name", "float16")
    offline_cache(monkeypatch, tmp_path)
    path = resolve_model("Org/Name")
    assert Path(path) == snapshot
    args = vllm_cli_args(load_config(None, ["model=Org/Name"]), path, cpu_build=lambda: True)
    assert args[args.index("--model") + 1] == str(snapshot)
    assert args[args.index("--dtype") + 1] == "float16"
    assert args[args.index("--tool-call-parser") + 1] == "hermes"
    assert args[args.index("--reasoning-parser") + 1] == "qwen3"


def test_a_hub_id_is_served_under_its_own_name_not_the_snapshots_path(tmp_path, monkeypatch):
    """As vLLM names a model it is handed by id: `orchestrator.servers.model_name = "Org/Name"` finds it."""
    from inference.server import parse_vllm_args, vllm_cli_args
    from services.models import resolve_model, served_as_hub_id

    cached_model(tmp_path, "Org/Name", "bfloat16")
    offline_cache(monkeypatch, tmp_path)
    cfg = served_as_hub_id(load_config(None, ["model=Org/Name"]))
    parsed = parse_vllm_args(vllm_cli_args(cfg, resolve_model("Org/Name"), cpu_build=lambda: True))
    assert parsed.served_model_name == ["Org/Name"]
    # vLLM's own sampling defaults, not the model's generation_config.json (Qwen3's top_k 20 and
    # top_p 0.95 would truncate what the server samples from, and its logprobs, below the policy)
    assert parsed.generation_config == "vllm"
    builtin = load_config(None, [])
    assert served_as_hub_id(builtin) is builtin


def test_a_revision_picks_its_own_snapshot(tmp_path, monkeypatch):
    from services.models import resolve_model

    cached_model(tmp_path, "Org/Name", "bfloat16")
    other = cached_model(tmp_path, "Org/Name", "float32", revision="v2", commit="f" * 40)
    offline_cache(monkeypatch, tmp_path)
    assert Path(resolve_model("Org/Name", "v2")) == other


def test_an_uncached_hub_id_offline_is_one_line_naming_the_id_the_cache_and_the_download(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path)}
    for command in ("inference", "trainer", "up"):
        r = run_triad(command, f"--set=run_dir={tmp_path}/run", "--set=model=Org/Missing", env=env)
        assert_one_line_error(
            r,
            "model 'Org/Missing' is not in the Hugging Face cache",
            str(tmp_path / "hub"),
            "HF_HUB_OFFLINE is set",
            "`hf download Org/Missing`",
        )


def test_the_real_size_cpu_overrides_make_each_qwen3_config_a_two_step_one_rank_cpu_run():
    from tests.realsize import CPU_OVERRIDES, REPO_ID

    for path in sorted((REPO / "configs").glob("qwen3-*.toml")):
        cfg = load_config(path, list(CPU_OVERRIDES))
        assert cfg.model == REPO_ID and cfg.max_steps == 2, path
        assert cfg.trainer.nproc == 1 and not cfg.trainer.devices and not cfg.inference.devices, path


def test_up_gives_its_services_the_hub_id_at_the_commit_it_resolved_kept_off_the_hub(tmp_path, monkeypatch):
    """`triad up` resolves a hub id once; each service is handed the id itself (so vLLM serves it
    under that name, as README says) at that snapshot's commit, offline: a `main` that moves on
    the Hub while the services start cannot give the trainer and vLLM different weights. Before
    2026-11-29 the services were handed the snapshot's path, and vLLM served the model under it."""
    from services.models import resolve_model
    from services.up import child_commands, child_env

    snapshot = cached_model(tmp_path, "Org/Name", "bfloat16")
    offline_cache(monkeypatch, tmp_path)
    cfg = load_config(None, ["model=Org/Name"])
    commands = child_commands(cfg, None, [], resolve_model(cfg.model))
    for name, command in commands.items():
        child = load_config(None, [a.removeprefix("--set=") for a in command if a.startswith("--set=")])
        assert (child.model, child.model_revision) == ("Org/Name", COMMIT), name
        assert Path(resolve_model(child.model, child.model_revision)) == snapshot
        assert child_env(cfg, name)["HF_HUB_OFFLINE"] == "1"
    local = load_config(None, [f"model={snapshot}"])
    assert f"--set=model={snapshot}" in child_commands(local, None, [], str(snapshot))["trainer"]
