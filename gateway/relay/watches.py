"""What the stream hub keeps of a stream it watches: where its next read starts, its followers, and
for a long-polled stream what the relay's last check in Redis found of its job (`Checked`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.relay.cursors import id_after, id_key
from gateway.relay.entries import state_of
from gateway.relay.notices import bulk
from gateway.relay.subscription import Subscription
from shared.events import JobState


@dataclass(eq=False)
class Checked:
    """What the relay's last check in Redis found of a watched stream's job as of the hub's cursor:
    who owns it and its state, the state moved on by each status and terminal entry the hub has
    handed out since; good until `until` (by the loop's clock, `CHECKED_SECONDS` after the check)."""

    owner: str
    state: JobState
    until: float

    def moved_by(self, kind: str, data: str) -> Checked | None:
        """This, its state moved by an entry; None for an entry whose state cannot be read (the hub's
        callback serves every follower: such an entry is left to a check in Redis, not raised)."""
        try:
            state = state_of(kind, data)
        except (ValueError, KeyError, TypeError):
            return None
        if state is not None:
            self.state = state
        return self


@dataclass(eq=False)
class Watched:
    """A stream the reader watches: its followers, the cursor the next read starts after, and for a
    long-polled stream what a check found of its job and how long it is watched without followers."""

    stream: str
    name: bytes  # packed (`notices.bulk`)
    partition: int  # whose notices tell of it (`NoticeSource.partition`)
    cursor: str
    next_id: str | None  # the id of the entry after the cursor, if a notice line may be taken as it
    subscriptions: tuple[Subscription, ...] = ()  # a tuple: handing out may drop one, mid-loop
    checked: Checked | None = None
    lingers_until: float = 0.0  # by the loop's clock: kept, without followers, until then
    linger_timer: bool = (
        False  # a timer of `StreamHub._linger`'s is set, to fire at or before `lingers_until`
    )

    @classmethod
    def at(cls, stream: str, partition: int, cursor: str) -> Watched:
        return cls(stream, bulk(stream), partition, cursor, id_after(cursor))

    def advance(self, cursor: str) -> None:
        self.cursor, self.next_id = cursor, id_after(cursor)

    def step(self) -> None:
        """Move the cursor onto `next_id` ('<seq>-1'), a notice's entry handed out."""
        assert self.next_id is not None
        self.cursor, self.next_id = self.next_id, f"{int(self.next_id[:-2]) + 1}-1"

    def holds(self, entry_id: str) -> bool:
        """Whether the entry was handed out already: its id is not past the cursor."""
        return id_key(entry_id) <= id_key(self.cursor)
