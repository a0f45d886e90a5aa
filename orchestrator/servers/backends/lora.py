"""`triad-lora`: a LoRA run's adapter on triad's server, beside other runs' adapters."""

from __future__ import annotations

import logging
from pathlib import Path

from orchestrator.servers.client import InferenceClient
from shared.admin_api import AdapterInfo, LoadAdapterRequest, WeightsInfo, served_adapter_name
from shared.config import TriadConfig
from shared.errors import TriadError
from shared.objectstore import is_object_url

log = logging.getLogger("triad.orchestrator")


class AdapterLoads:
    """A LoRA run's adapter on triad's server, beside other runs' adapters: version V is served
    as `<name>@v<V>`, loaded from `prefix + path` (the server reads paths relative to its own
    run directory, which holds this run's at `prefix`); version 0 is the base model."""

    kind, updates = "triad-lora", True
    lists_prompts = True  # vLLM's completions API

    def __init__(self, client: InferenceClient, name: str, run_id: str, prefix: str, timeout: float) -> None:
        self.client, self.name, self.run_id, self.prefix, self.timeout = client, name, run_id, prefix, timeout

    def model(self, version: int) -> str | None:
        return served_adapter_name(self.name, version) if version else None

    async def current(self) -> WeightsInfo:
        listed = await self.client.admin.adapters()
        if listed is None:
            raise TriadError(f"{self.client.base_url} has no /admin/adapters route: it cannot load adapters")
        held = next((a for a in listed.adapters if a.name == self.name), None)
        if held is None:
            return WeightsInfo(version=0, path="", base_path="")
        if held.run_id != self.run_id:
            raise TriadError(
                f"{self.client.base_url}: adapter name {self.name!r} is owned by run {held.run_id!r}, "
                f"not this run {self.run_id!r}: set another orchestrator.servers.adapter_name"
            )
        return self.as_weights(held)

    def as_weights(self, held: AdapterInfo) -> WeightsInfo:
        return WeightsInfo(
            version=held.version,
            path=held.path.removeprefix(self.prefix),
            base_path="",
            digest=held.digest,
            tensor_digests=held.tensor_digests,
        )

    async def load(self, version: int, path: str) -> WeightsInfo:
        if version == 0:  # requests go to the base model; the adapter stays until it idles out
            return WeightsInfo(version=0, path="", base_path="")
        path = self.prefix + path
        body = LoadAdapterRequest(name=self.name, run_id=self.run_id, version=version, path=path)
        held = await self.client.admin.load_adapter(body, self.timeout)
        if held.version != version:
            raise TriadError(
                f"{self.client.base_url} was told to load adapter version {version} "
                f"but serves {held.served_as}"
            )
        return self.as_weights(held)


def run_dir_prefix(run_dir: Path | str, server_run_dir: str, url: str) -> str:
    """Where `run_dir` lies inside the server's run directory, as a path prefix ('' for the
    server's own); TriadError naming the server if it lies outside."""
    mine, theirs = str(run_dir).rstrip("/"), server_run_dir.rstrip("/")
    if is_object_url(mine) or is_object_url(theirs):
        inside = mine == theirs or mine.startswith(theirs + "/")
        relative = mine[len(theirs) :].strip("/") if inside else None
    else:
        try:
            relative = Path(mine).resolve().relative_to(Path(theirs)).as_posix()
        except ValueError:
            relative = None
    if relative is None:
        raise TriadError(
            f"run_dir {run_dir} is not inside the run directory of {url} "
            f"({server_run_dir or 'not reported'}): "
            "the server reads adapters relative to its own run directory, so a run sharing it must keep "
            "its run_dir inside that one"
        )
    return "" if relative in ("", ".") else relative + "/"


async def adapter_backend(client: InferenceClient, cfg: TriadConfig, run_id: str) -> AdapterLoads:
    """The `triad-lora` backend for this run, once the server can serve its adapter: TriadError
    naming the server if it has no adapter routes or no LoRA support, cannot see the run
    directory, or serves the adapter name for another run."""
    url, oc, kind = client.base_url, cfg.orchestrator, cfg.inference.backend
    if kind not in ("auto", "triad"):
        raise TriadError(f"inference.backend = {kind!r} cannot load LoRA adapters: use 'triad'")
    listed = await client.admin.adapters()
    if listed is None:
        raise TriadError(
            f"{url} has no /admin/adapters route: a LoRA run (trainer.lora.rank > 0) needs "
            "triad's inference server"
        )
    if not listed.lora:
        raise TriadError(
            f"{url} has no LoRA support: start it with inference.vllm_args = ['--enable-lora', "
            "'--max-lora-rank', '<rank>', '--max-loras', '<2 x runs sharing it>']"
        )
    prefix = run_dir_prefix(cfg.run_dir, listed.run_dir, url)
    name = oc.servers.adapter_name or f"run-{run_id}"
    backend = AdapterLoads(client, name, run_id, prefix, oc.servers.weight_load_timeout_s)
    await backend.current()  # a name another run owns is refused here
    log.info("%s: LoRA adapter %r of run %s (run_dir at %r in the server's)", url, name, run_id, prefix)
    return backend
