"""One Redis reader per gateway process, fanning new stream entries out to every follower.

A follower catches up on its own with plain reads; once it has read all there is, it
subscribes here. Every script that appends to job streams then publishes a notice of what it
appended (`shared.notices`; a worker's step one message for all of its jobs in a notice
partition): a line per entry, the entry itself, or only its stream's name. The hub listens to
the notices of the partitions of the streams it watches, and only to those, and hands an entry
to a stream's followers straight from its line when it is the one after the stream's cursor: in
steady flow, live events cost Redis one PUBLISH a step and partition and no read at all,
whatever the number of streams followed (as Centrifugo relays over Redis: pub/sub for what is
live, the stream for catch-up and replay). A stream whose line is its name, or whose entry is not
the next (the hub missed one), is read from its cursor instead, with every other such stream, in one XREAD; an
entry it already has is dropped. Connections do not grow with open streams: the hub has one for
the notices and one for its reads. A notice missed entirely (the listening connection dropped)
costs nothing: on every (re)subscription, and every `SWEEP_SECONDS` in any case, the hub reads
every stream it watches.

The hub reads a stream from after its first follower's cursor, and a later follower fills the
gap from its own cursor by itself; so a follower's cursor must name a point the stream has reached
(the relay checks a client's against the stream's last id first): one past the end would hide
every new entry from every follower of the stream. A new stream is read at once: entries may
have come between its follower's last read and the subscription, their notice gone by.

A follower is woken once per batch of entries, not once per entry, and takes them all
at once; one that waits with nothing pending may take a notice's entry without being woken at all,
written to its client from the hub's callback straight from the notice's fields, with no `Entry`
made (`Subscription.direct`: the native event streams). One
that does not keep up is dropped (`lagged`) and catches up from Redis on its own, so a slow
client costs Redis reads, never unbounded gateway memory. When Redis fails, the reader retries
with backoff and carries on from every stream's cursor, so open streams resume by themselves
once Redis is back.

The hub also keeps, for a stream a long-poll waits on, what the relay's last check in Redis found
of its job (`Checked`: the owner and the state, moved on by the status and terminal entries the hub
hands out since): a poll whose cursor is the hub's cursor for that stream, the stream's tip as far
as the notices say, is answered from it (`at_tip`), with no round trip to Redis. Such a stream stays
watched for `LINGER_SECONDS` after its last poll, for the client's next one; what the hub knows is
forgotten whenever the notices may have been missed (the listening connection dropped, a read
failed) or a follower of the stream fell behind.

Where the notices come from and how the streams are read, on one Redis or on a Redis Cluster's
masters, is the hub's `NoticeSource` (`gateway.relay.notices`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from redis.exceptions import RedisError

from gateway.relay.entries import Entry, entries_bytes
from gateway.relay.notices import NoticeSource
from gateway.relay.subscription import Subscription
from gateway.relay.watches import Checked, Watched
from shared.events import JobState
from shared.notices import LINE, UNIT

log = logging.getLogger(__name__)

HUB_READ_COUNT = 256  # most entries of one stream a read takes; a stream read out is read again
SWEEP_SECONDS = 5.0  # how often every watched stream is read, whatever the notices said
RETRY_FIRST_SECONDS = 0.05  # the reader's first wait after a Redis failure, doubled up to the last
RETRY_LAST_SECONDS = 2.0
LINGER_SECONDS = 3.0
"""How long a long-polled stream stays watched after its last poll is answered. The client asks again
as soon as it has the answer, a round trip later, from the answer's last entry: a stream still watched
then answers that poll at its tip from what the hub knows (`at_tip`), without the check's round trip
to Redis and without the read that watching a stream anew begins with. A few seconds cover a slow
client's round trip; longer would only hold, for clients that have gone, memory and sweep reads."""
CHECKED_SECONDS = 30.0
"""How long what a check found of a job (`Checked`) answers for it, however many polls it answers. A
running job's record can go without an entry to say so (an abandoned job's lifetime lapsing): a poll
answered from the hub learns of it this late at most, as late as a poll checked in Redis answers with
what its check found before a wait of the default `poll_wait_max`."""


def _entry(entry_id: str, fields: list[str]) -> Entry:
    if fields[0] == "type" and fields[2] == "data":  # the order every writer of job streams uses
        return Entry(entry_id, fields[1], fields[3], fields[5] if len(fields) > 5 else "")
    return Entry.of(entry_id, dict(zip(fields[::2], fields[1::2], strict=True)))


class StreamHub:
    def __init__(self, source: NoticeSource, on_written: Callable[[str], None] | None = None) -> None:
        self._source = source
        self._on_written = on_written
        """Told, once per notice of which entries went straight to clients, the last one's `at`
        (a step's entries share it): the relay lag, observed once per step, not per entry."""
        self._watched: dict[str, Watched] = {}
        self._due: set[str] = set()  # watched streams to read: named by a notice, new, or not read out
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._partitions: dict[int, int] = {}  # a notice partition: how many of its streams are watched
        self._heard: set[int] = set()  # notice partitions subscribed to, since the listener's last failure

    @property
    def streams(self) -> int:
        """How many streams the reader watches."""
        return len(self._watched)

    async def close(self) -> None:
        for task in (self._task, self._listener):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._source.aclose()

    @contextmanager
    def subscribe(self, stream: str, cursor: str, max_bytes: int) -> Iterator[Subscription]:
        """Entries of `stream` appended after the hub's cursor for it (see `started_after`), up to
        about `max_bytes` of them waiting to be taken. A plain context manager: subscribing awaits
        nothing, and a waiting long-poll subscribes once a page."""
        watched = self._watch(stream, cursor)
        subscription = Subscription(stream, watched.cursor, max_bytes)
        watched.subscriptions += (subscription,)
        try:
            yield subscription
        finally:
            subscription.close()
            self._unsubscribe(subscription)

    def at_tip(self, stream: str, cursor: str) -> Checked | None:
        """What the last check found of `stream`'s job, when `cursor` is the last entry the hub has of
        the stream, the job had not ended by it, and the hub has missed no notice of the stream since
        (it listens, and has no read of the stream to make); else None, and the caller checks in Redis."""
        watched = self._watched.get(stream)
        if watched is None or watched.checked is None or watched.cursor != cursor:
            return None
        checked = watched.checked
        if watched.partition not in self._heard or stream in self._due or checked.state.terminal:
            return None
        if asyncio.get_running_loop().time() >= checked.until:
            watched.checked = None
            return None
        return checked

    def remember(self, stream: str, last: str, owner: str, state: JobState) -> None:
        """What a check in Redis found of `stream`'s job as of the stream's last entry `last`, for
        `at_tip` to answer polls at the stream's tip with: the stream is watched from `last` (lingering
        after its last poll) unless it is watched already, from elsewhere (a check the hub has moved
        past tells nothing of where it is now)."""
        watched = self._watch(stream, last)
        if watched.cursor == last:
            watched.checked = Checked(owner, state, asyncio.get_running_loop().time() + CHECKED_SECONDS)
            if not watched.subscriptions:
                self._linger(stream, watched)

    def _watch(self, stream: str, cursor: str) -> Watched:
        """The watch of `stream`, made from `cursor` if there is none (and read at once); the notices'
        listener and the reader running."""
        watched = self._watched.get(stream)
        if watched is None:
            partition = self._source.partition(stream)
            watched = self._watched[stream] = Watched.at(stream, partition, cursor)
            self._due.add(stream)
            self._woken.set()
            self._partitions[partition] = self._partitions.get(partition, 0) + 1
            if self._partitions[partition] == 1:
                self._source.want(partition)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name="stream notices")
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="stream reader")
        return watched

    def _unsubscribe(self, subscription: Subscription) -> None:
        watched = self._watched.get(subscription.stream)
        if watched is None:
            return
        watched.subscriptions = tuple(kept for kept in watched.subscriptions if kept is not subscription)
        if watched.subscriptions:
            return
        if watched.checked is not None:
            self._linger(subscription.stream, watched)
        else:
            self._unwatch(subscription.stream)

    def _linger(self, stream: str, watched: Watched) -> None:
        """Keep a long-polled stream watched without followers for `LINGER_SECONDS` from now.

        A stream lingers again at each poll it answers: its timer is not made anew each time, but
        set once and, when it fires before the linger's end, set again for the rest (`_linger_over`),
        so that it fires about once per `LINGER_SECONDS` rather than once per poll."""
        loop = asyncio.get_running_loop()
        watched.lingers_until = loop.time() + LINGER_SECONDS
        if not watched.linger_timer:
            watched.linger_timer = True
            loop.call_at(watched.lingers_until, self._linger_over, stream, watched)

    def _linger_over(self, stream: str, watched: Watched) -> None:
        """Drop a stream watched only to linger, once its last linger is over."""
        watched.linger_timer = False
        if self._watched.get(stream) is not watched or watched.subscriptions:
            return  # followed again: its last follower's leaving lingers it anew
        loop = asyncio.get_running_loop()
        if loop.time() >= watched.lingers_until:
            self._unwatch(stream)
        else:
            watched.linger_timer = True
            loop.call_at(watched.lingers_until, self._linger_over, stream, watched)

    def _unwatch(self, stream: str) -> None:
        partition = self._watched.pop(stream).partition
        self._due.discard(stream)
        self._partitions[partition] -= 1
        if not self._partitions[partition]:
            del self._partitions[partition]
            self._source.unwant(partition)
        if not self._watched:  # nothing to hear of: the notices stop, and the reader ends
            if self._listener is not None:
                self._listener.cancel()
                self._listener = None  # a stream followed next gets a listener of its own at once
            self._heard.clear()
            self._woken.set()

    def _forget(self) -> None:
        """Forget what the checks found of every watched stream: notices may have been missed. (What a
        check finds while the listener is not yet subscribed stands: the sweep that follows its
        subscription reads what came since, the state moved on by it as by any read.)"""
        for watched in self._watched.values():
            watched.checked = None

    def _notice(self, notice: str) -> None:
        """What a script appended, a line per entry: of the streams watched here, each entry that
        comes right after its stream's cursor goes to the followers now; the other streams are read
        next, except where the entry was handed out already. A line of a stream not watched here
        (another gateway's client's, of a partition heard here) costs one partition and one lookup."""
        watched = self._watched
        now = asyncio.get_running_loop().time()
        written_at = ""
        for line in notice.split(LINE):
            stream, _, fields = line.partition(UNIT)
            target = watched.get(stream)
            if target is None:
                continue
            parts = fields.split(UNIT, 3)
            if len(parts) == 4:  # else the stream's name alone (or a line of no known form): read it
                entry_id, kind, at, data = parts
                if entry_id == target.next_id:
                    if self._hand_out(target, entry_id, kind, at, data, now):
                        written_at = at
                    continue
                if target.holds(entry_id):
                    continue
            self._due.add(stream)
            self._woken.set()
        if written_at and self._on_written is not None:
            self._on_written(written_at)

    def _hand_out(self, watched: Watched, entry_id: str, kind: str, at: str, data: str, now: float) -> bool:
        """Hand a notice's entry, the next of its stream, to its followers: written to the clients of
        those parked with nothing pending, straight from its fields; an `Entry` for the others' tasks.
        Whether any client had it written."""
        watched.step()
        if watched.checked is not None:
            watched.checked = watched.checked.moved_by(kind, data)
        written = False
        waiting: list[Subscription] = []
        for subscription in watched.subscriptions:
            if subscription.write_live(entry_id, kind, data, now):
                written = True
            else:
                waiting.append(subscription)
        if waiting:
            self._offer(waiting, [Entry(entry_id, kind, data, at)])
        return written

    def _sweep(self) -> None:
        """Read every watched stream next (a notice may have been missed)."""
        self._due.update(self._watched)
        self._woken.set()

    async def _listen(self) -> None:
        """Take the notices while anyone subscribes; after a lost connection, subscribe again and
        sweep, since notices sent meanwhile are gone."""
        retry_in = RETRY_FIRST_SECONDS

        def heard(partition: int, subscribed: bool) -> None:
            nonlocal retry_in
            if not subscribed:
                self._heard.discard(partition)
                return
            retry_in = RETRY_FIRST_SECONDS
            self._heard.add(partition)
            self._due.update(name for name, each in self._watched.items() if each.partition == partition)
            self._woken.set()

        while self._watched:
            try:
                await self._source.listen(self._notice, heard, SWEEP_SECONDS)
            except Exception as exc:  # every follower waits on this task: it must not end with a fault
                if not isinstance(exc, RedisError | OSError):
                    log.exception("stream notices: an unforeseen failure; listening again")
                elif retry_in == RETRY_FIRST_SECONDS:
                    log.warning("stream notices: Redis failed (%s); listening again", exc)
                self._heard.clear()
                self._forget()
                await asyncio.sleep(retry_in)
                retry_in = min(2 * retry_in, RETRY_LAST_SECONDS)

    async def _run(self) -> None:
        """Read the due streams while anyone subscribes; on a Redis failure, retry with backoff from
        the same cursors."""
        retry_in = RETRY_FIRST_SECONDS
        while self._watched:
            if not self._due:
                self._woken.clear()
                try:
                    await asyncio.wait_for(self._woken.wait(), SWEEP_SECONDS)
                except TimeoutError:
                    self._sweep()
                continue
            due, self._due = [self._watched[name] for name in self._due if name in self._watched], set()
            try:
                reply = await self._source.read(due, HUB_READ_COUNT)
            except Exception as exc:  # every follower waits on this task: it must not end with a fault
                if not isinstance(exc, RedisError | OSError):
                    log.exception("stream reader: an unforeseen failure; reading again")
                self._due.update(self._watched)
                self._forget()
                await self._source.drop()
                if retry_in == RETRY_FIRST_SECONDS:
                    log.warning("stream reader: Redis failed (%s); retrying", exc)
                await asyncio.sleep(retry_in)
                retry_in = min(2 * retry_in, RETRY_LAST_SECONDS)
                continue
            if retry_in != RETRY_FIRST_SECONDS:
                log.warning("stream reader: Redis answers again; following %d streams", len(self._watched))
                retry_in = RETRY_FIRST_SECONDS
            for stream, entries in reply:
                self._take_read(stream, entries)

    def _take_read(self, stream: str, entries: list[Any]) -> None:
        """Hand out what a read brought of `stream` (raw: id, fields), but what is out already."""
        if len(entries) == HUB_READ_COUNT:
            self._due.add(stream)  # there may be more
        watched = self._watched.get(stream)
        if watched is None:
            # Every follower of it left while the read was in flight. A follower that came
            # since has a watch of its own, from its own cursor, which this read did not use.
            return
        if watched.holds(entries[0][0]):  # notices handed them out while the read was in flight
            entries = [entry for entry in entries if not watched.holds(entry[0])]
            if not entries:
                return
        self._deliver(watched, [_entry(entry_id, fields) for entry_id, fields in entries])

    def _deliver(self, watched: Watched, entries: list[Entry]) -> None:
        """Hand entries that follow the stream's cursor to its followers' tasks, and move the cursor on."""
        watched.advance(entries[-1].id)
        for entry in entries:
            if watched.checked is None:
                break
            watched.checked = watched.checked.moved_by(entry.type, entry.data)
        self._offer(watched.subscriptions, entries)

    def _offer(self, subscriptions: Collection[Subscription], entries: list[Entry]) -> None:
        """Entries pending for these followers' tasks; one that overflows is dropped (it catches up),
        and what the hub knew of its stream's job with it."""
        size = -1  # measured for the first follower found behind, if any
        for subscription in subscriptions:
            if subscription.pending and size < 0:
                size = entries_bytes(entries)
            if not subscription.offer(entries, size):
                watched = self._watched.get(subscription.stream)
                if watched is not None:
                    watched.checked = None
                self._unsubscribe(subscription)
