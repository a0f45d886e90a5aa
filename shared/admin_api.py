"""Request and response bodies of the inference admin API (`/admin/...`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

ADMIN_PREFIX = "/admin"
WEIGHTS_ROUTE = "/weights"
PAUSE_ROUTE = "/pause"
RESUME_ROUTE = "/resume"


class WeightsInfo(BaseModel):
    version: int
    path: str
    base_path: str = Field(description="the model the server started from: version 0, always loadable")


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0)
    path: str = Field(min_length=1)


class PauseState(BaseModel):
    paused: bool
