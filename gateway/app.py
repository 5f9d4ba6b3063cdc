"""The gateway application: `create_app(settings)` and its lifespan."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from gateway.auth import ApiKeys, AuthNotConfigured
from gateway.body_limit import BodyLimit
from gateway.deps import Services
from gateway.errors import install_error_handlers
from gateway.generation import OpenRuns
from gateway.metrics import GatewayMetrics
from gateway.plain_polls import PlainPolls
from gateway.processes import serve_processes
from gateway.relay.server_send import KeepServerSend
from gateway.request_metrics import RequestCounts, RequestMetrics
from gateway.routes import (
    adapters,
    batches,
    console,
    files,
    health,
    jobs,
    openai,
    playground,
    pooling,
    responses,
    resume,
    scale_out,
    stored_chat,
    tgi,
    usage,
    vllm,
)
from gateway.services import Background, build_services
from gateway.webhooks.targets import WebhooksMisconfigured, WebhookTargets
from shared.config import GatewaySettings
from shared.connections import Connections
from shared.garbage import tune_garbage_collector
from shared.keys import Keys

# A cancelled job ends within two decoding steps (a fraction of a second); past this margin after the
# grace period, uvicorn cuts what is still open (a job whose worker no longer answers).
CANCEL_MARGIN_SECONDS = 5


def create_app(settings: GatewaySettings) -> FastAPI:
    """A gateway for `settings`; Redis is connected in the lifespan, lazily, so it may start first.

    Raises `AuthNotConfigured` when there are no API keys and running without them was not asked for,
    `WebhooksMisconfigured` for webhook settings that cannot be.
    """
    api_keys = ApiKeys.from_settings(settings)
    webhook_targets = WebhookTargets(settings.webhook_allowed_prefixes, api_keys.webhooks, api_keys.tenants)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = Keys.of(settings)
        connections = Connections.open(settings, keys.client_name("gateway"), reader=keys.stream_reader_name)
        services = build_services(settings, keys, connections, api_keys, webhook_targets, metrics)
        app.state.services = services
        background = Background(services, api_keys)
        try:
            yield
        finally:
            await background.stop()
            await services.relay.hub.close()
            await connections.aclose()

    app = FastAPI(title="streampool", version="0.1.0", lifespan=lifespan)
    app.state.api_keys = api_keys
    app.state.metrics = metrics
    app.state.open_runs = OpenRuns()
    # An upload streams its body to the file storage, bounded by `max_file_bytes` as it goes.
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, metrics=metrics, streamed=frozenset({files.FILES_PATH})
    )
    # Added after the body limit, so outside it: it sees every answer, the body limit's refusals included.
    counts = RequestCounts(metrics)
    app.add_middleware(RequestMetrics, counts=counts)
    install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(openai.router)
    app.include_router(resume.router)
    # Before the stored chat completions: vLLM's `/v1/chat/completions/render` is no completion's id.
    app.include_router(scale_out.router)
    app.include_router(stored_chat.router)
    app.include_router(responses.router)
    app.include_router(vllm.router)
    app.include_router(pooling.router)
    if settings.allow_runtime_lora_updating:  # as vLLM's server, which has them only then
        app.include_router(adapters.router)
    app.include_router(tgi.router)
    app.include_router(playground.router)
    app.include_router(console.page)
    app.include_router(console.router)
    app.include_router(health.router)
    app.include_router(usage.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    # Outside the rest: plain long-polls skip the stack, and are counted as it counts every answer.
    events = jobs.events_route(app.routes)
    app.add_middleware(PlainPolls, route=events, template=events.path, counts=counts)
    return app


class GatewayServer(uvicorn.Server):
    """uvicorn's server, ending the gateway's native event streams as soon as it starts shutting down,
    and letting OpenAI and TGI answers go on for a grace period.

    uvicorn stops listening, then waits for every open response to finish before it exits. A native
    event stream lasts as long as its job: ended at once (without a terminal event), its clients
    reconnect to another gateway with `Last-Event-ID` and miss nothing; waiting long-polls are
    answered at once too. OpenAI and TGI clients cannot resume: their answers go on for
    `shutdown_grace_seconds`, then their jobs are cancelled and each answer ends with that, as when
    a job is cancelled under its client. uvicorn's graceful-shutdown timeout cuts whatever is still
    open `CANCEL_MARGIN_SECONDS` later.
    """

    def __init__(self, app: FastAPI, settings: GatewaySettings) -> None:
        grace = settings.shutdown_grace_seconds
        config = uvicorn.Config(
            KeepServerSend(app),  # outside the app's whole stack: the `send` it keeps skips all of it
            http="httptools",  # whose `send` live events are written around (`server_send.body_writer`)
            host=settings.host,
            port=settings.port,
            log_config=None,
            # uvicorn computes an access line's values for every answer, logged or not.
            access_log=logging.getLogger("uvicorn.access").isEnabledFor(logging.INFO),
            timeout_keep_alive=settings.keep_alive_seconds,
            timeout_graceful_shutdown=math.ceil(grace) + CANCEL_MARGIN_SECONDS,
        )
        super().__init__(config)
        self.app = app
        self.grace_seconds = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        services: Services | None = getattr(self.app.state, "services", None)
        if services is not None:
            services.relay.open_streams.close()
        open_runs: OpenRuns = self.app.state.open_runs
        cancelling = asyncio.create_task(open_runs.cancel_after(self.grace_seconds))
        try:
            await super().shutdown(sockets)  # returns as soon as every answer has ended
        finally:
            cancelling.cancel()


def run(settings: GatewaySettings) -> None:
    """Serve the gateway: in this process, or in `settings.processes` of them on one port."""
    try:
        app = create_app(settings)  # a setting that cannot work stops the command before anything starts
    except (AuthNotConfigured, WebhooksMisconfigured) as exc:
        raise SystemExit(f"streampool gateway: {exc}") from None
    if settings.processes > 1:
        sys.exit(serve_processes(settings, serve_on))
    tune_garbage_collector()
    GatewayServer(app, settings).run()


def serve_on(settings: GatewaySettings, listening: socket.socket) -> None:
    """One of several gateway processes, accepting on the socket they share."""
    app = create_app(settings)
    tune_garbage_collector()
    GatewayServer(app, settings).run(sockets=[listening])
