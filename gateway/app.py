"""The gateway application: `create_app(settings)` and its lifespan."""

from __future__ import annotations

import gc
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from gateway.auth import ApiKeys, AuthNotConfigured
from gateway.body_limit import BodyLimit
from gateway.deps import Services
from gateway.errors import install_error_handlers
from gateway.fanout import StreamHub
from gateway.metrics import GatewayMetrics
from gateway.prompt_limit import PromptLimit
from gateway.relay import Relay
from gateway.request_metrics import RequestMetrics
from gateway.routes import health, jobs, openai, playground, tgi
from gateway.server_send import KeepServerSend
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.redis_client import connect, connect_reader

GC_YOUNG_THRESHOLD = 50_000  # CPython's default is 700


def create_app(settings: Settings) -> FastAPI:
    """A gateway for `settings`; Redis is connected in the lifespan, lazily, so it may start first.

    Raises `AuthNotConfigured` when there are no API keys and running without them was not asked for.
    """
    api_keys = ApiKeys.from_settings(settings)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = Keys(settings.key_prefix)
        redis = connect(settings.redis_url, keys.client_name("gateway"), settings.redis_max_connections)
        hub = StreamHub(connect_reader(settings.redis_url, keys.stream_reader_name), redis)
        app.state.services = Services(
            settings=settings,
            keys=keys,
            redis=redis,
            store=JobStore(redis, keys, settings),
            relay=Relay(redis, keys, hub),
            metrics=metrics,
            prompt_limit=PromptLimit(redis, keys, metrics),
        )
        try:
            yield
        finally:
            await hub.close()
            await redis.aclose()

    app = FastAPI(title="streampool", version="0.1.0", lifespan=lifespan)
    app.state.api_keys = api_keys
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, metrics=metrics)
    # Added after the body limit, so outside it: it sees every answer, the body limit's refusals included.
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(KeepServerSend)  # last, so outside the others: the `send` it keeps skips them all
    install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(openai.router)
    app.include_router(tgi.router)
    app.include_router(playground.router)
    app.include_router(health.router)
    return app


class GatewayServer(uvicorn.Server):
    """uvicorn's server, ending the gateway's event streams as soon as it starts shutting down.

    uvicorn waits for every open response to finish before it exits, and an event stream
    lasts as long as its job: ended at once (without a terminal event), its clients
    reconnect to another gateway with `Last-Event-ID` and miss nothing.
    """

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        super().__init__(uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None))
        self.app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        services: Services | None = getattr(self.app.state, "services", None)
        if services is not None:
            services.relay.open_streams.close()
        await super().shutdown(sockets)


def _tune_garbage_collector() -> None:
    """Keep the collector's work in proportion to the events relayed, not to the imports.

    The relay makes and drops objects at the rate of events. With CPython's default
    thresholds, at 10,000 events/s the collector ran hundreds of times a second and every
    full collection re-scanned the ~200,000 objects that importing the gateway made: a
    sixth of the process's CPU, in pauses that showed up as relay lag. Start-up objects
    live as long as the process, so they leave the collector's view (`gc.freeze`), and
    young collections run once per `GC_YOUNG_THRESHOLD` new container objects.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run(settings: Settings) -> None:
    try:
        app = create_app(settings)
    except AuthNotConfigured as exc:
        raise SystemExit(f"streampool gateway: {exc}") from None
    _tune_garbage_collector()
    GatewayServer(app, settings).run()
