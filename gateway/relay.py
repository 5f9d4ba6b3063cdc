"""Reading job streams from a client's cursor: follow until the terminal event, or one page.

A follower first catches up with its own reads, then takes new entries from the
process's one `StreamHub` reader; if it falls behind, it catches up again from Redis,
so a slow client costs Redis reads, never unbounded gateway memory.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import redis.asyncio as aioredis

from gateway.entries import Entry
from gateway.fanout import StreamHub, Subscription
from shared.errors import CursorExpired, InvalidRequest, JobNotFound
from shared.events import JobState
from shared.keys import Keys
from shared.redis_client import redis_errors

CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
MAX_ID_PART = 2**64 - 1
START = "0-0"
READ_BATCH = 512
IDLE_CHECK_SECONDS = 5.0  # how long a silent stream waits before checking its job still exists


def _id_tuple(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _oldest_readable(info: dict[str, Any]) -> tuple[int, int]:
    """The smallest cursor that loses nothing: entries trimmed off the head sit below the first one kept.

    A cursor exactly at the last trimmed entry is refused too: the stream no longer says which that was.
    """
    if int(info["entries-added"]) <= int(info["length"]) or not info.get("first-entry"):
        return (0, 0)
    return _id_tuple(info["first-entry"][0])


def parse_cursor(cursor: str | None) -> str:
    """A client's cursor (a stream id; none means the start), checked before it reaches Redis."""
    if cursor is None or cursor == "":
        return START
    if not CURSOR.fullmatch(cursor) or max(_id_tuple(cursor)) > MAX_ID_PART:
        raise InvalidRequest(f"cursor {cursor!r} is not a stream id like '1700000000000-0'")
    return cursor


class Relay:
    """Reads one job's stream for one client."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, hub: StreamHub) -> None:
        self.redis = redis
        self.keys = keys
        self.hub = hub

    async def check(self, job_id: str, cursor: str) -> JobState:
        """The job's state; 404 for an unknown job, 410 for a cursor older than what is kept."""
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hget(self.keys.job(job_id), "status")
                pipe.xinfo_stream(self.keys.stream(job_id))
                status, info = await pipe.execute(raise_on_error=False)
        if status is None or isinstance(info, Exception):
            raise JobNotFound(f"no job {job_id}")
        if _id_tuple(cursor) < _oldest_readable(info):
            raise CursorExpired(
                f"events after {cursor} are no longer all kept; the oldest kept is {info['first-entry'][0]}",
                oldest=info["first-entry"][0],
            )
        return JobState(status)

    async def _read(self, job_id: str, cursor: str, count: int, block_ms: int | None) -> list[Entry]:
        with redis_errors():
            reply = await self.redis.xread({self.keys.stream(job_id): cursor}, count=count, block=block_ms)
        if not reply:
            return []
        return [Entry(entry_id, fields["type"], fields["data"]) for entry_id, fields in reply[0][1]]

    async def page(
        self, job_id: str, cursor: str, limit: int, wait: float
    ) -> tuple[list[Entry], JobState, bool]:
        """Up to `limit` entries after `cursor` (waiting up to `wait` s for one), the state, and done.

        The state is read before the entries: a job already ended has its terminal event
        in the stream, so an empty read past it means the client has seen everything.
        """
        state = await self.check(job_id, cursor)
        block = int(wait * 1000) if wait > 0 and not state.terminal else None
        entries = await self._read(job_id, cursor, limit, block)
        done = any(entry.terminal for entry in entries) or (state.terminal and not entries)
        for entry in entries:
            state = entry.state or state
        return entries, state, done

    async def _status(self, job_id: str) -> JobState:
        with redis_errors():
            status = await self.redis.hget(self.keys.job(job_id), "status")  # type: ignore[misc]
        if status is None:
            raise JobNotFound(f"no job {job_id}")
        return JobState(status)

    async def follow(self, job_id: str, cursor: str) -> AsyncIterator[Entry]:
        """Every entry after `cursor`, as it is appended, up to and including the terminal event.

        A cursor already at or past the terminal event ends the stream at once.
        """
        stream = self.keys.stream(job_id)
        while True:
            async with aclosing(self._catch_up(job_id, cursor)) as caught_up:
                async for entry in caught_up:
                    yield entry
                    cursor = entry.id
                    if entry.terminal:
                        return
            async with (
                self.hub.subscribe(stream, cursor) as subscription,
                aclosing(self._live(job_id, subscription, cursor)) as live,
            ):
                async for entry in live:
                    yield entry
                    cursor = entry.id
                    if entry.terminal:
                        return
                if not subscription.lagged:
                    return  # the job ended while idle and its follower has everything

    async def _catch_up(self, job_id: str, cursor: str) -> AsyncGenerator[Entry, None]:
        """What the stream already holds after `cursor`, with plain (non-blocking) reads."""
        while True:
            entries = await self._read(job_id, cursor, READ_BATCH, None)
            for entry in entries:
                yield entry
            if len(entries) < READ_BATCH:
                return
            cursor = entries[-1].id

    async def _live(
        self, job_id: str, subscription: Subscription, cursor: str
    ) -> AsyncGenerator[Entry, None]:
        """New entries from the hub, after filling the gap up to where the hub already was."""
        if _id_tuple(subscription.started_after) > _id_tuple(cursor):
            with redis_errors():
                gap = await self.redis.xrange(
                    self.keys.stream(job_id), min=f"({cursor}", max=subscription.started_after
                )
            for entry_id, fields in gap:
                yield Entry(entry_id, fields["type"], fields["data"])
                cursor = entry_id
        while not (subscription.lagged and subscription.queue.empty()):
            try:
                # Entries already delivered are taken at once, without a wait (and its task) each.
                if subscription.queue.empty():
                    item = await asyncio.wait_for(subscription.queue.get(), IDLE_CHECK_SECONDS)
                else:
                    item = subscription.queue.get_nowait()
            except asyncio.TimeoutError:
                # An ended job has its terminal event in the stream already (the same script
                # wrote both): once it has ended, an empty read after the cursor means nothing is left.
                if (await self._status(job_id)).terminal and not await self._read(job_id, cursor, 1, None):
                    return
                continue
            if isinstance(item, Exception):
                raise item
            if _id_tuple(item.id) > _id_tuple(cursor):
                yield item
                cursor = item.id
