"""Reading job streams for clients from a cursor: one long-poll page, or a follow to the terminal
event (`gateway.relay.following`), the cursor checked in Redis first.

A long-poll page that has to wait for its first entry waits on the process's one `StreamHub`
reader, as a follow does, and so does a cursor past the end of a running job's stream, for the
stream to reach it. A long-poll at the tip of a stream the hub watches is answered from what the hub
knows of it (`StreamHub.at_tip`), without a round trip to Redis.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

import redis.asyncio as aioredis

from gateway.relay.cursors import id_key
from gateway.relay.entries import Entry
from gateway.relay.following import Following
from gateway.relay.hub import StreamHub
from gateway.relay.open_streams import Hold, OpenStreams, StreamLimits
from shared.config import GatewaySettings
from shared.errors import CursorExpired, InvalidRequest, JobNotFound
from shared.events import TERMINAL_EVENT_TYPES, JobState
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import CursorCheckArgs
from shared.lifecycle.planes import end_stream
from shared.redis_client import StreamsRedis, redis_errors

DEFAULT_BATCH_BYTES: int = GatewaySettings.model_fields["reader_batch_bytes"].default
AHEAD_WAIT_SECONDS = 10.0  # for a running job's stream to reach a cursor past its end (a failover)
HEAL_SECONDS = 5.0
"""With the streams apart, how long after a job's record ended without a worker its stream may still
lack the end before a reader ends it: the record's end and the stream's are one round trip apart."""


class AtCursor(NamedTuple):
    """What a reader's cursor finds in its job's stream (`cursor_check.lua`): the last id the stream
    generated; the first entry it keeps where it has lost entries after the cursor ('' where it has
    not: entries trimmed off the head sit below the first one kept, and a cursor exactly at the last
    trimmed entry lacks none but is refused too, as the stream no longer says which that was); and
    the first entries after the cursor, as many as were asked for."""

    last: str
    oldest: str
    entries: list[Entry]


def _past(cursor: str, found: AtCursor) -> bool:
    """Whether `cursor` is past the last entry the stream has had."""
    return id_key(cursor) > id_key(found.last)


class Relay:
    """Reads job streams for clients: one page, or a follow to the terminal event."""

    def __init__(
        self, redis: aioredis.Redis, keys: Keys, hub: StreamHub, streams: StreamsRedis | None = None
    ) -> None:
        """`streams`: the Redis of the job streams when they have their own (`streams_redis_url`)."""
        self.redis = redis
        self.keys = keys
        self.hub = hub
        self.streams = redis if streams is None else streams
        self.apart = streams is not None
        self.open_streams = OpenStreams()

    async def check(
        self, job_id: str, cursor: str, owner: str, limits: StreamLimits, count: int = 0
    ) -> tuple[JobState, bool, list[Entry]]:
        """The job's state, whether `cursor` is at or past the stream's last entry (nothing left to
        read now), and up to `count` entries after it, read in the same round trip; 404 for an
        unknown job, 410 for a cursor older than what is kept, 422 for a cursor past the end of a
        running job's stream that the stream does not reach within `AHEAD_WAIT_SECONDS`, or before
        the job ends. Such a wait holds a place of `owner`'s among the open readers (429 past the
        limits).

        A cursor past the end names no event the stream holds: relayed to the hub, whose one read
        of a stream starts after its first follower's cursor, it would hide every new entry from
        every other follower of the job. Such a cursor is one a client got from a master that died
        before its replica had the last events (the job's worker writes them again on the new
        master, with the same ids) or none this job sent: the first is waited for, the second
        refused. A finished job has nothing after its terminal event, so there such a cursor is
        simply at the end.
        """
        state, found = await self._checked(job_id, cursor, owner, limits, count)
        return state, id_key(cursor) >= id_key(found.last), found.entries

    async def _checked(
        self, job_id: str, cursor: str, owner: str, limits: StreamLimits, count: int
    ) -> tuple[JobState, AtCursor]:
        """`check`'s answer: the job's state and what `cursor` finds in its stream."""
        state, found = await self._state_and_stream(job_id, owner, cursor, count)
        if not state.terminal and _past(cursor, found):
            with self.open_streams.hold(owner, limits):
                state, found = await self._until_reached(job_id, owner, cursor, count, found)
            if _past(cursor, found):
                raise InvalidRequest(
                    f"cursor {cursor} is past the job's last event {found.last}: "
                    "resume from the id of an event this job sent"
                )
        if found.oldest:
            raise CursorExpired(
                f"events after {cursor} are no longer all kept; the oldest kept is {found.oldest}",
                oldest=found.oldest,
            )
        return state, found

    async def _until_reached(
        self, job_id: str, owner: str, cursor: str, count: int, found: AtCursor
    ) -> tuple[JobState, AtCursor]:
        """The job's state and stream once the stream has reached `cursor`, the job has ended, or
        `AHEAD_WAIT_SECONDS` have passed.

        Woken by the hub's one reader as entries are appended, the wait reads the stream's end once
        per batch of them and never polls: one that no entry comes to reads it three times in all
        (polling every 0.1 s, 50 such waits cost Redis about 10,000 reads). The hub watches the stream
        from its last id, a point it has reached.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AHEAD_WAIT_SECONDS
        stream = self.keys.stream(job_id)
        while True:
            with self.hub.subscribe(stream, found.last, DEFAULT_BATCH_BYTES) as woken:
                while not woken.lagged:  # a dropped subscription is made again
                    state, found = await self._state_and_stream(job_id, owner, cursor, count)
                    if state.terminal or not _past(cursor, found) or loop.time() >= deadline:
                        return state, found
                    await woken.wait(deadline - loop.time())
                    woken.take()

    async def _state_and_stream(
        self, job_id: str, owner: str, cursor: str, count: int
    ) -> tuple[JobState, AtCursor]:
        """The job's state and what `cursor` finds in its stream, up to `count` entries after it
        included, in one script (`cursor_check.lua`: XINFO STREAM would answer with the stream's first
        and last entries whole); 404 for an unknown job or another owner's, which the events route
        leaves to this one round trip (a long-poll makes one a batch of events).

        The status is read before the stream: the script that ends a job writes both, so a job read
        as ended has its terminal event in what follows."""
        ms, seq = id_key(cursor)
        args: CursorCheckArgs = {"cursor": f"{ms}-{seq}", "count": count}
        if self.apart:
            return await self._state_and_stream_apart(job_id, owner, args)
        keys = [self.keys.job(job_id), self.keys.stream(job_id)]
        with redis_errors():
            answer = await scripts.CURSOR_CHECK(self.redis, keys, args)
        if not answer or len(answer) < 5 or answer[1] != owner:
            raise JobNotFound(f"no job {job_id}")
        status, _, last, oldest, entries = answer
        return JobState(status), AtCursor(last, oldest, [Entry.of_pairs(*entry) for entry in entries])

    async def _state_and_stream_apart(
        self, job_id: str, owner: str, args: CursorCheckArgs, *, heal: bool = True
    ) -> tuple[JobState, AtCursor]:
        """`_state_and_stream` with the streams on a Redis of their own: the record is read there
        first, then the stream. A job no worker ended (a cancel, a deadline, a job out of attempts)
        ends in its record first: until its stream ends too the job reads as running, so that its
        readers wait for the end rather than stop short of it; one whose stream has not ended
        `HEAL_SECONDS` after its record (the hand that ended it stopped between the two) has its
        stream ended here, with the terminal event the record keeps (`end_event.lua`)."""
        record = self.keys.job(job_id)
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(record, ["status", "owner", "finished_at", "end_event"])
                pipe.ttl(record)
                (status, recorded_owner, finished_at, end_event), ttl = await pipe.execute()
            answer = await scripts.CURSOR_CHECK(self.streams, [self.keys.stream(job_id)], args)
        if status is None or recorded_owner != owner or len(answer) < 5:
            raise JobNotFound(f"no job {job_id}")
        stream_ended, _, last, oldest, entries = answer
        state = JobState(status)
        if state.terminal and stream_ended != "ended":
            if heal and end_event and finished_at and time.time() - float(finished_at) > HEAL_SECONDS:
                kind, _, data = end_event.partition(" ")
                with redis_errors():
                    await end_stream(
                        self.streams,
                        self.keys,
                        job_id,
                        [(kind, data)],
                        maxlen=None,
                        retention_seconds=max(ttl, 1),
                        now=time.time(),
                    )
                return await self._state_and_stream_apart(job_id, owner, args, heal=False)
            state = JobState.running
        return state, AtCursor(last, oldest, [Entry.of_pairs(*entry) for entry in entries])

    async def open(
        self, job_id: str, cursor: str, owner: str, limits: StreamLimits
    ) -> tuple[Following, Hold]:
        """A follow of the job from a client's cursor, checked first (see `check`), and its place among
        the owner's open readers (see `OpenStreams.hold`), for the answer that streams it to give back;
        one already at the end of a finished job ends at once."""
        state, at_end, _ = await self.check(job_id, cursor, owner, limits)
        hold = self.open_streams.hold(owner, limits)
        following = self.follow(job_id, cursor, limits.batch_bytes, at_end=at_end)
        if state.terminal and at_end:
            following.stop()
        return following, hold

    async def read(self, job_id: str, cursor: str, count: int) -> list[Entry]:
        """Up to `count` entries after `cursor`, without waiting."""
        with redis_errors():  # XRANGE names its key where a Redis Cluster's client finds it unasked
            entries = await self.streams.xrange(self.keys.stream(job_id), min=f"({cursor}", count=count)
        return [Entry.of(entry_id, fields) for entry_id, fields in entries]

    async def page(
        self, job_id: str, cursor: str, limit: int, wait: float, owner: str, limits: StreamLimits
    ) -> tuple[list[Entry], JobState, bool]:
        """Up to `limit` entries after `cursor` (waiting up to `wait` s for one), the state, and done.

        The state is read before the entries: a job already ended has its terminal event
        in the stream, so an empty read past it means the client has seen everything. The check
        reads the entries too, in its one round trip; a cursor at the stream's end waits at once.

        A cursor at the tip of a stream the hub watches, as the hub's notices tell it, of the caller's
        job that had not ended by then, needs no check: the job's owner and state are what the last
        check found, the state moved on by the entries since (`StreamHub.at_tip`); a cursor the hub
        has not seen, another owner's, or a job ended is checked in Redis. A check that finds the
        cursor at the tip leaves the hub what it found, for the client's next poll.
        """
        stream = self.keys.stream(job_id)
        known = self.hub.at_tip(stream, cursor)
        if known is not None and known.owner == owner:
            state, entries = known.state, []
        else:
            state, found = await self._checked(job_id, cursor, owner, limits, limit)
            entries = found.entries
            if not entries and wait > 0 and not state.terminal and cursor == found.last:
                self.hub.remember(stream, found.last, owner, state)
        if not entries and wait > 0 and not state.terminal:
            entries = (await self._first_batch(job_id, cursor, wait, owner, limits))[:limit]
        done = any(entry.terminal for entry in entries) or (state.terminal and not entries)
        for entry in entries:
            state = entry.state or state
        return entries, state, done

    async def _first_batch(
        self, job_id: str, cursor: str, wait: float, owner: str, limits: StreamLimits
    ) -> list[Entry]:
        """The entries after `cursor` as soon as there are any, or none after `wait` s.

        A poll waits as a follow does, on the hub's one reader, so that waiting polls hold no
        Redis connection each; and among the open streams, so that a gateway shutting down
        answers it at once (the client polls again, elsewhere, from the same cursor). A waiting
        poll counts as an open stream.
        """
        following = self.follow(job_id, cursor, limits.batch_bytes, at_end=True)
        with self.open_streams.hold(owner, limits), self.open_streams.open(following):
            return await following.first_batch(wait)

    async def ended(self, job_id: str, cursor: str) -> bool:
        """Whether the job has ended and `cursor` is at its last entry.

        An ended job has its terminal event in the stream already (the same script wrote
        both): once it has ended, an empty read after the cursor means nothing is left.
        """
        with redis_errors():
            status = await self.redis.hget(self.keys.job(job_id), "status")  # type: ignore[misc]
            if self.apart and status is not None:  # ended once its stream has
                last = await self.streams.xrevrange(self.keys.stream(job_id), count=1)
                status = status if last and last[0][1].get("type") in TERMINAL_EVENT_TYPES else "running"
        if status is None:
            raise JobNotFound(f"no job {job_id}")
        return JobState(status).terminal and not await self.read(job_id, cursor, 1)

    def follow(
        self, job_id: str, cursor: str, batch_bytes: int = DEFAULT_BATCH_BYTES, *, at_end: bool = False
    ) -> Following:
        """Every entry after `cursor`, as it is appended, up to and including the terminal event,
        about `batch_bytes` at most at a time; whoever answers with it holds its place among the open
        readers (`OpenStreams.hold`).

        `cursor` is the start, or one `check` has let through (`open` does both): the hub must
        never be asked to watch a stream from past its end. `at_end`: a read just found nothing after
        `cursor`, so the follow subscribes at once, without reading the stream first (the hub reads
        a stream it begins to watch, and what came since that read is in that one)."""
        return Following(self, job_id, cursor, batch_bytes, at_end)
