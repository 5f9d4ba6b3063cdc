"""The places a gateway process holds for the requests that keep a connection open on a job, so that
none holds more than its share, and the native follows, so that a stopping gateway ends them all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from shared.config import GatewaySettings
from shared.errors import Overloaded
from shared.keys import ANONYMOUS_OWNER


class Stoppable(Protocol):
    """A follow that a stopping gateway ends at once (`gateway.relay.following.Following`)."""

    def stop(self) -> None: ...


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
        self._followings: set[Stoppable] = set()
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
    def open(self, following: Stoppable) -> Iterator[None]:
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
