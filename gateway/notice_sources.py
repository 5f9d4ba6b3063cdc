"""Where a gateway's stream hub (`gateway.fanout.StreamHub`) hears of new entries and reads streams:
one Redis, or the masters of a Redis Cluster holding the job streams in partitions.

On one Redis every script that appends publishes its notice on one channel (`Keys.notices`), and
the hub reads the streams it must with one XREAD on a connection of its own. On a Redis Cluster a
partition's scripts publish on the partition's shard channel (`Keys.partition_notices`, SPUBLISH),
which reaches only the subscribers of the master holding its slot: the hub subscribes on each
master to the channels of the partitions it holds, and reads the streams of each partition with one
XREAD, each partition's sent to its master, one round trip a master. When a slot moves, its master
unsubscribes the hub from its channel (`sunsubscribe`): the hub subscribes again where the slots are
now, and reads every stream it watches, as after any notice it may have missed.

A source's failure is a `RedisError` or an `OSError`, which the hub meets by starting over.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from shared.keys import Keys
from shared.redis_client import close_cluster, remap_cluster

READ_TIMEOUT_SECONDS = 10.0  # a read without an answer by then means a dead connection


class Due(Protocol):
    """A stream to read: its name (`stream`, and packed as a RESP bulk string, `name`) and the cursor
    the read starts after."""

    stream: str
    name: bytes
    cursor: str


Hear = Callable[[str], None]
"""What a source hands each notice to."""

RawEntries = list[list[Any]]
"""A stream's entries as XREAD answers them unparsed: [id, [field, value, ...]] each."""


def bulk(value: str) -> bytes:
    """One argument of a Redis command as the protocol carries it (a RESP bulk string)."""
    data = value.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class NoticeSource(Protocol):
    async def listen(
        self, hear: Callable[[str], None], subscribed: Callable[[], None], timeout: float
    ) -> None:
        """Hand every notice to `hear`, once `subscribed` has been told the subscription holds, until
        cancelled or a failure; `timeout`: the longest wait for a message."""

    async def read(self, due: Collection[Due], count: int) -> list[tuple[str, RawEntries]]:
        """Up to `count` entries of each due stream after its cursor: (stream, entries) for each
        stream that has any."""

    async def drop(self) -> None:
        """Let go of the reading connections (after a failure: the next read makes them anew)."""

    async def aclose(self) -> None: ...


class ServerNotices:
    """One Redis: the notices' channel, and one raw connection for the reads.

    redis-py packs a command's arguments anew at every call, in Python, which for 1,000 streams cost
    the reader more than the entries it brought back; the hub keeps each stream's name packed, this
    packs the cursors of the streams it reads only, and reads the reply raw, without redis-py's
    per-entry dictionaries."""

    def __init__(self, reader: aioredis.Redis, channel: str) -> None:
        self._reader = reader  # its pool's connection listens to the notices; the reads have their own
        self._channel = channel
        self._connection: AbstractConnection | None = None

    async def listen(
        self, hear: Callable[[str], None], subscribed: Callable[[], None], timeout: float
    ) -> None:
        async with self._reader.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(self._channel)
            subscribed()
            while True:
                message = await pubsub.get_message(timeout=timeout)
                if message is not None and message["type"] == "message":
                    hear(message["data"])

    async def read(self, due: Collection[Due], count: int) -> list[tuple[str, RawEntries]]:
        if self._connection is None:
            self._connection = self._reader.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        connection = self._connection
        command = b"".join(
            [
                b"*%d\r\n" % (4 + 2 * len(due)),
                *map(bulk, ("XREAD", "COUNT", str(count), "STREAMS")),
                *[stream.name for stream in due],
                *[bulk(stream.cursor) for stream in due],
            ]
        )
        await connection.send_packed_command(command)
        reply: list[tuple[str, RawEntries]] | None = await connection.read_response(
            timeout=READ_TIMEOUT_SECONDS
        )
        return reply or []

    async def drop(self) -> None:
        if self._connection is not None:
            await self._connection.disconnect(nowait=True)

    async def aclose(self) -> None:
        if self._connection is not None:
            await self._connection.disconnect()
        await self._reader.aclose()


class ClusterNotices:
    """A Redis Cluster's masters: each partition's shard channel on the master of its slot, and the
    reads one XREAD a partition (a command names keys of one slot only), a pipeline a master."""

    def __init__(self, cluster: RedisCluster, keys: Keys, client_name: str) -> None:
        self._cluster = cluster
        self._channels = [keys.partition_notices(partition) for partition in range(keys.partitions)]
        self._client_name = client_name
        self._listened = False

    async def listen(
        self, hear: Callable[[str], None], subscribed: Callable[[], None], timeout: float
    ) -> None:
        try:
            if self._listened:  # again, after a failure: where the slots are now
                await remap_cluster(self._cluster)
            else:
                await self._cluster.initialize()
                self._listened = True
            by_node: dict[str, tuple[ClusterNode, list[str]]] = {}
            for channel in self._channels:
                node = self._cluster.get_node_from_key(channel)
                if node is None:
                    raise RedisConnectionError(f"no master holds the slot of {channel}")
                by_node.setdefault(node.name, (node, []))[1].append(channel)
        except RedisClusterException as exc:  # no slot map yet (the cluster forming, or failing over)
            raise RedisConnectionError(str(exc)) from exc
        async with contextlib.AsyncExitStack() as stack:
            pubsubs = []
            for node, channels in by_node.values():
                client = aioredis.Redis(
                    host=node.host,
                    port=int(node.port),
                    username=self._cluster.connection_kwargs.get("username"),
                    password=self._cluster.connection_kwargs.get("password"),
                    decode_responses=True,
                    client_name=self._client_name,
                )
                stack.push_async_callback(client.aclose)
                pubsub = await stack.enter_async_context(client.pubsub())
                # One SSUBSCRIBE a slot (channels of several are refused), sent as it is: redis-py's
                # asyncio PubSub has no method of its own for it, and its messages are handed over
                # as any other's (`smessage`, `ssubscribe`, `sunsubscribe`).
                for channel in channels:
                    await pubsub.execute_command("SSUBSCRIBE", channel)
                pubsubs.append(pubsub)
            subscribed()
            await _first_failure([_hear(pubsub, hear, timeout) for pubsub in pubsubs])

    async def read(self, due: Collection[Due], count: int) -> list[tuple[str, RawEntries]]:
        by_slot: dict[int, list[Due]] = {}
        for stream in due:
            by_slot.setdefault(key_slot(stream.stream.encode()), []).append(stream)
        pipe = self._cluster.pipeline()
        for streams in by_slot.values():
            pipe.xread({stream.stream: stream.cursor for stream in streams}, count=count)
        try:
            replies = await asyncio.wait_for(pipe.execute(), READ_TIMEOUT_SECONDS)
        except RedisClusterException as exc:
            raise RedisConnectionError(str(exc)) from exc
        return [
            (
                stream,
                [
                    [entry_id, [part for pair in fields.items() for part in pair]]
                    for entry_id, fields in entries
                ],
            )
            for reply in replies
            for stream, entries in reply or ()
        ]

    async def drop(self) -> None:
        """The cluster client's connections are its own: a failed one it makes again."""

    async def aclose(self) -> None:
        await close_cluster(self._cluster)


def _raw(entries: list[tuple[str, dict[str, str]]]) -> RawEntries:
    """Entries as redis-py's XREAD answers them, made raw again (as `ServerNotices.read` reads them)."""
    return [[entry_id, [part for pair in fields.items() for part in pair]] for entry_id, fields in entries]


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
