"""Trainer side of the weight broadcast (the handshake is in `shared/broadcast.py`).

Every rank takes part in gathering each parameter from FSDP2 (one at a time, so
memory stays bounded by a bucket); rank 0 alone hosts the TCPStore, talks to the
orchestrator through markers and broadcasts each dtype-grouped bucket to the
inference workers. Any failure or timeout makes `send` return False, and the
trainer writes the version as files instead.
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from shared.authstore import Gate, store_secret
from shared.broadcast import (
    Fallback,
    Receiving,
    SendReady,
    TensorSpec,
    plan_buckets,
    read_handshake,
    write_handshake,
)
from shared.config import BroadcastConfig
from shared.digest import tensor_digest
from shared.errors import TriadError
from shared.faults import TRAINER_CORRUPT_BUCKET, TRAINER_HOLD_BROADCAST, armed, hold
from shared.process_group import generation_store, make_group
from shared.rundir import Handshake, RunDir
from trainer.exported import published_parameters
from trainer.parallel import full_tensor

log = logging.getLogger("triad.trainer")
POLL_S = 0.02


def bound_store(host: str, port: int, timeout: timedelta):
    """The group's TCPStore, listening on `host` only: its own server listens on every
    interface, so it is handed a socket bound here."""
    from torch.distributed import TCPStore

    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        raise TriadError(
            f"cannot listen on weights.broadcast.host:port = {host}:{port} for the broadcast group: {e}"
        ) from None
    return TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=timeout, master_listen_fd=sock.detach()
    )


def hosted_store(bc: BroadcastConfig, token: str | None, run_id: str, timeout: timedelta):
    """The group's store and its gate: behind an authenticating gate on the configured address
    when the run has an admin token, else bound there directly (loopback-only runs)."""
    if token is None:
        log.warning("broadcast store on %s:%d is unauthenticated: no admin token", bc.host, bc.port)
        return bound_store(bc.host, bc.port, timeout), None
    store = bound_store("127.0.0.1", 0, timeout)
    try:
        gate = Gate(bc.host, bc.port, store.port, store_secret(token, run_id))
    except OSError as e:
        raise TriadError(f"weights.broadcast.host:port: {e}") from None
    log.info("broadcast store on %s:%d admits only peers holding the run's admin token", bc.host, bc.port)
    return store, gate


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class WeightSender:
    def __init__(
        self, bc: BroadcastConfig, rundir: RunDir, run_id: str, device: torch.device, token: str | None = None
    ) -> None:
        self.bc, self.rundir, self.run_id, self.device = bc, rundir, run_id, device
        self.rank = dist.get_rank()
        self.timeout = timedelta(seconds=bc.timeout_s)
        self.store, self.gate = (
            hosted_store(bc, token, run_id, self.timeout) if self.rank == 0 else (None, None)
        )
        self.generation: int | None = None
        self.group = None
        self.digest_s = 0.0  # of the last send

    def send(self, version: int, model: torch.nn.Module, tied: bool, dtype: torch.dtype) -> dict | None:
        """Collective over the trainer's ranks: once every bucket reached the group, the digest
        of each tensor sent (on rank 0; {} on the others), else None."""
        params = published_parameters(model, tied)
        specs = [TensorSpec(name=n, dtype=dtype_name(dtype), shape=list(p.shape)) for n, p in params]
        bucket_bytes = int(self.bc.bucket_mb * 2**20)
        decision = [self.handshake(version, specs, bucket_bytes) if self.rank == 0 else None]
        dist.broadcast_object_list(decision, src=0)
        if decision[0] is None:
            return None
        started = time.monotonic()
        ok = [self.join(decision[0]) if self.rank == 0 else True]
        dist.broadcast_object_list(ok, src=0)
        if not ok[0]:
            return None
        digests: dict[str, str] = {}
        self.digest_s = 0.0
        for index, bucket in enumerate(plan_buckets(specs, bucket_bytes)):
            parts = [full_tensor(params[i][1]).detach().to(dtype).flatten() for i in bucket]  # collective
            if self.rank == 0 and ok[0]:
                digest_started = time.monotonic()
                digests.update(
                    (specs[i].name, tensor_digest(part.view(specs[i].shape)))  # the shape is in the digest
                    for i, part in zip(bucket, parts, strict=True)
                )
                self.digest_s += time.monotonic() - digest_started
                if index == 0:
                    hold(TRAINER_HOLD_BROADCAST, version)  # tests only: a receiver is killed meanwhile
                ok[0] = self.broadcast(self.bucket(parts, version, index), version)
        dist.broadcast_object_list(ok, src=0)
        if ok[0] and self.rank == 0:
            log.info("broadcast version %d in %.3f s", version, time.monotonic() - started)
        return digests if ok[0] else None

    def bucket(self, parts: list[torch.Tensor], version: int, index: int) -> torch.Tensor:
        flat = torch.cat(parts).to(self.device)
        if index == 0 and armed(TRAINER_CORRUPT_BUCKET, version):  # tests only: a bit flipped on the way
            flat.view(torch.uint8)[0] ^= 1
        return flat

    def handshake(self, version: int, specs: list[TensorSpec], bucket_bytes: int) -> Receiving | None:
        """Say the update is ready; wait for the orchestrator's answer (None: use files)."""
        self.rundir.weights.clear(version)
        ready = SendReady(run_id=self.run_id, version=version, tensors=specs, bucket_bytes=bucket_bytes)
        write_handshake(self.rundir, version, Handshake.SEND_READY, ready)
        deadline = time.monotonic() + self.bc.timeout_s
        while time.monotonic() < deadline:
            answer = read_handshake(self.rundir, version, Handshake.RECEIVING, Receiving, self.run_id)
            if answer is not None and answer.version == version:
                return answer
            fallback = read_handshake(self.rundir, version, Handshake.FALLBACK, Fallback, self.run_id)
            if fallback is not None:
                log.warning("version %d goes by files: %s", version, fallback.reason)
                return None
            time.sleep(POLL_S)
        waited = self.bc.timeout_s
        where = self.rundir.handshake_key(version, Handshake.SEND_READY)
        log.warning("no answer to %s within %.0f s: writing files", where, waited)
        return None

    def join(self, receiving: Receiving) -> bool:
        if self.generation == receiving.generation:
            return True
        self.group, self.generation = None, None
        try:
            store = generation_store(self.store, receiving.generation)
            cuda = self.device.type == "cuda"
            self.group = make_group(store, 0, receiving.world_size, self.timeout, cuda)
        except Exception as e:
            log.warning("joining broadcast generation %d failed (%r): writing files", receiving.generation, e)
            return False
        self.generation = receiving.generation
        return True

    def broadcast(self, flat: torch.Tensor, version: int) -> bool:
        try:
            self.group.broadcast(flat, 0).wait()
            return True
        except Exception as e:
            log.warning("broadcast of version %d failed (%r): writing files", version, e)
            self.group, self.generation = None, None  # a broken group is never reused
            return False
