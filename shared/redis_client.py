"""Connecting to Redis, the boundary where redis-py errors become streampool errors, and deleting a
key prefix's keys."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.errors import BackendUnavailable
from shared.keys import Keys

POOL_WAIT_SECONDS = 10


def connect(url: str, name: str, max_connections: int) -> aioredis.Redis:
    """A client whose commands share at most `max_connections` connections, named `name` in CLIENT LIST.

    A burst of concurrent commands (a thousand SSE clients connecting at once) waits for a free
    connection instead of opening one apiece, so a process's connections to Redis stay bounded
    whatever its load; a command that waits `POOL_WAIT_SECONDS` in vain fails as Redis unreachable.
    Connections are made lazily and re-made after an outage; the client answers `str`.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_SECONDS,
        decode_responses=True,
        health_check_interval=30,
        client_name=name,
    )
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    return client


def connect_reader(url: str, name: str) -> aioredis.Redis:
    """A client of one connection of its own, for a long blocking reader, named `name` in CLIENT LIST."""
    client: aioredis.Redis = aioredis.Redis.from_url(
        url, decode_responses=True, health_check_interval=30, single_connection_client=True, client_name=name
    )
    return client


@contextmanager
def redis_errors() -> Iterator[None]:
    """Turn an unreachable Redis into `BackendUnavailable` (503 at the gateway)."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise BackendUnavailable(f"Redis is unreachable: {exc}") from exc


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under `prefix`, and arq's job keys (arq keeps its own prefix) of the prefix's
    jobs; answers how many. Synchronous, so that teardowns inside another running event loop can call it.
    """
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        names = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        names += Keys(prefix).arq_jobs_among(names)
        for start in range(0, len(names), 1000):
            client.delete(*names[start : start + 1000])
    finally:
        client.close()
    return len(names)
