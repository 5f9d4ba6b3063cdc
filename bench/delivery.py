"""Exactly-once and in order, checked: what a client received of a job against what its stream holds,
and how late each event came (pure, no I/O).

A client records the seq of every delta it receives, in the order received, and when its bytes
arrived (time.time()); the stream holds each delta's seq and `at`, when its worker sent the step that
carried it (whole ms by the worker's clock, cut down: the send was within the ms after `at`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

AT_RESOLUTION_SECONDS = 0.001
"""`at` is whole ms, cut down: a send is taken at the middle of its ms, so a lag is off by at most half."""
_DELTA_SEQ = re.compile(r'\{"type":"delta","seq":(\d+)')


@dataclass(frozen=True)
class Delivery:
    """One job's deltas (or a level's, summed): sent, received once, and what went wrong.

    `duplicated`: receipts of a seq received before; `reordered`: first receipts of a seq after a later
    one; `unexpected`: seqs received that the stream does not hold."""

    sent: int = 0
    delivered: int = 0
    duplicated: int = 0
    reordered: int = 0
    unexpected: int = 0

    @property
    def lost(self) -> int:
        return self.sent - self.delivered

    @property
    def exact(self) -> bool:
        """All delivered, once each, in order, and nothing else."""
        return self.lost == 0 and self.duplicated == 0 and self.reordered == 0 and self.unexpected == 0

    def __add__(self, other: Delivery) -> Delivery:
        return Delivery(
            self.sent + other.sent,
            self.delivered + other.delivered,
            self.duplicated + other.duplicated,
            self.reordered + other.reordered,
            self.unexpected + other.unexpected,
        )


def account(sent: Collection[int], received: Iterable[int]) -> Delivery:
    """The delivery of the deltas `sent` (their seqs) as a client `received` them, in its order."""
    expected = set(sent)
    seen: set[int] = set()
    highest = -1
    duplicated = reordered = unexpected = 0
    for seq in received:
        if seq in seen:
            duplicated += 1
            continue
        seen.add(seq)
        if seq not in expected:
            unexpected += 1
        if seq < highest:
            reordered += 1
        highest = max(highest, seq)
    return Delivery(len(expected), len(seen & expected), duplicated, reordered, unexpected)


def lags(
    seqs: Sequence[int], arrivals: Sequence[float], sent_at_ms: Mapping[int, int], since: float, until: float
) -> list[float]:
    """Seconds from each delta's sending to its first receipt, for the deltas sent in [since, until)
    (epoch seconds): those of a measuring window, none of a catch-up after connecting."""
    found: list[float] = []
    seen: set[int] = set()
    for seq, arrived in zip(seqs, arrivals, strict=True):
        at = sent_at_ms.get(seq)
        if at is None or seq in seen:
            continue
        seen.add(seq)
        sent = (at + 0.5) * AT_RESOLUTION_SECONDS
        if since <= sent < until:
            found.append(arrived - sent)
    return found


def delta_seq(data: str) -> int:
    """A delta's seq, read from its JSON as the event models write it (type, then seq), without
    decoding the rest: a client process parses thousands a second beside the gateway it measures."""
    matched = _DELTA_SEQ.match(data)
    if matched is None:
        raise ValueError(f"not a delta event: {data[:80]!r}")
    return int(matched.group(1))
