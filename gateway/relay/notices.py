"""Where a gateway's stream hub (`gateway.relay.hub.StreamHub`) hears of new entries and reads streams:
the seam, `NoticeSource`, chosen once at start, with one implementation a topology: one Redis
(`gateway.relay.server_notices`), or the masters of a Redis Cluster holding the job streams in
partitions (`gateway.relay.cluster_notices`).

Either way a gateway hears of the streams it watches through notices (`shared.notices`), and reads
the streams it must with raw XREADs (`xread`) on connections of its own. When a subscription ends
(a connection dropped, a slot moved) the hub subscribes again and reads every stream it watches, as
after any notice it may have missed.

A source's failure is a `RedisError` or an `OSError`, which the hub meets by starting over.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

READ_TIMEOUT_SECONDS = 10.0  # a read without an answer by then means a dead connection


class Due(Protocol):
    """A stream to read: its name (`stream`, and packed as a RESP bulk string, `name`) and the cursor
    the read starts after."""

    stream: str
    name: bytes
    cursor: str


Hear = Callable[[str], None]
"""What a source hands each notice to."""

Heard = Callable[[int, bool], None]
"""What a source tells of each notice partition whose subscription now holds (True: every notice of
it is heard from now on) or has ended (False)."""

RawEntries = list[list[Any]]
"""A stream's entries as XREAD answers them unparsed: [id, [field, value, ...]] each."""


def bulk(value: str) -> bytes:
    """One argument of a Redis command as the protocol carries it (a RESP bulk string)."""
    data = value.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class NoticeSource(Protocol):
    def partition(self, stream: str) -> int:
        """The notice partition of a job's stream."""

    def want(self, partition: int) -> None:
        """Hear the partition's notices from now on: a stream of it is watched."""

    def unwant(self, partition: int) -> None:
        """Hear the partition's notices no longer: no stream of it is watched."""

    async def listen(self, hear: Hear, heard: Heard, timeout: float) -> None:
        """Hand every notice of the partitions wanted to `hear`, telling `heard` of each partition's
        subscription as it starts and ends, until cancelled or a failure; `timeout`: the longest
        wait for a message."""

    async def read(self, due: Collection[Due], count: int) -> list[tuple[str, RawEntries]]:
        """Up to `count` entries of each due stream after its cursor: (stream, entries) for each
        stream that has any."""

    async def drop(self) -> None:
        """Let go of the reading connections (after a failure: the next read makes them anew)."""

    async def aclose(self) -> None: ...


def xread(streams: Collection[Due], count: int) -> bytes:
    """One XREAD of up to `count` entries of each stream after its cursor, packed for the wire."""
    return b"".join(
        [
            b"*%d\r\n" % (4 + 2 * len(streams)),
            *map(bulk, ("XREAD", "COUNT", str(count), "STREAMS")),
            *[stream.name for stream in streams],
            *[bulk(stream.cursor) for stream in streams],
        ]
    )
