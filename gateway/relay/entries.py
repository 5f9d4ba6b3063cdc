"""A job stream entry as the gateway relays it."""

from __future__ import annotations

import json
from operator import itemgetter
from typing import NamedTuple

from shared.events import TERMINAL_EVENT_TYPES, JobState

TERMINAL_STATES = {"done": JobState.completed, "cancelled": JobState.cancelled, "error": JobState.failed}


class Entry(NamedTuple):
    """One stream entry as stored: its stream id (the cursor: `<seq>-1`), event type and event JSON,
    and when Redis wrote it (ms, as text; '' in a stream written before entries kept it).

    A named tuple: the relay makes one per event, and a tuple is the cheapest object to make."""

    id: str
    type: str
    data: str
    at: str = ""

    @classmethod
    def of(cls, entry_id: str, fields: dict[str, str]) -> Entry:
        """An entry as redis-py reads it: its id and its fields by name."""
        return cls(entry_id, fields["type"], fields["data"], fields.get("at", ""))

    @classmethod
    def of_pairs(cls, entry_id: str, fields: list[str]) -> Entry:
        """An entry as a script reads it: its id and its fields as a flat list of names and values."""
        named = iter(fields)
        return cls.of(entry_id, dict(zip(named, named, strict=False)))

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES

    def as_json(self) -> str:
        """The event's JSON object with its stream id put first, as a long-poll page lists it:
        spliced, not decoded and encoded again (a delta with logprobs is large)."""
        body = self.data.strip()[1:]
        if body.lstrip().startswith("}"):
            return f'{{"id":"{self.id}"}}'
        return f'{{"id":"{self.id}",{body}'

    @property
    def state(self) -> JobState | None:
        """The job state this entry moves the job into, if it is a status or terminal event."""
        return state_of(self.type, self.data)


def state_of(kind: str, data: str) -> JobState | None:
    """The job state an entry of type `kind` and event JSON `data` moves the job into, if it is a
    status or terminal event."""
    if kind == "status":
        return JobState(json.loads(data)["state"])
    return TERMINAL_STATES.get(kind)


_data = itemgetter(2)


def entries_bytes(entries: list[Entry]) -> int:
    """About the bytes the entries hold: their events' JSON, counted without a Python loop."""
    return sum(map(len, map(_data, entries)))
