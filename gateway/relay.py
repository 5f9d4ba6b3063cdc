"""Reading job streams from a client's cursor: follow until the terminal event, or one page.

A follower first catches up with its own reads, then takes new entries from the
process's one `StreamHub` reader, as many at a time as have arrived; if it falls
behind, it catches up again from Redis, so a slow client costs Redis reads, never
unbounded gateway memory. A long-poll page that has to wait for its first entry waits
the same way, and so does a cursor past the end of a running job's stream, for the stream
to reach it. A long-poll at the tip of a stream the hub watches is answered from what the hub knows
of it (`StreamHub.at_tip`), without a round trip to Redis.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import redis.asyncio as aioredis

from gateway.entries import Entry, entries_bytes
from gateway.fanout import LiveWriter, StreamHub, Subscription
from shared.config import GatewaySettings
from shared.errors import BackendUnavailable, CursorExpired, InvalidRequest, JobNotFound, Overloaded
from shared.events import TERMINAL_EVENT_TYPES, JobState
from shared.keys import ANONYMOUS_OWNER, Keys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import CursorCheckArgs
from shared.lifecycle.transitions import Transitions
from shared.redis_client import StreamsRedis, redis_errors

CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
MAX_ID_PART = 2**64 - 1
START = "0-0"
READ_BATCH = 512  # most entries one catch-up read asks for
FIRST_READ = 16  # a follow's first catch-up read, before the size of its stream's entries is known
DEFAULT_BATCH_BYTES: int = GatewaySettings.model_fields["reader_batch_bytes"].default
IDLE_SECONDS = 5.0  # how long a silent follow waits before checking its job still exists
AHEAD_WAIT_SECONDS = 10.0  # for a running job's stream to reach a cursor past its end (a failover)
HEAL_SECONDS = 5.0
"""With the streams apart, how long after a job's record ended without a worker its stream may still
lack the end before a reader ends it: the record's end and the stream's are one round trip apart."""


def _id_tuple(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


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
    return _id_tuple(cursor) > _id_tuple(found.last)


def parse_cursor(cursor: str | None) -> str:
    """A client's cursor (a stream id; none means the start), checked before it reaches Redis."""
    if cursor is None or cursor == "":
        return START
    if not CURSOR.fullmatch(cursor) or max(_id_tuple(cursor)) > MAX_ID_PART:
        raise InvalidRequest(f"cursor {cursor!r} is not an event id like '12-1'")
    return cursor


def _through_terminal(entries: list[Entry]) -> list[Entry]:
    """The entries up to and including the first terminal one: nothing after it is relayed."""
    for n, entry in enumerate(entries):
        if entry.terminal:
            return entries[: n + 1]
    return entries


def _batch_count(entries: list[Entry], batch_bytes: int) -> int:
    """How many entries like these make about `batch_bytes`: the next catch-up read's count."""
    return max(1, min(READ_BATCH, batch_bytes * len(entries) // max(1, entries_bytes(entries))))


@dataclass(frozen=True)
class StreamLimits:
    """How many streams one gateway process serves at once, in all and per API key, and how many
    bytes of events one of them holds."""

    most: int
    most_per_owner: int
    batch_bytes: int

    @classmethod
    def of(cls, settings: GatewaySettings) -> StreamLimits:
        return cls(settings.max_open_streams, settings.max_open_streams_per_key, settings.reader_batch_bytes)


class Hold:
    """One place among a gateway's open readers (`OpenStreams.hold`), given back once: at the end of
    its `with` block, unless `hand_over` passed it on to what outlives the block (a streamed answer)."""

    def __init__(self, streams: OpenStreams | None, owner: str) -> None:
        self._streams = streams
        self.owner = owner

    def hand_over(self) -> Hold:
        """This place, now given back by whoever takes the returned hold, not by this one."""
        handed, self._streams = Hold(self._streams, self.owner), None
        return handed

    def release(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            streams.let_go(self.owner)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


NOT_HELD = Hold(None, ANONYMOUS_OWNER)
"""The hold of a request that holds no connection open (it is answered at once)."""


class OpenStreams:
    """Every request that holds a connection open on a job (event streams, waiting polls, a cursor
    waiting for its stream, streamed or whole OpenAI, TGI and Responses answers, a cancel waiting for
    its job's end) holds a place here, so that none holds more than its share; and the native follows,
    so that shutting down can end them all."""

    def __init__(self) -> None:
        self._followings: set[Following] = set()
        self._held = 0
        self._held_by: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._followings)

    @property
    def held(self) -> int:
        """The places held now, by readers of every kind (`streampool_readers_open`)."""
        return self._held

    def hold(self, owner: str, limits: StreamLimits) -> Hold:
        """A place for one more reader of `owner`'s, until the hold is given back; `Overloaded` (429)
        when the gateway, or the owner's API key, is at its limit. Where no key is required every
        client is the one anonymous owner: the total bounds them."""
        if self._held >= limits.most:
            raise Overloaded(
                f"this gateway serves {limits.most} streams, its limit; retry, or through another"
            )
        if owner != ANONYMOUS_OWNER and self._held_by[owner] >= limits.most_per_owner:
            raise Overloaded(
                f"this API key has {limits.most_per_owner} streams open on this gateway, its limit"
            )
        self._held += 1
        self._held_by[owner] += 1
        return Hold(self, owner)

    def let_go(self, owner: str) -> None:
        self._held -= 1
        self._held_by[owner] -= 1
        if not self._held_by[owner]:
            del self._held_by[owner]

    @contextmanager
    def open(self, following: Following) -> Iterator[None]:
        """While a follow runs that a stopping gateway ends at once."""
        self._followings.add(following)
        try:
            yield
        finally:
            self._followings.discard(following)

    def close(self) -> None:
        """End every stream now (without a terminal event: its clients reconnect from their cursor)."""
        for following in self._followings:
            following.stop()


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
        self.transitions = Transitions(redis, keys, streams) if streams is not None else None
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
        return state, _id_tuple(cursor) >= _id_tuple(found.last), found.entries

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
        ms, seq = _id_tuple(cursor)
        args: CursorCheckArgs = {"cursor": f"{ms}-{seq}", "count": count}
        if self.transitions is not None:
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
        assert self.transitions is not None
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
                    await self.transitions.end_stream(
                        job_id, [(kind, data)], maxlen=None, retention_seconds=max(ttl, 1), now=time.time()
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
            if self.transitions is not None and status is not None:  # ended once its stream has
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


class Following:
    """One client's follow of one job stream: `batches` gives the entries as many at a time as have
    arrived together. A cursor already at or past the terminal event ends the follow at once; `stop`
    ends it early (the client left, or the gateway stops)."""

    def __init__(self, relay: Relay, job_id: str, cursor: str, batch_bytes: int, at_end: bool) -> None:
        self.relay = relay
        self.job_id = job_id
        self.cursor = cursor
        self.batch_bytes = batch_bytes
        self.stopped = False
        self.write_now: LiveWriter | None = None
        """Set by an answer that can write an entry to its client at once (`EventStream`): live
        entries then reach it from the hub's callback while `batches` waits (see `write_directly`)."""
        self._at_end = at_end  # the first catch-up read is skipped (`Relay.follow`)
        self._subscription: Subscription | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._subscription is not None:
            self._subscription.interrupt()

    async def batches(self, idle_seconds: float) -> AsyncGenerator[list[Entry], None]:
        """New entries in order, in batches as they arrive; an empty batch after each
        `idle_seconds` of silence (when a client may want a keep-alive)."""
        relay = self.relay
        stream = relay.keys.stream(self.job_id)
        while not self.stopped:
            if self._at_end:  # nothing to catch up with first (`Relay.follow`): a waiting poll's case
                self._at_end = False
            else:
                async with aclosing(self._catch_up()) as caught_up:
                    async for batch in caught_up:
                        batch = _through_terminal(batch)
                        self.cursor = batch[-1].id
                        yield batch
                        if batch[-1].terminal:
                            return
                if self.stopped:
                    return
            with relay.hub.subscribe(stream, self.cursor, self.batch_bytes) as subscription:
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

    async def first_batch(self, idle_seconds: float) -> list[Entry]:
        """The first batch `batches` gives (none after `idle_seconds` of silence), for a long-poll.

        A poll comes once per step of its job, at the stream's tip: there the hub's cursor for the
        stream is the follow's, so there is no gap to fill and nothing read twice, and the batch is
        what one wait on the hub brings. That case takes none of `batches`' generators, made and
        closed for each poll (without them, long-polls alone cost the gateway about 0.73 of the CPU an
        event: bench/RESULTS.md, section 9). Elsewhere, and for a follower the hub dropped, `batches`
        gives it. A wait with nothing at its end answers none, as `batches` does whether or not the
        job ended meanwhile.
        """
        if self._at_end and not self.stopped:
            self._at_end = False  # whatever comes of it, `batches` after it reads the stream first
            stream = self.relay.keys.stream(self.job_id)
            with self.relay.hub.subscribe(stream, self.cursor, self.batch_bytes) as subscription:
                if subscription.started_after == self.cursor:
                    self._subscription = subscription
                    try:
                        await subscription.wait(idle_seconds)
                    finally:
                        self._subscription = None
                    if not subscription.lagged:
                        batch = _through_terminal(subscription.take())
                        if batch:
                            self.cursor = batch[-1].id
                        return batch
                else:
                    self._at_end = True  # the hub is elsewhere in the stream: `batches` fills the gap
        async with aclosing(self.batches(idle_seconds)) as batches:
            async for batch in batches:
                return batch
        return []

    async def _catch_up(self) -> AsyncGenerator[list[Entry], None]:
        """What the stream already holds after the cursor, with plain (non-blocking) reads of about
        `batch_bytes` each: each read's count follows the size of the entries the last one brought
        (a delta with 20 logprobs a token is ten times a plain one), so that a reader that cannot
        keep up holds a bounded number of bytes, not of entries (a follow known to be at the end
        skips it at first: `batches`); a follow dropped for lagging reads from then on."""
        cursor, count = self.cursor, FIRST_READ
        while not self.stopped:
            entries = await self.relay.read(self.job_id, cursor, count)
            if entries:
                yield entries
                cursor = entries[-1].id
            if len(entries) < count:
                return
            count = _batch_count(entries, self.batch_bytes)

    async def _live(
        self, subscription: Subscription, idle_seconds: float
    ) -> AsyncGenerator[list[Entry], None]:
        """New entries from the hub, after filling the gap up to where the hub already was."""
        relay, cursor, hub_at = self.relay, _id_tuple(self.cursor), _id_tuple(subscription.started_after)
        if hub_at > cursor:
            with redis_errors():
                gap = await relay.streams.xrange(
                    relay.keys.stream(self.job_id), min=f"({self.cursor}", max=subscription.started_after
                )
            if gap:
                yield [Entry.of(entry_id, fields) for entry_id, fields in gap]
                cursor = _id_tuple(gap[-1][0])
        # Ahead of the hub's cursor, this follow may be handed entries it has already read (from a
        # read sent before it subscribed); once past them, the hub only hands over new ones.
        ahead = cursor > hub_at
        direct = self.write_now is not None  # to hand to the hub, once past what the follow has read
        while True:
            if direct and not ahead:
                subscription.direct, direct = self.write_directly, False
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

    def write_directly(self, entry_id: str, kind: str, data: str) -> bool:
        """A notice's entry the hub hands over while `batches` waits with nothing pending, written to the
        client at once (`write_now`), the cursor moved past it; False to have it yielded by `batches`
        instead: a terminal entry (the follow ends with it), a follow stopped, or a client that cannot
        take it now."""
        if self.stopped or kind in TERMINAL_EVENT_TYPES:
            return False
        assert self.write_now is not None
        if not self.write_now(entry_id, kind, data):
            return False
        self.cursor = entry_id
        return True

    async def _ended_while_idle(self) -> bool:
        """Whether a silent job has ended with nothing left to read; Redis down counts as not
        (the hub resumes the stream once Redis is back)."""
        try:
            return await self.relay.ended(self.job_id, self.cursor)
        except BackendUnavailable:
            return False
