"""The gateway application: `create_app(settings)` and its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from gateway.admission import Admission
from gateway.auth import ApiKeys, AuthNotConfigured
from gateway.batch_driver import BatchDriver
from gateway.batches.store import Batches
from gateway.body_limit import BodyLimit
from gateway.deadline_sweep import sweep_deadlines
from gateway.deps import Services
from gateway.errors import install_error_handlers
from gateway.files.expiry import sweep_expired_files
from gateway.files.storage import FileStorage
from gateway.files.store import Files
from gateway.generation import OpenRuns
from gateway.metrics import GatewayMetrics
from gateway.plain_polls import PlainPolls
from gateway.processes import serve_processes
from gateway.prompt_limit import PromptLimit
from gateway.relay.cluster_notices import ClusterNotices
from gateway.relay.hub import StreamHub
from gateway.relay.notices import NoticeSource
from gateway.relay.relay import Relay
from gateway.relay.server_notices import ServerNotices
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
from gateway.webhooks.deliveries import Deliveries
from gateway.webhooks.sender import WebhookSender
from gateway.webhooks.targets import WebhooksMisconfigured, WebhookTargets
from shared.config import GatewaySettings
from shared.garbage import tune_garbage_collector
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.redis_client import connect, connect_cluster, connect_reader, connect_streams
from shared.redis_url import is_cluster

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
        url, sentinel_password = settings.redis_url, settings.redis_sentinel_password
        most = settings.redis_max_connections
        name = keys.client_name("gateway")
        redis = connect(url, name, most, sentinel_password=sentinel_password)
        streams_url = settings.streams_redis_url
        streams = None
        if streams_url is not None:
            streams = connect_streams(streams_url, name, most, sentinel_password=sentinel_password)
        source: NoticeSource
        if streams_url is not None and is_cluster(streams_url):  # a client of the hub's own: it closes it
            reader_cluster = connect_cluster(streams_url, keys.stream_reader_name, most)
            source = ClusterNotices(reader_cluster, keys)
        else:  # the notices come from where the streams are
            reader_url = streams_url or url
            reader = connect_reader(reader_url, keys.stream_reader_name, sentinel_password=sentinel_password)
            source = ServerNotices(reader, keys)
        hub = StreamHub(source, metrics.observe_relay_lag)
        # The store reads the Redis settings every role has; the jobs it submits get ids in this
        # process's own notice partition.
        store = JobStore(redis, keys, settings, streams, own_notice_partition(settings, keys))
        # A record outlives its last change by the retention, and the wait for its next attempt.
        record_ttl = settings.retention_seconds + math.ceil(settings.webhook_max_retry_gap_seconds)
        deliveries = Deliveries(redis, keys, record_ttl)
        relay = Relay(redis, keys, hub, streams)
        metrics.readers_open.set_function(lambda: relay.open_streams.held)
        app.state.services = Services(
            settings=settings,
            keys=keys,
            redis=redis,
            store=store,
            relay=relay,
            metrics=metrics,
            admission=Admission(
                settings, redis, keys, store, PromptLimit(redis, keys), metrics, api_keys.tenants
            ),
            webhook_targets=webhook_targets,
            deliveries=deliveries,
            files=Files(redis, keys, FileStorage.of_settings(settings), settings, api_keys.tenants),
            batches=Batches(redis, keys, settings),
        )
        services = app.state.services
        timeout = httpx.Timeout(settings.webhook_timeout_seconds)
        webhook_http = httpx.AsyncClient(timeout=timeout, follow_redirects=False)  # a redirect is no 2xx
        sender = WebhookSender(
            deliveries,
            lambda owner: webhook.secret if (webhook := api_keys.webhooks.get(owner)) else None,
            lambda owner: tenant.name if (tenant := api_keys.tenants.get(owner)) else owner,
            settings,
            webhook_http,
            consumer=f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        )
        sending = asyncio.create_task(sender.run(), name="webhook sender")
        driver = BatchDriver(
            settings,
            services.batches,
            services.files,
            services.admission,
            store,
            pooling.POOLING_ERRORS.failure,  # OpenAI's shape; an embeddings line refused by vLLM in vLLM's
        )
        driving = asyncio.create_task(driver.run(), name="batch driver")
        sweeping = asyncio.create_task(
            sweep_expired_files(services.files, settings.files_sweep_seconds), name="file sweeper"
        )
        expiring = asyncio.create_task(
            sweep_deadlines(store, services.admission, settings.deadline_sweep_seconds),
            name="deadline sweeper",
        )
        try:
            yield
        finally:
            for task in (sending, driving, sweeping, expiring):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await driver.close()
            await sender.close()
            await webhook_http.aclose()
            await hub.close()
            await redis.aclose()
            if streams is not None:
                await streams.aclose()

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


def own_notice_partition(settings: GatewaySettings, keys: Keys) -> int | None:
    """The notice partition of the jobs this gateway process submits: the setting's, or one drawn at
    random; None on a Redis Cluster, where job ids stay random to spread the streams over the masters."""
    if keys.partitions:
        return None
    if settings.gateway_notice_partition is None:
        return secrets.randbelow(keys.notice_partitions)
    return settings.gateway_notice_partition % keys.notice_partitions


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
