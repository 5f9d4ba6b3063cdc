"""One client's follow of one job stream, from its cursor to the terminal event.

A follower first catches up with its own reads, then takes new entries from the process's one
`StreamHub` reader, as many at a time as have arrived; if it falls behind, it catches up again from
Redis, so a slow client costs Redis reads, never unbounded gateway memory.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Protocol

from gateway.relay.cursors import id_key
from gateway.relay.entries import Entry, entries_bytes
from gateway.relay.hub import StreamHub
from gateway.relay.open_streams import OpenStreams
from gateway.relay.subscription import LiveWriter, Subscription
from shared.errors import BackendUnavailable
from shared.events import TERMINAL_EVENT_TYPES
from shared.keys import Keys
from shared.redis_client import StreamsRedis, redis_errors

READ_BATCH = 512  # most entries one catch-up read asks for
FIRST_READ = 16  # a follow's first catch-up read, before the size of its stream's entries is known
IDLE_SECONDS = 5.0  # how long a silent follow waits before checking its job still exists


class Streams(Protocol):
    """What a follow reads its job's stream through: the gateway's `Relay`."""

    @property
    def keys(self) -> Keys: ...

    @property
    def hub(self) -> StreamHub: ...

    @property
    def streams(self) -> StreamsRedis: ...

    @property
    def open_streams(self) -> OpenStreams: ...

    async def read(self, job_id: str, cursor: str, count: int) -> list[Entry]:
        """Up to `count` entries after `cursor`, without waiting."""

    async def ended(self, job_id: str, cursor: str) -> bool:
        """Whether the job has ended and `cursor` is at its last entry."""


def _through_terminal(entries: list[Entry]) -> list[Entry]:
    """The entries up to and including the first terminal one: nothing after it is relayed."""
    for n, entry in enumerate(entries):
        if entry.terminal:
            return entries[: n + 1]
    return entries


def _batch_count(entries: list[Entry], batch_bytes: int) -> int:
    """How many entries like these make about `batch_bytes`: the next catch-up read's count."""
    return max(1, min(READ_BATCH, batch_bytes * len(entries) // max(1, entries_bytes(entries))))


class Following:
    """One client's follow of one job stream: `batches` gives the entries as many at a time as have
    arrived together. A cursor already at or past the terminal event ends the follow at once; `stop`
    ends it early (the client left, or the gateway stops)."""

    def __init__(self, relay: Streams, job_id: str, cursor: str, batch_bytes: int, at_end: bool) -> None:
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
        relay, cursor, hub_at = self.relay, id_key(self.cursor), id_key(subscription.started_after)
        if hub_at > cursor:
            with redis_errors():
                gap = await relay.streams.xrange(
                    relay.keys.stream(self.job_id), min=f"({self.cursor}", max=subscription.started_after
                )
            if gap:
                yield [Entry.of(entry_id, fields) for entry_id, fields in gap]
                cursor = id_key(gap[-1][0])
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
                    entries = [entry for entry in entries if id_key(entry.id) > cursor]
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
