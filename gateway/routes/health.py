"""Health, the models the workers serve, and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.deps import ServicesDep
from shared.errors import BackendUnavailable
from shared.redis_client import redis_errors
from shared.workers import live_workers

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(services: ServicesDep) -> dict[str, Any]:
    """200 when Redis answers and a worker has a live heartbeat; 503 with the reason otherwise."""
    with redis_errors():
        await services.redis.ping()
    workers = await live_workers(services.redis, services.keys)
    if not workers:
        raise BackendUnavailable("no worker has a live heartbeat", redis="ok", workers=0)
    return {"status": "ok", "redis": "ok", "workers": len(workers)}


@router.get("/v1/models")
async def models(services: ServicesDep) -> dict[str, Any]:
    """The models live workers serve, in OpenAI's list shape."""
    by_model: dict[str, dict[str, Any]] = {}
    for worker in await live_workers(services.redis, services.keys):
        entry = by_model.setdefault(
            worker.model,
            {
                "id": worker.model,
                "object": "model",
                "created": int(worker.started_at),
                "owned_by": "streampool",
                "max_model_len": worker.max_model_len,
                "workers": 0,
            },
        )
        entry["workers"] += 1
        entry["created"] = min(entry["created"], int(worker.started_at))
    return {"object": "list", "data": list(by_model.values())}


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
