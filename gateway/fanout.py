"""One Redis reader per gateway process, fanning new stream entries out to every follower.

A follower catches up on its own with plain reads; once it has read all there is, it
subscribes here. The hub keeps one blocking XREAD over every subscribed stream on a
single dedicated connection, so Redis connections do not grow with the number of open
streams. A new subscription wakes the blocked read with CLIENT UNBLOCK so that its
stream is watched at once.

The hub reads a stream from after its first follower's cursor, and a later follower fills the
gap from its own cursor by itself; so a follower's cursor must name a point the stream has reached
(the relay checks a client's against the stream's last id first): one past the end would hide
every new entry from every follower of the stream.

A follower is woken once per batch of entries, not once per entry, and takes them all
at once. One that does not keep up is dropped (`lagged`) and catches up from Redis on
its own, so a slow client costs Redis reads, never unbounded gateway memory. When Redis
fails, the reader retries with backoff and carries on from every stream's cursor, so
open streams resume by themselves once Redis is back.

Each read names every watched stream with its cursor. redis-py packs a command's
arguments anew at every call, in Python, which for 1,000 streams cost the reader more
than the entries it brought back; the hub keeps each stream's name and cursor packed
(RESP bulk strings) and repacks a cursor only when it moves, and reads the reply raw,
without redis-py's per-entry dictionaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from gateway.entries import Entry, entries_bytes

log = logging.getLogger(__name__)

HUB_BLOCK_MS = 5000
HUB_READ_COUNT = 256
READ_MARGIN_SECONDS = 5.0  # past its BLOCK time, a read without an answer means a dead connection
WAKE_RETRY_SECONDS = 0.001
SUBSCRIBER_BUFFER = 1024  # entries held for one follower before it must catch up from Redis itself
RETRY_FIRST_SECONDS = 0.05  # the reader's first wait after a Redis failure, doubled up to the last
RETRY_LAST_SECONDS = 2.0


@dataclass(eq=False)
class Subscription:
    """A follower's mailbox: new entries of one stream, or the news that it fell behind."""

    stream: str
    started_after: str
    max_bytes: int  # of entries held while behind, past which the follower catches up by itself
    pending: list[Entry] = field(default_factory=list)
    pending_bytes: int = 0  # of the batches offered while entries were pending already
    lagged: bool = False
    _waiter: asyncio.Future[None] | None = None
    _deadline: float = 0.0  # when the `wait` in progress times out, by the loop's clock
    _timer: asyncio.TimerHandle | None = None

    def take(self) -> list[Entry]:
        """Every entry delivered since the last take, oldest first."""
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        return pending

    async def wait(self, timeout: float) -> None:
        """Until entries are pending, the hub dropped this subscription, or `timeout` s passed.

        A follower waits once per batch it writes. Its timer is not made and cancelled at each
        wait: it stays set, and when it fires before the current deadline it is set again for
        the rest, so it fires about once per `timeout` rather than once per batch.
        """
        if self.pending or self.lagged:
            return
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + timeout
        self._waiter = waiter = loop.create_future()
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        loop = asyncio.get_running_loop()
        if self._waiter is not None and loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._on_timer)
            return
        self._timer = None
        self.interrupt()

    def interrupt(self) -> None:
        """End a `wait` in progress now."""
        if self._waiter is not None:
            _wake(self._waiter)

    def close(self) -> None:
        """Cancel the timer: the follower has left."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def offer(self, entries: list[Entry], size: int) -> bool:
        """Hand new entries over; False (and lagged) when that would overflow the buffer.

        `size` (their bytes) is counted only while entries are pending, and the hub measures it only
        then: a follower that keeps up costs no per-entry work, and one that does not holds at most
        one read of the hub's and `max_bytes` more.
        """
        if self.pending:
            self.pending_bytes += size
            if len(self.pending) + len(entries) > SUBSCRIBER_BUFFER or self.pending_bytes > self.max_bytes:
                self.lagged = True
        if not self.lagged:
            self.pending += entries
        self.interrupt()
        return not self.lagged


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _bulk(value: str) -> bytes:
    """One argument of a Redis command as the protocol carries it (a RESP bulk string)."""
    data = value.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


@dataclass(eq=False)
class _Watched:
    """A stream the reader watches: its followers, and the cursor the next read starts after."""

    name: bytes  # packed
    cursor: str
    after: bytes  # the cursor, packed
    subscriptions: set[Subscription] = field(default_factory=set)

    def advance(self, cursor: str) -> None:
        self.cursor, self.after = cursor, _bulk(cursor)


def _entry(entry_id: str, fields: list[str]) -> Entry:
    if fields[0] == "type" and fields[2] == "data":  # the order every writer of job streams uses
        return Entry(entry_id, fields[1], fields[3], fields[5] if len(fields) > 5 else "")
    return Entry.of(entry_id, dict(zip(fields[::2], fields[1::2], strict=True)))


class StreamHub:
    def __init__(self, reader: aioredis.Redis, control: aioredis.Redis) -> None:
        self._reader = reader  # one connection, used only for the hub's blocking reads
        self._connection: AbstractConnection | None = None
        self._control = control  # the shared pool, for CLIENT UNBLOCK
        self._watched: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._reader_id: int | None = None
        self._reading = False
        self._unwatched = False  # a stream was added that the read in flight does not watch
        self._waker: asyncio.Task[None] | None = None

    @property
    def streams(self) -> int:
        """How many streams the reader watches."""
        return len(self._watched)

    async def close(self) -> None:
        for task in (self._task, self._waker):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._connection is not None:
            await self._connection.disconnect()
        await self._reader.aclose()

    @asynccontextmanager
    async def subscribe(self, stream: str, cursor: str, max_bytes: int) -> AsyncIterator[Subscription]:
        """Entries of `stream` appended after the hub's cursor for it (see `started_after`), up to
        about `max_bytes` of them waiting to be taken."""
        watched = self._watched.get(stream)
        if watched is None:
            watched = self._watched[stream] = _Watched(_bulk(stream), cursor, _bulk(cursor))
            self._unwatched = True
            if self._reading and (self._waker is None or self._waker.done()):
                self._waker = asyncio.create_task(self._wake())
        subscription = Subscription(stream, watched.cursor, max_bytes)
        watched.subscriptions.add(subscription)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            yield subscription
        finally:
            subscription.close()
            self._unsubscribe(subscription)

    def _unsubscribe(self, subscription: Subscription) -> None:
        watched = self._watched.get(subscription.stream)
        if watched is None:
            return
        watched.subscriptions.discard(subscription)
        if not watched.subscriptions:
            del self._watched[subscription.stream]

    async def _wake(self) -> None:
        """Interrupt the blocked XREAD so that the next one watches the streams added since.

        CLIENT UNBLOCK travels on another connection, so it can reach Redis before the
        XREAD it means to interrupt; it is repeated until it finds the read blocked, or
        the read has returned by itself. A reader that is not reading takes the new
        streams in at its next read.
        """
        try:
            while self._unwatched and self._reading and self._reader_id is not None:
                if await self._control.client_unblock(self._reader_id):
                    return
                await asyncio.sleep(WAKE_RETRY_SECONDS)
        except RedisError as exc:
            log.warning("could not wake the stream reader: %s", exc)

    async def _run(self) -> None:
        """Read while anyone subscribes; on a Redis failure, retry with backoff from the same cursors."""
        retry_in = RETRY_FIRST_SECONDS
        while self._watched:
            watched = dict(self._watched)
            try:
                reply = await self._read(watched.values())
            except (RedisError, OSError) as exc:
                await self._drop_connection()
                if retry_in == RETRY_FIRST_SECONDS:
                    log.warning("stream reader: Redis failed (%s); retrying", exc)
                await asyncio.sleep(retry_in)
                retry_in = min(2 * retry_in, RETRY_LAST_SECONDS)
                continue
            if retry_in != RETRY_FIRST_SECONDS:
                log.warning("stream reader: Redis answers again; following %d streams", len(self._watched))
                retry_in = RETRY_FIRST_SECONDS
            for stream, entries in reply or ():
                self._deliver(watched[stream], [_entry(entry_id, fields) for entry_id, fields in entries])

    async def _read(self, watched: Collection[_Watched]) -> list[Any] | None:
        """One XREAD BLOCK over the watched streams from their cursors; the raw reply."""
        if self._connection is None:
            self._connection = self._reader.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        connection = self._connection
        if self._reader_id is None:
            await connection.send_command("CLIENT", "ID")
            self._reader_id = int(await connection.read_response())
        command = b"".join(
            [
                b"*%d\r\n" % (6 + 2 * len(watched)),
                *map(_bulk, ("XREAD", "COUNT", str(HUB_READ_COUNT), "BLOCK", str(HUB_BLOCK_MS), "STREAMS")),
                *[stream.name for stream in watched],
                *[stream.after for stream in watched],
            ]
        )
        self._unwatched = False
        self._reading = True
        try:
            await connection.send_packed_command(command)
            reply: list[Any] | None = await connection.read_response(
                timeout=HUB_BLOCK_MS / 1000 + READ_MARGIN_SECONDS
            )
        finally:
            self._reading = False
        return reply

    async def _drop_connection(self) -> None:
        self._reader_id = None
        if self._connection is not None:
            await self._connection.disconnect(nowait=True)

    def _deliver(self, watched: _Watched, entries: list[Entry]) -> None:
        if not watched.subscriptions:
            # Every follower of it left while the read was in flight. A follower that came
            # since has a watch of its own, from its own cursor, which this read did not use.
            return
        watched.advance(entries[-1].id)
        size = -1  # measured for the first follower found behind, if any
        for subscription in list(watched.subscriptions):
            if subscription.pending and size < 0:
                size = entries_bytes(entries)
            if not subscription.offer(entries, size):
                self._unsubscribe(subscription)
