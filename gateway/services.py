"""What a gateway process builds once, in its lifespan: its services on one set of Redis connections,
and the tasks that run beside its requests (the webhook sender, the batch driver, the file and
deadline sweepers)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import socket
import uuid

import httpx
import redis.asyncio as aioredis

from gateway.admission import Admission
from gateway.auth import ApiKeys
from gateway.batch_driver import BatchDriver
from gateway.batches.store import Batches
from gateway.deadline_sweep import sweep_deadlines
from gateway.deps import Services
from gateway.files.expiry import sweep_expired_files
from gateway.files.storage import FileStorage
from gateway.files.store import Files
from gateway.metrics import GatewayMetrics
from gateway.prompt_limit import PromptLimit
from gateway.relay.cluster_notices import ClusterNotices
from gateway.relay.hub import StreamHub
from gateway.relay.notices import NoticeSource
from gateway.relay.relay import Relay
from gateway.relay.server_notices import ServerNotices
from gateway.routes import pooling
from gateway.webhooks.deliveries import Deliveries
from gateway.webhooks.sender import WebhookSender
from gateway.webhooks.targets import WebhookTargets
from shared.config import GatewaySettings
from shared.connections import Connections
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.redis_client import StreamsCluster


def build_services(
    settings: GatewaySettings,
    keys: Keys,
    connections: Connections,
    api_keys: ApiKeys,
    webhook_targets: WebhookTargets,
    metrics: GatewayMetrics,
) -> Services:
    """The services of a gateway on `connections` (opened with a reader)."""
    redis, streams = connections.redis, connections.streams
    if connections.reader is None:
        raise ValueError("a gateway's connections have a stream reader")
    hub = StreamHub(notice_source(connections.reader, keys), metrics.observe_relay_lag)
    # The store reads the Redis settings every role has; the jobs it submits get ids in this
    # process's own notice partition.
    store = JobStore(redis, keys, settings, streams, own_notice_partition(settings, keys))
    # A record outlives its last change by the retention, and the wait for its next attempt.
    record_ttl = settings.retention_seconds + math.ceil(settings.webhook_max_retry_gap_seconds)
    relay = Relay(redis, keys, hub, streams)
    metrics.readers_open.set_function(lambda: relay.open_streams.held)
    return Services(
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
        deliveries=Deliveries(redis, keys, record_ttl),
        files=Files(redis, keys, FileStorage.of_settings(settings), settings, api_keys.tenants),
        batches=Batches(redis, keys, settings),
    )


def notice_source(reader: aioredis.Redis | StreamsCluster, keys: Keys) -> NoticeSource:
    """The notices of the streams' Redis, read by `reader`: a Redis Cluster's shard channels, or one
    server's channels. The hub closes it, its reader's connections with it."""
    if isinstance(reader, StreamsCluster):
        return ClusterNotices(reader, keys)
    return ServerNotices(reader, keys)


def own_notice_partition(settings: GatewaySettings, keys: Keys) -> int | None:
    """The notice partition of the jobs this gateway process submits: the setting's, or one drawn at
    random; None on a Redis Cluster, where job ids stay random to spread the streams over the masters."""
    if keys.partitions:
        return None
    if settings.gateway_notice_partition is None:
        return secrets.randbelow(keys.notice_partitions)
    return settings.gateway_notice_partition % keys.notice_partitions


class Background:
    """The tasks a gateway runs beside its requests, started as it is made (in the lifespan), and what
    they hold (the webhooks' HTTP client)."""

    def __init__(self, services: Services, api_keys: ApiKeys) -> None:
        settings = services.settings
        timeout = httpx.Timeout(settings.webhook_timeout_seconds)
        self.webhook_http = httpx.AsyncClient(timeout=timeout, follow_redirects=False)  # a redirect is no 2xx
        self.sender = WebhookSender(
            services.deliveries,
            lambda owner: webhook.secret if (webhook := api_keys.webhooks.get(owner)) else None,
            lambda owner: tenant.name if (tenant := api_keys.tenants.get(owner)) else owner,
            settings,
            self.webhook_http,
            consumer=f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        )
        self.driver = BatchDriver(
            settings,
            services.batches,
            services.files,
            services.admission,
            services.store,
            pooling.POOLING_ERRORS.failure,  # OpenAI's shape; an embeddings line refused by vLLM in vLLM's
        )
        self.tasks = [
            asyncio.create_task(self.sender.run(), name="webhook sender"),
            asyncio.create_task(self.driver.run(), name="batch driver"),
            asyncio.create_task(
                sweep_expired_files(services.files, settings.files_sweep_seconds), name="file sweeper"
            ),
            asyncio.create_task(
                sweep_deadlines(services.store, services.admission, settings.deadline_sweep_seconds),
                name="deadline sweeper",
            ),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.driver.close()
        await self.sender.close()
        await self.webhook_http.aclose()
