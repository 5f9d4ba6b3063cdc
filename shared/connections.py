"""A process's Redis clients, opened together and closed together, from its settings: the control
plane's (queues, records, leases, heartbeats), the job streams' own where they have a Redis of their
own (`streams_redis_url`), and a gateway's stream reader.

Every client makes its connections lazily (`shared.redis_client`): opening them needs no Redis yet,
so a process may start before Redis does.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from shared.config import RedisSettings
from shared.redis_client import (
    StreamsCluster,
    StreamsRedis,
    close_cluster,
    connect_cluster,
    connect_reader,
    connect_streams,
    connection_pool,
)
from shared.redis_url import is_cluster


def control_pool(settings: RedisSettings, name: str) -> aioredis.ConnectionPool:
    """A pool of connections to the control plane's Redis (`redis_url`), named `name` in CLIENT LIST."""
    return connection_pool(
        settings.redis_url,
        name,
        settings.redis_max_connections,
        sentinel_password=settings.redis_sentinel_password,
    )


@dataclass(frozen=True)
class Connections:
    """The clients of one process: `streams` is None where the streams live on `redis`, `reader` where
    the process reads no streams (a worker)."""

    redis: aioredis.Redis
    streams: StreamsRedis | None = None
    reader: aioredis.Redis | StreamsCluster | None = None

    @classmethod
    def open(cls, settings: RedisSettings, name: str, *, reader: str | None = None) -> Connections:
        """The clients `settings` name, called `name` in CLIENT LIST; with `reader`, a stream reader's
        too, called so: on a Redis Cluster of streams a cluster client, else one connection of its own
        for its long blocking reads."""
        url, streams_url = settings.redis_url, settings.streams_redis_url
        password, most = settings.redis_sentinel_password, settings.redis_max_connections
        redis: aioredis.Redis = aioredis.Redis.from_pool(control_pool(settings, name))
        streams = None
        if streams_url is not None:
            streams = connect_streams(streams_url, name, most, sentinel_password=password)
        reader_client: aioredis.Redis | StreamsCluster | None = None
        if reader is not None and streams_url is not None and is_cluster(streams_url):
            reader_client = connect_cluster(streams_url, reader, most)
        elif reader is not None:  # where the streams are
            reader_client = connect_reader(streams_url or url, reader, sentinel_password=password)
        return cls(redis, streams, reader_client)

    async def aclose(self) -> None:
        """Close every client; closing one twice does no harm."""
        for client in (self.redis, self.streams, self.reader):
            if isinstance(client, RedisCluster):
                await close_cluster(client)
            elif client is not None:
                await client.aclose()
