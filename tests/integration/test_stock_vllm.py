"""A stock vLLM server (`inference.backend = "vllm"`): vLLM's own RL routes load triad's
versions through the `triad_disk` engine its plugin entry point registers."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from statistics import mean

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file, save_file

from orchestrator.servers.backends.base import DigestMismatch
from orchestrator.servers.backends.detection import detect
from orchestrator.servers.backends.stock_vllm import VLLMRoutes
from orchestrator.servers.client import InferenceClient
from shared.errors import TriadError
from shared.rundir import RunDir
from tests.helpers import Server, free_port, run_triad

pytestmark = pytest.mark.integration
STEPS = 50


def write_version(base: Path, target: Path, shift: float, odd: tuple[str, float] | None = None) -> None:
    """The base model's tensors moved by `shift`; `odd`: one tensor's name, moved by its own shift."""
    target.mkdir(parents=True)
    for file in base.glob("*.safetensors"):
        tensors = {k: v + (odd[1] if odd and k == odd[0] else shift) for k, v in load_file(file).items()}
        save_file(tensors, target / file.name)


def half_written(base: Path, target: Path, shift: float) -> None:
    """A version whose first file holds half the base model's tensors moved by `shift` and whose
    second is cut short: loading it fails after half the layers took new weights."""
    target.mkdir(parents=True)
    tensors = {k: v + shift for file in base.glob("*.safetensors") for k, v in load_file(file).items()}
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[: len(names) // 2]}, target / "a.safetensors")
    save_file({k: tensors[k] for k in names[len(names) // 2 :]}, target / "b.safetensors")
    whole = (target / "b.safetensors").read_bytes()
    (target / "b.safetensors").write_bytes(whole[: len(whole) // 2])


def test_the_weight_checker_catches_a_skipped_parameter_and_a_failed_load_is_rolled_back(
    tmp_path: Path, tiny_model: str
) -> None:
    server = Server(tmp_path, tiny_model, tmp_path / "vllm.log", "inference.backend=vllm")
    try:
        server.wait_healthy()
        base = Path(tiny_model)
        norm = "model.norm.weight"
        assert norm in load_file(next(base.glob("*.safetensors")))
        write_version(base, tmp_path / "v1", 0.01)
        write_version(base, tmp_path / "v2", 0.02)
        write_version(base, tmp_path / "v3", 0.03, odd=(norm, 0.02))  # the norm as v2 had it
        half_written(base, tmp_path / "v4", 0.04)
        write_version(base, tmp_path / "v5", 0.05)

        async def run() -> None:
            client = InferenceClient(server.url, None, 120)
            try:
                await client.wait_ready(120, None)
                backend = await detect(client, "auto", tmp_path, timeout=120)
                assert isinstance(backend, VLLMRoutes)
                assert (await backend.load(1, "v1")).version == 1
                held = dict(backend.checksums)
                assert (await backend.load(2, "v2")).version == 2  # every parameter moved
                moved = [k for k in held if backend.checksums[k] != held[k]]
                assert any(k.endswith("model.norm.weight") for k in moved), moved
                assert (await backend.current()).version == 2  # vLLM's own weight_version
                at_v2 = dict(backend.checksums)
                with pytest.raises(
                    DigestMismatch, match=r"version 3 but 1 of \d+ parameters .*model\.norm\.weight"
                ):
                    await backend.load(3, "v3")
                assert backend.checksums == at_v2 and (await backend.current()).version == 2  # rolled back
                with pytest.raises(TriadError, match=r"could not load version 4: .*back to version 2$"):
                    await backend.load(4, "v4")  # fails after loading half its tensors
                assert backend.checksums == at_v2 and (await backend.current()).version == 2
                completion = (await client.complete("1+1=", 1, 4, 1.0))[0]
                assert all(math.isfinite(x) for x in completion.logprobs), completion
                assert (await backend.load(5, "v5")).version == 5  # the next load is a whole one again
            finally:
                await client.close()

        asyncio.run(run())
    finally:
        server.stop()


@pytest.mark.slow
def test_triad_up_on_stock_vllm_learns_within_eta(tmp_path: Path, tiny_model: str) -> None:
    """The embedded default for 50 steps with `inference.backend = "vllm"`."""
    run_dir = tmp_path / "run"
    sets = [
        f"run_dir={run_dir}",
        f"max_steps={STEPS}",
        f"inference.port={free_port()}",
        "inference.backend=vllm",
        f"orchestrator.keep_rollouts={2 * STEPS}",
    ]
    result = run_triad("up", *[f"--set={s}" for s in sets], timeout=900)
    rundir = RunDir(run_dir)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(rundir.logs_dir.glob("*.log")))
    assert result.returncode == 0, f"triad up failed:\n{result.stdout}\n{result.stderr}\n{logs}"
    rows = rundir.metrics.rows("orchestrator")
    served = [r["served_version"] for r in rows]
    assert served == sorted(served) and served[-1] >= STEPS - 2, served  # new weights, eta 1
    for step in range(1, STEPS + 1):
        versions = pq.read_table(rundir.batch_file(step), columns=["policy_version"]).column(0).to_pylist()
        assert all(0 <= step - 1 - v <= 1 for v in versions), (step, versions)  # within eta = 1
    rewards = [r["reward_mean"] for r in rows]
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    print(f"stock vLLM, {STEPS} steps: reward {first:.3f} -> {last:.3f}")
    assert last - first >= 0.1, f"reward {first:.3f} -> {last:.3f}: no clear rise"
