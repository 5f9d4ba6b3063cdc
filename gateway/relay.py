"""Reading job streams from a client's cursor: follow until the terminal event, or one page.

A follower first catches up with its own reads, then takes new entries from the
process's one `StreamHub` reader, as many at a time as have arrived; if it falls
behind, it catches up again from Redis, so a slow client costs Redis reads, never
unbounded gateway memory. A long-poll page that has to wait for its first entry waits
the same way.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import redis.asyncio as aioredis

from gateway.entries import Entry
from gateway.fanout import StreamHub, Subscription
from gateway.sse import OpenStreams
from shared.errors import BackendUnavailable, CursorExpired, InvalidRequest, JobNotFound
from shared.events import JobState
from shared.keys import Keys
from shared.redis_client import redis_errors

CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
MAX_ID_PART = 2**64 - 1
START = "0-0"
READ_BATCH = 512
IDLE_SECONDS = 5.0  # how long a silent follow waits before checking its job still exists


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


def _through_terminal(entries: list[Entry]) -> list[Entry]:
    """The entries up to and including the first terminal one: nothing after it is relayed."""
    for n, entry in enumerate(entries):
        if entry.terminal:
            return entries[: n + 1]
    return entries


class Relay:
    """Reads job streams for clients: one page, or a follow to the terminal event."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, hub: StreamHub) -> None:
        self.redis = redis
        self.keys = keys
        self.hub = hub
        self.open_streams = OpenStreams()

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

    async def read(self, job_id: str, cursor: str, count: int) -> list[Entry]:
        """Up to `count` entries after `cursor`, without waiting."""
        with redis_errors():
            reply = await self.redis.xread({self.keys.stream(job_id): cursor}, count=count)
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
        entries = await self.read(job_id, cursor, limit)
        if not entries and wait > 0 and not state.terminal:
            entries = (await self._first_batch(job_id, cursor, wait))[:limit]
        done = any(entry.terminal for entry in entries) or (state.terminal and not entries)
        for entry in entries:
            state = entry.state or state
        return entries, state, done

    async def _first_batch(self, job_id: str, cursor: str, wait: float) -> list[Entry]:
        """The entries after `cursor` as soon as there are any, or none after `wait` s.

        A poll waits as a follow does, on the hub's one reader, so that waiting polls hold no
        Redis connection each; and among the open streams, so that a gateway shutting down
        answers it at once (the client polls again, elsewhere, from the same cursor).
        """
        following = self.follow(job_id, cursor)
        with self.open_streams.open(following):
            async with aclosing(following.batches(wait)) as batches:
                async for batch in batches:
                    return batch
        return []

    async def ended(self, job_id: str, cursor: str) -> bool:
        """Whether the job has ended and `cursor` is at its last entry.

        An ended job has its terminal event in the stream already (the same script wrote
        both): once it has ended, an empty read after the cursor means nothing is left.
        """
        with redis_errors():
            status = await self.redis.hget(self.keys.job(job_id), "status")  # type: ignore[misc]
        if status is None:
            raise JobNotFound(f"no job {job_id}")
        return JobState(status).terminal and not await self.read(job_id, cursor, 1)

    def follow(self, job_id: str, cursor: str) -> Following:
        """Every entry after `cursor`, as it is appended, up to and including the terminal event."""
        return Following(self, job_id, cursor)


class Following:
    """One client's follow of one job stream: `async for` gives one entry at a time, `batches`
    gives as many as have arrived together. A cursor already at or past the terminal event
    ends the follow at once; `stop` ends it early (the client left, or the gateway stops)."""

    def __init__(self, relay: Relay, job_id: str, cursor: str) -> None:
        self.relay = relay
        self.job_id = job_id
        self.cursor = cursor
        self.stopped = False
        self._subscription: Subscription | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._subscription is not None:
            self._subscription.interrupt()

    async def __aiter__(self) -> AsyncIterator[Entry]:
        async with aclosing(self.batches(IDLE_SECONDS)) as batches:
            async for batch in batches:
                for entry in batch:
                    yield entry

    async def batches(self, idle_seconds: float) -> AsyncGenerator[list[Entry], None]:
        """New entries in order, in batches as they arrive; an empty batch after each
        `idle_seconds` of silence (when a client may want a keep-alive)."""
        relay = self.relay
        stream = relay.keys.stream(self.job_id)
        while not self.stopped:
            async with aclosing(self._catch_up()) as caught_up:
                async for batch in caught_up:
                    batch = _through_terminal(batch)
                    self.cursor = batch[-1].id
                    yield batch
                    if batch[-1].terminal:
                        return
            if self.stopped:
                return
            async with relay.hub.subscribe(stream, self.cursor) as subscription:
                self._subscription = subscription
                try:
                    async with aclosing(self._live(subscription, idle_seconds)) as live:
                        async for batch in live:
                            batch = _through_terminal(batch)
                            if batch:
                                self.cursor = batch[-1].id
                            yield batch
                            if batch and batch[-1].terminal:
                                return
                finally:
                    self._subscription = None
                if not subscription.lagged:
                    return  # stopped, or the job ended while idle and this follow has everything

    async def _catch_up(self) -> AsyncGenerator[list[Entry], None]:
        """What the stream already holds after the cursor, with plain (non-blocking) reads."""
        cursor = self.cursor
        while not self.stopped:
            entries = await self.relay.read(self.job_id, cursor, READ_BATCH)
            if entries:
                yield entries
                cursor = entries[-1].id
            if len(entries) < READ_BATCH:
                return

    async def _live(
        self, subscription: Subscription, idle_seconds: float
    ) -> AsyncGenerator[list[Entry], None]:
        """New entries from the hub, after filling the gap up to where the hub already was."""
        relay, cursor, hub_at = self.relay, _id_tuple(self.cursor), _id_tuple(subscription.started_after)
        if hub_at > cursor:
            with redis_errors():
                gap = await relay.redis.xrange(
                    relay.keys.stream(self.job_id), min=f"({self.cursor}", max=subscription.started_after
                )
            if gap:
                yield [Entry(entry_id, fields["type"], fields["data"]) for entry_id, fields in gap]
                cursor = _id_tuple(gap[-1][0])
        # Ahead of the hub's cursor, this follow may be handed entries it has already read (from a
        # read sent before it subscribed); once past them, the hub only hands over new ones.
        ahead = cursor > hub_at
        while True:
            await subscription.wait(idle_seconds)
            if self.stopped:
                return
            entries = subscription.take()
            if entries:
                if ahead:
                    entries = [entry for entry in entries if _id_tuple(entry.id) > cursor]
                    ahead = not entries
                if entries:
                    yield entries
            elif subscription.lagged or await self._ended_while_idle():
                return
            else:
                yield []

    async def _ended_while_idle(self) -> bool:
        """Whether a silent job has ended with nothing left to read; Redis down counts as not
        (the hub resumes the stream once Redis is back)."""
        try:
            return await self.relay.ended(self.job_id, self.cursor)
        except BackendUnavailable:
            return False
