"""Request dependencies, declared once: what the lifespan built, handed to the routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Request

from gateway.metrics import GatewayMetrics
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


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(_services)]
