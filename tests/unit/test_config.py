import re
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
    cfg_file = write(tmp_path, "max_steps = 3\n[trainer.optim]\nlr = 0.1\n[trainer.loss]\neps_low = 0.3\n")
    monkeypatch.setenv("TRIAD_TRAINER__OPTIM__LR", "0.2")
    monkeypatch.setenv("TRIAD_SEED", "7")
    cfg = load_config(cfg_file, ["trainer.loss.eps_low=0.4", "seed=9"])
    assert cfg.max_steps == 3  # toml over default
    assert cfg.trainer.optim.lr == 0.2  # env over toml
    assert cfg.trainer.loss.eps_low == 0.4  # cli over toml
    assert cfg.seed == 9  # cli over env
    assert cfg.trainer.optim.max_grad_norm == 1.0  # default


def test_sections_read_from_toml_env_and_set(tmp_path, monkeypatch):
    text = (
        "[trainer.parallel]\npacking = true\n[trainer.checkpoint]\nevery = 5\n"
        '[weights]\ntransport = "broadcast"\n[weights.broadcast]\nport = 29999\n'
    )
    monkeypatch.setenv("TRIAD_WEIGHTS__KEEP", "7")
    cfg = load_config(write(tmp_path, text), ['trainer.loss.kind="gspo"', "trainer.checkpoint.keep=4"])
    assert cfg.trainer.parallel.packing and cfg.trainer.loss.kind == "gspo"
    assert (cfg.trainer.checkpoint.every, cfg.trainer.checkpoint.keep) == (5, 4)  # toml, then --set
    assert cfg.weights.transport == "broadcast" and cfg.weights.broadcast.port == 29999
    assert cfg.weights.keep == 7 and cfg.weights.sharded is False  # env, and a default


def test_a_string_option_takes_a_bare_number(tmp_path):
    cfg = load_config(write(tmp_path, ""), ["inference.cpus=0", "trainer.cpus=1"])
    assert (cfg.inference.cpus, cfg.trainer.cpus) == ("0", "1")


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
        ("", ['orchestrator.servers.urls=["gpu-1:8000"]'], "is not an http"),
        ("", ["max_async_level=3", "weights.keep=3"], r"weights\.keep .3. must be at least"),
        (
            "",
            ["trainer.loss.kind=cispo", "trainer.loss.importance=tis"],
            "needs trainer.loss.kind = 'ppo_clip'",
        ),
        (
            "",
            ["orchestrator.batch_size=2", "trainer.optim.optimizer_steps=9"],
            r"steps \(9\) is more than the",
        ),
        ("", ["trainer.loss.kl_target=base"], "bad config value for 'trainer.loss.kl_target'"),
        ("", ["trainer.lr=1e-6"], "config key 'trainer.lr' is now 'trainer.optim.lr'"),
        ("[trainer]\nkeep_weights = 5\n", [], "config key 'trainer.keep_weights' is now 'weights.keep'"),
        ("", ['weight_transport="broadcast"'], "config key 'weight_transport' is now 'weights.transport'"),
        (
            "",
            ["trainer.broadcast_port=1"],
            "config key 'trainer.broadcast_port' is now 'weights.broadcast.port'",
        ),
        (
            "",
            ["inference.backend=vllm", "weights.transport=broadcast"],
            "weights.transport = 'broadcast' needs triad's launcher, not inference.backend = 'vllm'",
        ),
        ("", ["orchestrator.backend=vllm"], "config key 'orchestrator.backend' is now 'inference.backend'"),
        (
            '[orchestrator]\ntool_parser = "hermes"\n',
            [],
            "config key 'orchestrator.tool_parser' is now 'inference.tool_parser'",
        ),
        (
            "",
            ["orchestrator.reasoning_parser=qwen3"],
            "config key 'orchestrator.reasoning_parser' is now 'inference.reasoning_parser'",
        ),
        (
            "[orchestrator]\neval_every = 5\n",
            [],
            "config key 'orchestrator.eval_every' is now 'orchestrator.eval.every'",
        ),
        (
            "",
            ["orchestrator.agent_timeout_s=60"],
            "config key 'orchestrator.agent_timeout_s' is now 'orchestrator.agents.timeout_s'",
        ),
        (
            "",
            ["orchestrator.proxy_token=x"],
            "config key 'orchestrator.proxy_token' is now 'orchestrator.agents.proxy_token'",
        ),
        (
            '[orchestrator]\nadvantage = "rloo"\n',
            [],
            "config key 'orchestrator.advantage' is now 'orchestrator.shaping.advantage'",
        ),
        (
            "",
            ["orchestrator.dynamic_sampling=true"],
            "config key 'orchestrator.dynamic_sampling' is now 'orchestrator.shaping.dynamic_sampling'",
        ),
        (
            "",
            ["inference.backend=vllm", "weights.snapshot_every=5"],
            r"^bad config: weights.snapshot_every = 5 publishes delta versions, which only triad's launcher "
            r"applies, and inference.backend is 'vllm': set weights.snapshot_every = 1, or use",
        ),
        ("", ["inference.backend=sglang", "weights.snapshot_every=2"], "inference.backend is 'sglang'"),
        (
            "",
            ['trainer.loss="cispo"'],
            "is a table .trainer.loss., not a value; the objective is trainer.loss.kind",
        ),
        (
            '[orchestrator]\nenv = "reverse"\n',
            [],
            "config key 'orchestrator.env' is now 'orchestrator.environment.name'",
        ),
        (
            "",
            ['orchestrator.inference_urls=["http://gpu-1:8000"]'],
            "config key 'orchestrator.inference_urls' is now 'orchestrator.servers.urls'",
        ),
        (
            "[orchestrator]\nmax_server_failures = 5\n",
            [],
            "config key 'orchestrator.max_server_failures' is now 'orchestrator.servers.max_failures'",
        ),
        ("", ["orchestrator.max_tokens=8"], "is now 'orchestrator.sampling.max_tokens'"),
        (
            "[orchestrator]\nchat = true\n",
            [],
            "config key 'orchestrator.chat' is a table .orchestrator.chat., not a value; its value of "
            "earlier versions is now 'orchestrator.chat.text_prompts'",
        ),
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


SHIPPED = [
    *sorted((REPO / "configs").glob("*.toml")),
    REPO / "services" / "embedded_default.toml",
    *sorted((REPO / "deploy").rglob("*.toml")),
]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_parses_and_names_a_loadable_environment(path):
    from orchestrator.environments import load_environment

    oc = load_config(path).orchestrator
    assert load_environment(oc.environment.name, oc.environment.args).name


def test_default_urls_do_not_leak_wildcard_hosts():
    cfg = load_config(None, ["inference.host=0.0.0.0", "inference.port=9000"])
    assert cfg.inference_urls() == ["http://127.0.0.1:9000"]
    cfg = load_config(None, ['orchestrator.servers.urls=["http://gpu-1:8000/"]'])
    assert cfg.inference_urls() == ["http://gpu-1:8000"]


def test_an_ipv6_loopback_host_gives_a_bracketed_url():
    cfg = load_config(None, ["inference.host=::1", "inference.port=9000"])
    assert cfg.inference_urls() == ["http://[::1]:9000"]


def test_admin_token_from_a_secret_file(tmp_path):
    secret = tmp_path / "admin_token"
    secret.write_text("s3cret\n")
    assert load_config(None, [f"inference.admin_token_file={secret}"]).inference.token() == "s3cret"
    assert load_config(None, ["inference.admin_token=direct"]).inference.token() == "direct"
    assert load_config(None, []).inference.token() is None
    with pytest.raises(TriadError, match="cannot read inference.admin_token_file"):
        load_config(None, [f"inference.admin_token_file={tmp_path / 'missing'}"]).inference.token()


def test_the_kubernetes_config_map_parses(tmp_path):
    """The TOML that deploy/k8s/triad.yaml mounts as the services' config file."""
    import yaml

    docs = yaml.safe_load_all((REPO / "deploy" / "k8s" / "triad.yaml").read_text())
    maps = [d for d in docs if d and d.get("kind") == "ConfigMap"]
    tomls = [text for m in maps for name, text in m["data"].items() if name.endswith(".toml")]
    assert tomls, "no TOML in the ConfigMap"
    for i, text in enumerate(tomls):
        path = tmp_path / f"k8s-{i}.toml"
        path.write_text(text)
        cfg = load_config(path)
        assert cfg.weights.keep >= cfg.max_async_level + 2


def documented_tomls() -> list[tuple[str, str]]:
    """(where, text) of every triad config block in the README and docs/ (not pyproject.toml ones)."""
    blocks = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        fence = "`" * 3
        for i, block in enumerate(re.findall(fence + r"toml\n(.*?)" + fence, doc.read_text(), re.S)):
            if "[project" not in block:
                blocks.append((f"{doc.name}#{i}", block))
    return blocks


@pytest.mark.parametrize("where, text", documented_tomls(), ids=lambda v: v if "#" in str(v) else "")
def test_every_documented_toml_parses(tmp_path, where, text):
    path = tmp_path / "doc.toml"
    path.write_text(text)
    load_config(path)


def test_documented_set_flags_parse():
    """Every `--set key=value` in the README and docs/ names a real key."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    flags = {f for doc in docs for f in re.findall(r"--set[= ]'?([\w.]+=[^\s'`]+)", doc.read_text())}
    assert flags
    for flag in sorted(flags - {"key=value"}):
        load_config(None, [flag])


def test_an_environment_variable_of_a_flat_orchestrator_key_names_its_table(monkeypatch):
    monkeypatch.setenv("TRIAD_ORCHESTRATOR__REQUEST_TIMEOUT_S", "30")
    with pytest.raises(TriadError) as caught:
        load_config(None, [])
    assert str(caught.value) == (
        "environment variable TRIAD_ORCHESTRATOR__REQUEST_TIMEOUT_S sets 'orchestrator.request_timeout_s', "
        "which is now 'orchestrator.servers.request_timeout_s' "
        "(TRIAD_ORCHESTRATOR__SERVERS__REQUEST_TIMEOUT_S)"
    )
    monkeypatch.delenv("TRIAD_ORCHESTRATOR__REQUEST_TIMEOUT_S")
    monkeypatch.setenv("TRIAD_ORCHESTRATOR__SERVERS__REQUEST_TIMEOUT_S", "30")
    assert load_config(None, []).orchestrator.servers.request_timeout_s == 30
