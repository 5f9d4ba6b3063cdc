"""The stream hub's notices and reads on a Redis Cluster (`gateway.relay.notices.NoticeSource`).

A partition's scripts publish on the partition's shard channel (`Keys.partition_notices`, SPUBLISH),
which reaches only the subscribers of the master holding its slot: the hub subscribes on each
master to the channels of every partition it holds (job ids there stay random, so that a gateway's
streams spread over the masters, and every gateway hears of every stream), and reads the streams of
each partition with one XREAD, each partition's sent to its master, one round trip a master. When
a slot moves, its master unsubscribes the hub from its channel (`sunsubscribe`): the hub subscribes
again where the slots are now, and reads every stream it watches, as after any notice it may have
missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from gateway.relay.notices import READ_TIMEOUT_SECONDS, Due, Hear, Heard, RawEntries, xread
from shared.keys import Keys
from shared.redis_client import StreamsCluster, close_cluster, remap_cluster


class ClusterNotices:
    """A Redis Cluster's masters: each partition's shard channel on the master of its slot, and the
    reads one XREAD a partition (a command names keys of one slot only), sent together to each master
    on a connection of the reader's own.

    The cluster client serves as the map of which master holds which slot, and is never sent a
    command: redis-py 5.3's cluster client keeps counting a connection whose send failed (a master
    dying) as in use, and maps the nodes anew from tasks that may race one another. Here a failed
    read drops every reading connection and maps the nodes anew, one remap at a time, and the hub
    reads again from the same cursors; a MOVED or ASK answer (the slot moved, or is moving) is such a
    failure too, so nothing is read from a master that no longer holds the slot."""

    def __init__(self, cluster: StreamsCluster, keys: Keys) -> None:
        self._cluster = cluster
        self._keys = keys
        self._channels = [keys.partition_notices(partition) for partition in range(keys.partitions)]
        self._mapped = False
        self._remapping = asyncio.Lock()
        self._connections: dict[str, AbstractConnection] = {}  # a master's name: the reads' connection

    def partition(self, stream: str) -> int:
        return self._keys.partition(self._keys.stream_job(stream))

    def want(self, partition: int) -> None:
        """Nothing: every partition is heard (see the module's docstring)."""

    def unwant(self, partition: int) -> None:
        """Nothing: every partition is heard."""

    async def listen(self, hear: Hear, heard: Heard, timeout: float) -> None:
        await self._remap()
        by_node: dict[str, tuple[ClusterNode, list[str]]] = {}
        for channel in self._channels:
            node = self._master_of(key_slot(channel.encode()))
            by_node.setdefault(node.name, (node, []))[1].append(channel)
        async with contextlib.AsyncExitStack() as stack:
            pubsubs = []
            for node, channels in by_node.values():
                # Connections as the cluster client makes them to the node (credentials, TLS, name).
                made_as = node.connection_kwargs
                client = aioredis.Redis.from_pool(
                    aioredis.ConnectionPool(connection_class=node.connection_class, **made_as)
                )
                stack.push_async_callback(client.aclose)
                pubsub = await stack.enter_async_context(client.pubsub())
                # One SSUBSCRIBE a slot (channels of several are refused), sent as it is: redis-py's
                # asyncio PubSub has no method of its own for it, and its messages are handed over
                # as any other's (`smessage`, `ssubscribe`, `sunsubscribe`).
                for channel in channels:
                    await pubsub.execute_command("SSUBSCRIBE", channel)
                pubsubs.append(pubsub)
            for partition in range(len(self._channels)):
                heard(partition, True)
            await _first_failure([_hear(pubsub, hear, timeout) for pubsub in pubsubs])

    async def read(self, due: Collection[Due], count: int) -> list[tuple[str, RawEntries]]:
        if not self._mapped:  # the first read may come before the first listen
            await self._remap()
        by_node: dict[str, tuple[ClusterNode, dict[int, list[Due]]]] = {}
        for stream in due:
            slot = key_slot(stream.stream.encode())
            node = self._master_of(slot)
            by_node.setdefault(node.name, (node, {}))[1].setdefault(slot, []).append(stream)
        reads = [
            asyncio.ensure_future(self._read_master(node, slots, count)) for node, slots in by_node.values()
        ]
        try:
            return [found for read in await asyncio.gather(*reads) for found in read]
        except BaseException:  # the other masters' reads stop too, their connections dropped
            for read in reads:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
            raise

    async def _read_master(
        self, node: ClusterNode, slots: dict[int, list[Due]], count: int
    ) -> list[tuple[str, RawEntries]]:
        """The XREAD of each slot's streams, sent to `node` at once and answered in order."""
        connection = self._connections.get(node.name)
        if connection is None:
            connection = self._connections[node.name] = node.connection_class(**node.connection_kwargs)
        try:
            reads = b"".join(xread(streams, count) for streams in slots.values())
            await connection.send_packed_command(reads)
            found: list[tuple[str, RawEntries]] = []
            for _ in slots:
                found += await connection.read_response(timeout=READ_TIMEOUT_SECONDS) or ()
            return found
        except BaseException as exc:  # a reply left unread would answer the next read: drop the connection
            self._connections.pop(node.name, None)
            await connection.disconnect(nowait=True)
            if isinstance(exc, ResponseError):  # MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the map is old
                raise RedisConnectionError(f"{node.name} no longer serves a slot read: {exc}") from exc
            raise

    async def drop(self) -> None:
        """Drop every reading connection, and map the nodes anew (a failed read most often means a
        master died or a slot moved); a map that cannot be made now is made at the next failure."""
        await self._disconnect()
        with contextlib.suppress(RedisError, OSError):
            await self._remap()

    async def aclose(self) -> None:
        await self._disconnect()
        await close_cluster(self._cluster)

    async def _disconnect(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.disconnect(nowait=True)

    async def _remap(self) -> None:
        """Learn which master holds which slot, one remap at a time (two at once corrupt the map)."""
        async with self._remapping:
            try:
                if self._mapped:
                    await remap_cluster(self._cluster)
                else:
                    await self._cluster.initialize()
                    self._mapped = True
            except RedisClusterException as exc:  # no slot map yet (the cluster forming, or failing over)
                raise RedisConnectionError(str(exc)) from exc

    def _master_of(self, slot: int) -> ClusterNode:
        try:
            return self._cluster.nodes_manager.get_node_from_slot(slot)
        except (RedisClusterException, KeyError) as exc:  # no map yet, or the slot not covered (a failover)
            raise RedisConnectionError(f"no master is known to hold slot {slot}") from exc


async def _hear(pubsub: aioredis.client.PubSub, hear: Hear, timeout: float) -> None:
    """One master's notices, until it unsubscribes this one from a channel (its slot moved away)."""
    while True:
        message = await pubsub.get_message(timeout=timeout)
        if message is None:
            continue
        if message["type"] == "smessage":
            hear(message["data"])
        elif message["type"] == "sunsubscribe":
            raise RedisConnectionError(f"{message['channel']} moved to another master")


async def _first_failure(listeners: Sequence[Any]) -> None:
    """Run the listeners together until one fails (or all are cancelled); the others stop with it."""
    tasks = [asyncio.ensure_future(listener) for listener in listeners]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
