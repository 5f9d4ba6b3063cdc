"""The stream hub's notices and reads on one Redis (`gateway.relay.notices.NoticeSource`).

Every script that appends publishes its notice on its stream's notice partition's channel
(`Keys.notice_channel`): the hub subscribes to the channels of the partitions of the streams it
watches, and only to those (`want`, `unwant`), so that a gateway whose clients follow the jobs it
submitted, in its own partition, hears of few others. It reads the streams it must with one XREAD
on a connection of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from gateway.relay.notices import READ_TIMEOUT_SECONDS, Due, Hear, Heard, RawEntries, xread
from shared.keys import Keys


class ServerNotices:
    """One Redis: a channel a notice partition, and one raw connection for the reads.

    The listening connection subscribes to the channels of the partitions wanted, and no others:
    subscriptions change one command at a time, from a task of their own (`_resubscribe`), while the
    listener reads; Redis confirms each on the same connection, in order with the notices, and from
    its confirmation on every notice of the partition is heard.

    redis-py packs a command's arguments anew at every call, in Python, which for 1,000 streams cost
    the reader more than the entries it brought back; the hub keeps each stream's name packed, this
    packs the cursors of the streams it reads only, and reads the reply raw, without redis-py's
    per-entry dictionaries."""

    def __init__(self, reader: aioredis.Redis, keys: Keys) -> None:
        self._reader = reader  # its pool's connection listens to the notices; the reads have their own
        self._keys = keys
        self._partitions = {keys.notice_channel(n): n for n in range(keys.notice_partitions)}
        self._wanted: set[int] = set()
        self._asked: set[int] = set()  # subscribed to on the listening connection, or about to be
        self._pubsub: aioredis.client.PubSub | None = None  # while listening
        self._changing: asyncio.Task[None] | None = None
        self._failure: RedisError | OSError | None = None  # met by `_resubscribe`
        self._connection: AbstractConnection | None = None

    def partition(self, stream: str) -> int:
        return self._keys.notice_partition(self._keys.stream_job(stream))

    def want(self, partition: int) -> None:
        self._wanted.add(partition)
        self._change()

    def unwant(self, partition: int) -> None:
        self._wanted.discard(partition)
        self._change()

    async def listen(self, hear: Hear, heard: Heard, timeout: float) -> None:
        partitions = self._partitions
        async with self._reader.pubsub() as pubsub:
            await pubsub.connect()
            self._pubsub, self._asked, self._failure = pubsub, set(), None
            try:
                self._change()
                while True:
                    message = await pubsub.get_message(timeout=timeout)
                    if message is None:
                        self._check_changes()
                        continue
                    kind = message["type"]
                    if kind == "message":
                        hear(message["data"])
                    elif kind == "subscribe" or kind == "unsubscribe":
                        heard(partitions[message["channel"]], kind == "subscribe")
            finally:
                self._pubsub = None
                if self._changing is not None:
                    self._changing.cancel()
                    self._changing = None

    def _change(self) -> None:
        """Bring the listening connection's subscriptions to what is wanted (from a task: `want` and
        `unwant` are told as the hub watches and drops streams, and await nothing)."""
        if self._pubsub is not None and (self._changing is None or self._changing.done()):
            self._changing = asyncio.create_task(self._resubscribe(self._pubsub), name="notice subscriptions")

    async def _resubscribe(self, pubsub: aioredis.client.PubSub) -> None:
        """SUBSCRIBE and UNSUBSCRIBE until what is asked of the connection is what is wanted; what is
        wanted meanwhile is taken up by the next command. A failure is kept for the listener to raise
        (the connection is dropped with it: the listener starts over, subscribing to what is wanted)."""
        try:
            while True:
                if more := self._wanted - self._asked:
                    self._asked |= more
                    await pubsub.subscribe(*(self._keys.notice_channel(n) for n in sorted(more)))
                elif fewer := self._asked - self._wanted:
                    self._asked -= fewer
                    await pubsub.unsubscribe(*(self._keys.notice_channel(n) for n in sorted(fewer)))
                else:
                    return
        except (RedisError, OSError) as exc:
            self._failure = exc

    def _check_changes(self) -> None:
        """Raise what a change of subscriptions met."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    async def read(self, due: Collection[Due], count: int) -> list[tuple[str, RawEntries]]:
        if self._connection is None:
            self._connection = self._reader.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        connection = self._connection
        await connection.send_packed_command(xread(due, count))
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
