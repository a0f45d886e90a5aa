from pathlib import Path

import pytest

from shared.config import load_config, overrides_to_dict
from shared.errors import TriadError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_precedence_cli_over_env_over_toml_over_default(tmp_path, monkeypatch):
    cfg_file = write(tmp_path, "max_steps = 3\n[trainer]\nlr = 0.1\neps_low = 0.3\n")
    monkeypatch.setenv("TRIAD_TRAINER__LR", "0.2")
    monkeypatch.setenv("TRIAD_SEED", "7")
    cfg = load_config(cfg_file, ["trainer.eps_low=0.4", "seed=9"])
    assert cfg.max_steps == 3  # toml over default
    assert cfg.trainer.lr == 0.2  # env over toml
    assert cfg.trainer.eps_low == 0.4  # cli over toml
    assert cfg.seed == 9  # cli over env
    assert cfg.trainer.max_grad_norm == 1.0  # default


def test_override_values_are_toml_typed():
    assert overrides_to_dict(["a.b=3", "c=true", "d=[1, 2]", "e=/some/path", 'f="x"']) == {
        "a": {"b": 3},
        "c": True,
        "d": [1, 2],
        "e": "/some/path",
        "f": "x",
    }


@pytest.mark.parametrize(
    ("toml", "sets", "message"),
    [
        ("[trainer]\nlrr = 1\n", [], "unknown config key 'trainer.lrr'"),
        ("", ["bogus=1"], "unknown config key 'bogus'"),
        ("[orchestra]\nx = 1\n", [], "unknown config key 'orchestra'"),
        ("max_steps = 'many'\n", [], "bad config value for 'max_steps'"),
        ("", ["max_async_level=-1"], "bad config value for 'max_async_level'"),
        ("max_steps = \n", [], "is not valid TOML"),
        ("", ['orchestrator.inference_urls=["gpu-1:8000"]'], "is not an http"),
        ("", ["max_async_level=3", "trainer.keep_weights=3"], "keep_weights .3. must be at least"),
        ("", ["trainer.loss=cispo", "trainer.importance=tis"], "needs trainer.loss = 'ppo_clip'"),
        ("", ["orchestrator.batch_size=2", "trainer.optimizer_steps=9"], r"steps \(9\) is more than the"),
        ("", ["trainer.kl_target=base"], "bad config value for 'trainer.kl_target'"),
    ],
)
def test_bad_config_names_the_key(tmp_path, toml, sets, message):
    with pytest.raises(TriadError, match=message):
        load_config(write(tmp_path, toml), sets)


def test_missing_config_file(tmp_path):
    with pytest.raises(TriadError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_bad_set_syntax():
    with pytest.raises(TriadError, match="key=value"):
        load_config(None, ["max_steps"])


SHIPPED = [*sorted((REPO / "configs").glob("*.toml")), REPO / "services" / "embedded_default.toml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_parses_and_names_a_loadable_environment(path):
    from orchestrator.environments import load_environment

    oc = load_config(path).orchestrator
    assert load_environment(oc.env, oc.env_args).name


def test_default_urls_do_not_leak_wildcard_hosts():
    cfg = load_config(None, ["inference.host=0.0.0.0", "inference.port=9000"])
    assert cfg.inference_urls() == ["http://127.0.0.1:9000"]
    cfg = load_config(None, ['orchestrator.inference_urls=["http://gpu-1:8000/"]'])
    assert cfg.inference_urls() == ["http://gpu-1:8000"]


def test_admin_token_from_a_secret_file(tmp_path):
    secret = tmp_path / "admin_token"
    secret.write_text("s3cret\n")
    assert load_config(None, [f"inference.admin_token_file={secret}"]).inference.token() == "s3cret"
    assert load_config(None, ["inference.admin_token=direct"]).inference.token() == "direct"
    assert load_config(None, []).inference.token() is None
    with pytest.raises(TriadError, match="cannot read inference.admin_token_file"):
        load_config(None, [f"inference.admin_token_file={tmp_path / 'missing'}"]).inference.token()
