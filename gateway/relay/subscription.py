"""A follower's mailbox at the stream hub (`gateway.relay.hub` tells how followers are fed): the
entries handed to it, its wait for them, and a notice's entry written straight to its client while
it waits with nothing pending."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.relay.entries import Entry

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 1024  # entries held for one follower before it must catch up from Redis itself

LiveWriter = Callable[[str, str, str], bool]
"""Writes one entry (its id, event type and data) to a follower's client now and answers True, or
answers False and writes nothing when the follower's task must take it instead."""


@dataclass(eq=False)
class Subscription:
    """A follower's mailbox: new entries of one stream, or the news that it fell behind."""

    stream: str
    started_after: str
    max_bytes: int  # of entries held while behind, past which the follower catches up by itself
    pending: list[Entry] = field(default_factory=list)
    pending_bytes: int = 0  # of the batches offered while entries were pending already
    lagged: bool = False
    direct: LiveWriter | None = None
    """Hands a notice's entry straight to the follower's client while it waits with nothing pending,
    from the hub's callback, without waking its task (`Following.write_directly`)."""
    _live: LiveWriter | None = None  # `direct` while the task is parked in `wait`, nothing pending
    _waiter: asyncio.Future[None] | None = None
    _timeout: float = 0.0  # of the `wait` in progress
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
        self._timeout = timeout
        self._deadline = loop.time() + timeout
        self._waiter = waiter = loop.create_future()
        self._live = self.direct  # nothing pending, and the task parked: written now, in order
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = self._live = None

    def _on_timer(self) -> None:
        loop = asyncio.get_running_loop()
        if self._waiter is not None and loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._on_timer)
            return
        self._timer = None
        self.interrupt()

    def write_live(self, entry_id: str, kind: str, data: str, now: float) -> bool:
        """Whether `direct` wrote a notice's entry to the client, the task parked with nothing pending
        (`now`: the loop's time, from which the wait's silence is counted again). A `direct` that
        fails is logged and not asked again: the follower's task writes the entry, and meets the
        failure on its own, while the hub goes on listening for every other follower."""
        live = self._live
        if live is None:
            return False
        try:
            written = live(entry_id, kind, data)
        except Exception:
            log.exception("writing an entry of %s to a client failed; its own task takes it", self.stream)
            self.direct = self._live = None
            return False
        if written:
            self._deadline = now + self._timeout
        return written

    def interrupt(self) -> None:
        """End a `wait` in progress now."""
        self._live = None
        if self._waiter is not None:
            _wake(self._waiter)

    def close(self) -> None:
        """Cancel the timer: the follower has left."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def offer(self, entries: list[Entry], size: int) -> bool:
        """Hand new entries over to the follower's task; False (and lagged) when that would overflow
        the buffer.

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
