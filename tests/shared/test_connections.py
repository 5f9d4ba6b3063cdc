"""A process's Redis clients, opened together from its settings against the real Redis: a gateway's
stream reader reads where the streams are, with a connection of its own (or a cluster client on a
Redis Cluster of streams), and closing them all leaves none of their connections open."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from shared.config import RedisSettings
from shared.connections import Connections
from shared.redis_client import StreamsCluster
from tests.helpers import eventually


async def client_names(redis: aioredis.Redis) -> list[str]:
    return [client["name"] for client in await redis.client_list()]


async def test_a_gateways_clients_on_one_redis_read_its_streams_with_a_connection_of_their_own(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    name = f"test-connections-{uuid.uuid4().hex[:8]}"
    connections = Connections.open(RedisSettings(redis_url=redis_url), name, reader=f"{name}-reader")
    assert connections.streams is None  # the streams live on `redis` with the rest
    assert isinstance(connections.reader, aioredis.Redis)
    assert connections.reader.connection_pool.max_connections == 1
    assert await connections.redis.ping()
    assert await connections.reader.ping()
    names = await client_names(redis_client)
    assert {name, f"{name}-reader"} <= set(names)
    await connections.aclose()

    async def ours_left() -> set[str]:  # Redis frees a closed socket's client at its loop's next turn
        return {name, f"{name}-reader"} & set(await client_names(redis_client))

    await eventually(ours_left, "the closed clients leave CLIENT LIST", until=lambda left: not left)


async def test_a_redis_cluster_of_streams_is_read_through_cluster_clients_and_a_worker_has_no_reader(
    redis_url: str,
) -> None:
    settings = RedisSettings(redis_url=redis_url, streams_redis_url="redis+cluster://127.0.0.1:7000")
    gateway = Connections.open(settings, "test-connections", reader="test-connections-reader")
    worker = Connections.open(settings, "test-connections")
    assert isinstance(gateway.streams, StreamsCluster) and isinstance(gateway.reader, StreamsCluster)
    assert gateway.reader is not gateway.streams
    assert isinstance(worker.streams, StreamsCluster) and worker.reader is None
    for connections in (gateway, worker):  # no cluster answers there: nothing was connected to close
        await connections.aclose()
