"""Health, the models the gateway knows, and Prometheus metrics."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.auth import REQUIRE_KEY, Operator
from gateway.deps import Services, ServicesDep
from gateway.errors import documented
from shared.errors import BackendUnavailable
from shared.models import queue_depths
from shared.redis_client import redis_errors

router = APIRouter(tags=["health"])


@router.get("/health", responses=documented(503))
async def health(services: ServicesDep) -> dict[str, Any]:
    """200 when the gateway can queue jobs: Redis answers, and a worker has a live heartbeat or a
    model is known (declared, or announced by a worker once), whose jobs wait for a worker, as an
    autoscaler that starts workers from zero needs; 503 with the reason otherwise.

    Unauthenticated, so it reads what admission read at most a second ago: callers cannot make
    Redis work harder by asking more often.
    """
    try:
        workers = await services.admission.live_workers()
        models = (await services.admission.catalog()).entries
    except BackendUnavailable as exc:
        raise BackendUnavailable(exc.message, redis="unreachable") from exc
    if not workers and not models:
        raise BackendUnavailable(
            "no worker has a live heartbeat and no model is declared", redis="ok", workers=0
        )
    return {"status": "ok", "redis": "ok", "workers": len(workers), "models": len(models)}


@router.get("/v1/models", dependencies=[REQUIRE_KEY], responses=documented(401, 503))
async def models(services: ServicesDep) -> dict[str, Any]:
    """Every model the gateway knows (declared, or announced by a worker), under each of its names,
    and the adapters of each, in OpenAI's list shape."""
    return {"object": "list", "data": list((await model_listing(services)).values())}


async def model_listing(services: Services) -> dict[str, dict[str, Any]]:
    """Each name a request may give (a model's canonical name, its aliases, its adapters' names) as
    OpenAI describes a model, with vLLM's `root` (an adapter's path), `parent` (an adapter's model) and
    `max_model_len` (vLLM's benchmark client reads `root`), and streampool's live `workers`,
    `queue_depth` and `engine_args` (each distinct engine configuration its live workers announce) of
    the model behind it."""
    catalog = await services.admission.catalog()
    workers = await services.admission.live_workers()
    depths = await queue_depths(services.redis, services.keys, catalog.entries)
    listing: dict[str, dict[str, Any]] = {}
    for entry in catalog.entries.values():
        started = [worker.started_at for worker in workers if worker.model == entry.name]
        # Each distinct engine configuration among its live workers (one, where its pool is uniform).
        engines = [
            worker.engine_args for worker in workers if worker.model == entry.name and worker.engine_args
        ]
        common = {
            "object": "model",
            "created": int(min(started, default=entry.last_seen or 0)),
            "owned_by": "streampool",
            "max_model_len": entry.max_model_len,
            "workers": catalog.workers[entry.name],
            "queue_depth": depths[entry.name],
            "engine_args": [dict(args) for args in dict.fromkeys(tuple(sorted(e.items())) for e in engines)],
        }
        for name in [entry.name, *entry.aliases]:
            listing[name] = {"id": name, "root": entry.name, "parent": None, **common}
        for adapter in entry.adapters:
            root = entry.adapter_paths.get(adapter, adapter)
            listing.setdefault(adapter, {"id": adapter, "root": root, "parent": entry.name, **common})
    return listing


@router.get("/metrics", response_class=PlainTextResponse, responses=documented(401))
async def metrics(services: ServicesDep, operator: Operator) -> Response:
    """Prometheus metrics; the queue's figures are read from Redis for each scrape. The series that
    name a tenant only for the metrics token (401 for a wrong one): this port is the clients'."""
    await services.metrics.read_queue(lambda: _queue_figures(services, operator))
    return Response(services.metrics.latest(tenants=operator), media_type=CONTENT_TYPE_LATEST)


async def _queue_figures(
    services: Services, tenants: bool
) -> tuple[dict[str, tuple[int, int]], dict[str, str], dict[str, str] | None]:
    """Each known model's queued jobs (its queue's length) and running ones (its workers' heartbeats),
    the jobs its deadlines ended, and where `tenants`, the tenants' totals of jobs and tokens."""
    catalog = await services.admission.catalog()
    running: Counter[str] = Counter()
    for worker in await services.admission.live_workers():
        running[worker.model] += worker.running_jobs
    depths = await queue_depths(services.redis, services.keys, catalog.entries)
    totals: dict[str, str] | None = None
    with redis_errors():
        expired = await services.redis.hgetall(services.keys.jobs_expired)  # type: ignore[misc]
        if tenants:
            totals = await services.redis.hgetall(services.keys.tenant_totals)  # type: ignore[misc]
    return {model: (depths[model], running[model]) for model in catalog.entries}, expired, totals
