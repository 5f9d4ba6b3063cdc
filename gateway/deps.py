"""Request dependencies, declared once: what the lifespan built, handed to the routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Path, Request

from gateway.auth import Owner
from gateway.metrics import GatewayMetrics
from gateway.prompt_limit import PromptLimit
from gateway.relay import Relay
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys


@dataclass(frozen=True)
class Services:
    """Everything a gateway process shares between requests."""

    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    store: JobStore
    relay: Relay
    metrics: GatewayMetrics
    prompt_limit: PromptLimit


async def _services(request: Request) -> Services:
    """Async, as every dependency here: FastAPI runs a plain function in its thread pool (a hop)."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(_services)]

JobIdPath = Annotated[str, Path(max_length=64, description="job id")]


async def _owned_job_id(job_id: JobIdPath, owner: Owner, services: ServicesDep) -> str:
    await services.store.check_owner(job_id, owner)
    return job_id


OwnedJobId = Annotated[str, Depends(_owned_job_id)]
"""The path's job id, once it is known to be the caller's: any other key gets 404 for it."""
