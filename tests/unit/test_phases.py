"""A collective that fails or times out is reported with the phase the trainer was in."""

import pytest
import torch
import torch.distributed as dist

from shared.errors import TriadError
from trainer.phases import BROADCAST, CHECKPOINT, GATHER_FOR_PUBLISH, collective_phase


@pytest.mark.parametrize("phase", [GATHER_FOR_PUBLISH, CHECKPOINT, BROADCAST])
def test_a_timed_out_collective_names_its_phase(phase):
    gloo = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms\nmore"
    with pytest.raises(TriadError) as caught, collective_phase(phase, 1800):
        raise dist.DistBackendError(gloo)
    message = str(caught.value)
    assert f"phase '{phase}'" in message and "trainer rank 0" in message
    assert "collective_timeout_s = 1800" in message and "Timed out waiting 1800000ms" in message
    assert "\n" not in message


def test_other_errors_and_success_pass_through():
    with collective_phase(CHECKPOINT, 5):
        value = 1 + 1
    assert value == 2
    with pytest.raises(ValueError, match="not a collective"), collective_phase(CHECKPOINT, 5):
        raise ValueError("not a collective")
    with pytest.raises(TriadError, match="^own$"), collective_phase(CHECKPOINT, 5):
        raise TriadError("own")
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes"), collective_phase(CHECKPOINT, 5):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")
    with pytest.raises(torch.OutOfMemoryError), collective_phase(CHECKPOINT, 5):
        raise torch.OutOfMemoryError("out of memory while the store was busy")
    with (
        pytest.raises(TriadError, match="phase 'checkpoint save and barrier'"),
        collective_phase(CHECKPOINT, 5),
    ):
        raise RuntimeError("[gloo] Connection closed by peer")
