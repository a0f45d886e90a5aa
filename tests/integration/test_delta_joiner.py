"""A real vLLM server joining at version 17 of a run with `weights.snapshot_every = 10`: it
loads snapshot 10 and deltas 11..17, and serves 17 exactly (its workers' digests of what they
loaded are the trainer's); a follower then takes 18 as one delta on top of 17."""

from __future__ import annotations

import httpx
import pytest
import torch

from shared.admin_api import ADMIN_PREFIX, WEIGHTS_ROUTE
from shared.rundir import RunDir
from tests.helpers import Server

pytestmark = pytest.mark.integration
RUN_ID = "run-joiner"


class Trainer:
    """The tiny model's weights after small fp32 updates, published in bf16 through the
    trainer's `VersionWriter` (snapshots at 1 and 10, deltas between)."""

    def __init__(self, model_dir: str, rundir: RunDir) -> None:
        from transformers import AutoModelForCausalLM

        from trainer.versions import Metadata, VersionWriter

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.writer = VersionWriter(rundir, Metadata(rundir, self.model.config.save_pretrained), 10, 3)
        self.gen, self.version = torch.Generator().manual_seed(0), 0

    def publish_upto(self, last: int) -> None:
        from trainer.publish import export_state_dict

        while self.version < last:
            self.version += 1
            with torch.no_grad():
                for p in self.model.parameters():
                    p.add_(torch.randn(p.shape, generator=self.gen) * 1e-3)
            state = export_state_dict(self.model.state_dict(), tied_embeddings=True, dtype=torch.bfloat16)
            self.writer.write(self.version, RUN_ID, state, snapshot=False)


def load(server: Server, rundir: RunDir, version: int) -> dict:
    body = {"version": version, "path": rundir.weights.relative(version)}
    r = httpx.post(server.url + ADMIN_PREFIX + WEIGHTS_ROUTE, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_joiner_at_17_loads_snapshot_10_and_deltas_11_to_17_then_serves_17_exactly(tmp_path, tiny_model):
    rundir = RunDir(tmp_path / "run")
    trainer = Trainer(tiny_model, rundir)
    trainer.publish_upto(17)
    assert rundir.weights.steps() == list(range(10, 18))  # the snapshot and its deltas are kept
    server = Server(rundir.root, tiny_model, tmp_path / "inference.log")
    try:
        server.wait_healthy()
        served = load(server, rundir, 17)
        marker = rundir.weights.marker(17, RUN_ID)
        assert served["version"] == 17 and served["digest"] == marker.digest
        assert served["tensor_digests"] == marker.tensor_digests
        trainer.publish_upto(18)
        assert load(server, rundir, 18)["digest"] == rundir.weights.marker(18, RUN_ID).digest
        generated = httpx.post(
            server.url + "/v1/completions",
            json={"model": tiny_model, "prompt": "1+1=", "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert generated.status_code == 200, generated.text
    finally:
        server.stop()
    log = (tmp_path / "inference.log").read_text(errors="replace")
    assert "rebuilding from the snapshot of version 10" in log
    assert log.count("rebuilding from the snapshot") == 1  # 18 came on top of the served 17
    assert "rebuilt weights version 17" in log and "rebuilt weights version 18" in log
