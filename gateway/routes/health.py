"""Health, the models the workers serve, and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.auth import REQUIRE_KEY
from gateway.deps import ServicesDep
from gateway.errors import documented
from shared.errors import BackendUnavailable
from shared.workers import live_workers

router = APIRouter(tags=["health"])


@router.get("/health", responses=documented(503))
async def health(services: ServicesDep) -> dict[str, Any]:
    """200 when Redis answers and a worker has a live heartbeat; 503 with the reason otherwise."""
    try:
        workers = await live_workers(services.redis, services.keys)
    except BackendUnavailable as exc:
        raise BackendUnavailable(exc.message, redis="unreachable") from exc
    if not workers:
        raise BackendUnavailable("no worker has a live heartbeat", redis="ok", workers=0)
    return {"status": "ok", "redis": "ok", "workers": len(workers)}


@router.get("/v1/models", dependencies=[REQUIRE_KEY], responses=documented(401, 503))
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


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(services: ServicesDep) -> Response:
    """Prometheus metrics; the queue's figures are read from Redis for each scrape."""
    await services.metrics.read_queue(services.redis, services.keys)
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
