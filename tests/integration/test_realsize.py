"""Every shipped Qwen3 config at its real size on CPU: `model = "Qwen/Qwen3-0.6B"` resolved from a
Hugging Face cache with `HF_HUB_OFFLINE=1` (`tests/realsize.py` writes it: the real config, random
weights), the CPU overrides of `tests.realsize.CPU_OVERRIDES` on the command line, real vLLM, a real
torchrun trainer and the config's own environment, for 2 steps: full weights in a local run
directory, then delta versions (`weights.snapshot_every = 3`: version 2 a delta) through an S3 server (moto).

596M parameters: minutes a run and a trainer peak of about 14 GB, so left out unless asked for:
`./triad test -m realsize` (README, "Real size on CPU").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.rundir import RunDir
from tests.helpers import REPO, free_port, run_triad
from tests.realsize import CPU_OVERRIDES, REPO_ID, ensure_realsize_model, realsize_env
from tests.s3 import MotoServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.realsize]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("qwen3-*.toml"))
STEPS = 2
BUCKET = "triad-realsize"
RUN_TIMEOUT_S = 3000


@pytest.fixture(scope="module")
def realsize_model() -> Path:
    return ensure_realsize_model()


@pytest.fixture(scope="module")
def hub_env(realsize_model) -> dict[str, str]:
    """Where the model was built, fixed before a test points TRIAD_CACHE elsewhere."""
    return realsize_env()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    server.create_bucket(BUCKET)
    yield server
    server.close()


def triad_up(config: str, run_dir: str, extra: list[str], env: dict[str, str], cwd: Path) -> None:
    sets = [f"run_dir={run_dir}", f"inference.port={free_port()}", *CPU_OVERRIDES, *extra]
    args = ["up", "-c", str(REPO / "configs" / config), *[f"--set={s}" for s in sets]]
    result = run_triad(*args, timeout=RUN_TIMEOUT_S, env=env, cwd=cwd)
    assert result.returncode == 0, (
        f"triad up -c {config} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )


def check_run(rundir: RunDir, snapshot: Path) -> None:
    """2 steps trained and served, from the cache's snapshot."""
    assert rundir.read_run().config["model"] == REPO_ID
    assert rundir.metrics.rows("inference")[0]["path"] == str(snapshot)
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == list(range(1, STEPS + 1))
    served = [r["version"] for r in rundir.metrics.rows("inference")]
    assert served[0] == 0 and served[-1] == STEPS, served
    assert rundir.weights.steps() == list(range(1, STEPS + 1))


@pytest.mark.parametrize("config", CONFIGS)
def test_each_qwen3_config_runs_two_steps_at_real_size_from_the_hf_cache(
    config, realsize_model, hub_env, tmp_path
):
    triad_up(config, "run", [], hub_env, tmp_path)
    rundir = RunDir(tmp_path / "run")
    check_run(rundir, realsize_model)
    for version in (1, 2):
        assert getattr(rundir.weights.marker(version, rundir.read_run().run_id), "delta_base", None) is None


@pytest.mark.parametrize("config", CONFIGS)
def test_each_qwen3_config_runs_delta_versions_through_s3(
    config, realsize_model, hub_env, store, tmp_path, monkeypatch
):
    """`snapshot_every = 3`: version 1 a full snapshot, version 2 a delta from it, through moto."""
    url = f"s3://{BUCKET}/{Path(config).stem}"
    env = {**store.env(), "TRIAD_CACHE": str(tmp_path / "cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    triad_up(config, url, ["weights.snapshot_every=3"], {**hub_env, **env}, tmp_path)
    rundir = RunDir(url)
    check_run(rundir, realsize_model)
    run_id = rundir.read_run().run_id
    assert getattr(rundir.weights.marker(1, run_id), "delta_base", None) is None
    assert rundir.weights.marker(2, run_id).delta_base == 1
