"""One Redis reader per gateway process, fanning new stream entries out to every follower.

A follower catches up on its own with plain reads; once it has read all there is, it
subscribes here. The hub keeps one blocking XREAD over every subscribed stream on a
single dedicated connection, so Redis connections do not grow with the number of open
streams. A new subscription wakes the blocked read with CLIENT UNBLOCK so that its
stream is watched at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.entries import Entry
from shared.errors import BackendUnavailable

log = logging.getLogger(__name__)

HUB_BLOCK_MS = 5000
HUB_READ_COUNT = 256
WAKE_RETRY_SECONDS = 0.001
SUBSCRIBER_QUEUE = 1024  # entries held for one follower before it must catch up from Redis itself


@dataclass(eq=False)
class Subscription:
    """A follower's mailbox: new entries of one stream, or the news that it fell behind or failed."""

    stream: str
    started_after: str
    queue: asyncio.Queue[Entry | Exception] = field(
        default_factory=lambda: asyncio.Queue(maxsize=SUBSCRIBER_QUEUE)
    )
    lagged: bool = False


class StreamHub:
    def __init__(self, reader: aioredis.Redis, control: aioredis.Redis) -> None:
        self._reader = reader  # one connection, used only for the hub's blocking reads
        self._control = control  # the shared pool, for CLIENT UNBLOCK
        self._subscribers: dict[str, set[Subscription]] = {}
        self._cursors: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._reader_id: int | None = None
        self._reading = False
        self._unwatched = False  # a stream was added that the read in flight does not watch
        self._waker: asyncio.Task[None] | None = None

    @property
    def streams(self) -> int:
        return len(self._subscribers)

    async def close(self) -> None:
        for task in (self._task, self._waker):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._reader.aclose()

    @asynccontextmanager
    async def subscribe(self, stream: str, cursor: str) -> AsyncIterator[Subscription]:
        """Entries of `stream` appended after the hub's cursor for it (see `started_after`)."""
        started_after = self._cursors.setdefault(stream, cursor)
        subscription = Subscription(stream, started_after)
        self._subscribers.setdefault(stream, set()).add(subscription)
        self._unwatched = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        elif self._waker is None or self._waker.done():
            self._waker = asyncio.create_task(self._wake())
        try:
            yield subscription
        finally:
            self._unsubscribe(subscription)

    def _unsubscribe(self, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(subscription.stream)
        if subscribers is None:
            return
        subscribers.discard(subscription)
        if not subscribers:
            del self._subscribers[subscription.stream]
            del self._cursors[subscription.stream]

    async def _wake(self) -> None:
        """Interrupt the blocked XREAD until a new one watches the streams added since.

        CLIENT UNBLOCK travels on another connection, so it can reach Redis before the
        XREAD it means to interrupt; it is repeated until the reader has taken them in.
        """
        try:
            while self._unwatched and self._task is not None and not self._task.done():
                if self._reading and self._reader_id is not None:
                    await self._control.client_unblock(self._reader_id)
                await asyncio.sleep(WAKE_RETRY_SECONDS)
        except RedisError as exc:
            log.warning("could not wake the stream reader: %s", exc)

    async def _run(self) -> None:
        try:
            self._reader_id = await self._reader.client_id()
            while self._subscribers:
                streams: dict[Any, Any] = dict(self._cursors)
                self._unwatched = False
                self._reading = True
                try:
                    reply = await self._reader.xread(streams, count=HUB_READ_COUNT, block=HUB_BLOCK_MS)
                finally:
                    self._reading = False
                for stream, entries in reply or []:
                    self._deliver(stream, [Entry(i, f["type"], f["data"]) for i, f in entries])
        except (RedisError, OSError) as exc:
            failure = BackendUnavailable(f"Redis is unreachable: {exc}")
            for subscribers in self._subscribers.values():
                for subscription in subscribers:
                    _offer(subscription, failure)
        finally:
            self._reader_id = None

    def _deliver(self, stream: str, entries: list[Entry]) -> None:
        if stream not in self._cursors:
            return  # every follower of it left while the read was in flight
        self._cursors[stream] = entries[-1].id
        for subscription in list(self._subscribers.get(stream, ())):
            for entry in entries:
                if not _offer(subscription, entry):
                    subscription.lagged = True
                    self._unsubscribe(subscription)
                    break


def _offer(subscription: Subscription, item: Entry | Exception) -> bool:
    try:
        subscription.queue.put_nowait(item)
        return True
    except asyncio.QueueFull:
        return False
