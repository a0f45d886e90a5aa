"""Request and response bodies of the inference admin API (`/admin/...`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

ADMIN_PREFIX = "/admin"
WEIGHTS_ROUTE = "/weights"
PAUSE_ROUTE = "/pause"
RESUME_ROUTE = "/resume"
BROADCAST_INIT_ROUTE = "/broadcast/init"
BROADCAST_RECEIVE_ROUTE = "/broadcast/receive"


class WeightsInfo(BaseModel):
    version: int
    path: str
    base_path: str = Field(description="the model the server started from: version 0, always loadable")
    digest: str | None = Field(
        None,
        description="`shared/digest.py` digest of the tensors the workers loaded; None for the base model",
    )
    tensor_digests: dict[str, str] | None = Field(None, description="each loaded tensor's digest, by name")


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0)
    path: str = Field(min_length=1)


class PauseState(BaseModel):
    paused: bool


class BroadcastInit(BaseModel):
    """Join generation `generation` of the broadcast group at the next receive."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    generation: int = Field(ge=0)
    world_size: int = Field(ge=2)
    rank_offset: int = Field(ge=1, description="this server's first worker's rank; the trainer is 0")
    timeout_s: float = Field(gt=0)


class BroadcastState(BaseModel):
    workers: int = Field(description="ranks this server takes in the group")
    generation: int | None = None


class BroadcastReceive(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1)
    path: str = Field(
        min_length=1,
        description="the weights step directory of the version, holding the send-ready handshake",
    )


ADAPTERS_ROUTE = "/adapters"
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def served_adapter_name(name: str, version: int) -> str:
    """The model name requests use for version `version` of adapter `name`."""
    return f"{name}@v{version}"


class LoadAdapterRequest(BaseModel):
    """Serve version `version` of run `run_id`'s LoRA adapter `name` (its weights directory `path`)
    as model `<name>@v<version>`; the run's older version is unloaded."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=ADAPTER_NAME_PATTERN)
    run_id: str = Field(min_length=1)
    version: int = Field(ge=1)
    path: str = Field(min_length=1)


class AdapterInfo(BaseModel):
    name: str
    run_id: str
    version: int
    served_as: str
    path: str = Field(description="the version's directory, relative to the server's run directory")
    digest: str | None = None
    tensor_digests: dict[str, str] | None = Field(None, description="each adapter tensor's digest, by name")
    kept: list[str] = Field(
        default_factory=list,
        description="older versions still served (requests in flight at them finish), oldest first",
    )
    loaded_at: float


class AdaptersInfo(BaseModel):
    lora: bool = Field(description="whether the server was started with LoRA support")
    run_dir: str = Field("", description="the server's run directory: a load's `path` is relative to it")
    adapters: list[AdapterInfo]
