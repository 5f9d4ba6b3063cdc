"""The gateway application: `create_app(settings)` and its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.deps import Services
from gateway.errors import install_error_handlers
from gateway.fanout import StreamHub
from gateway.metrics import GatewayMetrics
from gateway.relay import Relay
from gateway.routes import health, jobs, openai, playground, tgi
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.redis_client import connect


def create_app(settings: Settings) -> FastAPI:
    """A gateway for `settings`; Redis is connected in the lifespan, lazily, so it may start first."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = Keys(settings.key_prefix)
        redis = connect(settings.redis_url)
        hub = StreamHub(connect(settings.redis_url, reader_name=keys.stream_reader_name), redis)
        app.state.services = Services(
            settings=settings,
            keys=keys,
            redis=redis,
            store=JobStore(redis, keys, settings),
            relay=Relay(redis, keys, hub),
            metrics=GatewayMetrics(),
        )
        try:
            yield
        finally:
            await hub.close()
            await redis.aclose()

    app = FastAPI(title="streampool", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(openai.router)
    app.include_router(tgi.router)
    app.include_router(playground.router)
    app.include_router(health.router)
    return app


def run(settings: Settings) -> None:
    import uvicorn

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None)
