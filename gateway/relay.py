"""Reading job streams from a client's cursor: follow until the terminal event, or one page."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared.errors import CursorExpired, InvalidRequest, JobNotFound
from shared.events import TERMINAL_EVENT_TYPES, JobState
from shared.keys import Keys
from shared.redis_client import redis_errors

CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
MAX_ID_PART = 2**64 - 1
START = "0-0"
READ_BATCH = 512
FOLLOW_BLOCK_MS = 5000
TERMINAL_STATES = {"done": JobState.completed, "cancelled": JobState.cancelled, "error": JobState.failed}


@dataclass(frozen=True)
class Entry:
    """One stream entry as stored: its stream id (the cursor), event type and event JSON."""

    id: str
    type: str
    data: str

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **json.loads(self.data)}

    @property
    def state(self) -> JobState | None:
        """The job state this entry moves the job into, if it is a status or terminal event."""
        if self.type == "status":
            return JobState(json.loads(self.data)["state"])
        return TERMINAL_STATES.get(self.type)


def _id_tuple(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _oldest_readable(info: dict[str, Any]) -> tuple[int, int]:
    """The smallest cursor that loses nothing: entries trimmed off the head sit below the first one kept.

    A cursor exactly at the last trimmed entry is refused too: the stream no longer says which that was.
    """
    if int(info["entries-added"]) <= int(info["length"]) or not info.get("first-entry"):
        return (0, 0)
    return _id_tuple(info["first-entry"][0])


def parse_cursor(cursor: str | None) -> str:
    """A client's cursor (a stream id; none means the start), checked before it reaches Redis."""
    if cursor is None or cursor == "":
        return START
    if not CURSOR.fullmatch(cursor) or max(_id_tuple(cursor)) > MAX_ID_PART:
        raise InvalidRequest(f"cursor {cursor!r} is not a stream id like '1700000000000-0'")
    return cursor


class Relay:
    """Reads one job's stream for one client."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def check(self, job_id: str, cursor: str) -> JobState:
        """The job's state; 404 for an unknown job, 410 for a cursor older than what is kept."""
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hget(self.keys.job(job_id), "status")
                pipe.xinfo_stream(self.keys.stream(job_id))
                status, info = await pipe.execute(raise_on_error=False)
        if status is None or isinstance(info, Exception):
            raise JobNotFound(f"no job {job_id}")
        if _id_tuple(cursor) < _oldest_readable(info):
            raise CursorExpired(
                f"events after {cursor} are no longer all kept; the oldest kept is {info['first-entry'][0]}",
                oldest=info["first-entry"][0],
            )
        return JobState(status)

    async def _read(self, job_id: str, cursor: str, count: int, block_ms: int | None) -> list[Entry]:
        with redis_errors():
            reply = await self.redis.xread({self.keys.stream(job_id): cursor}, count=count, block=block_ms)
        if not reply:
            return []
        return [Entry(entry_id, fields["type"], fields["data"]) for entry_id, fields in reply[0][1]]

    async def page(
        self, job_id: str, cursor: str, limit: int, wait: float
    ) -> tuple[list[Entry], JobState, bool]:
        """Up to `limit` entries after `cursor` (waiting up to `wait` s for one), the state, and done.

        The state is read before the entries: a job already ended has its terminal event
        in the stream, so an empty read past it means the client has seen everything.
        """
        state = await self.check(job_id, cursor)
        block = int(wait * 1000) if wait > 0 and not state.terminal else None
        entries = await self._read(job_id, cursor, limit, block)
        done = any(entry.terminal for entry in entries) or (state.terminal and not entries)
        for entry in entries:
            state = entry.state or state
        return entries, state, done

    async def _status(self, job_id: str) -> JobState:
        with redis_errors():
            status = await self.redis.hget(self.keys.job(job_id), "status")  # type: ignore[misc]
        if status is None:
            raise JobNotFound(f"no job {job_id}")
        return JobState(status)

    async def follow(self, job_id: str, cursor: str) -> AsyncIterator[Entry]:
        """Every entry after `cursor`, as it is appended, up to and including the terminal event.

        A cursor already at or past the terminal event ends the stream at once. The first read
        does not wait, so a finished job answers without delay.
        """
        block: int | None = None
        while True:
            entries = await self._read(job_id, cursor, READ_BATCH, block)
            block = FOLLOW_BLOCK_MS
            if not entries:
                # An ended job has its terminal event in the stream already (the same script
                # wrote both), so an empty read after seeing the state means nothing is left.
                if (await self._status(job_id)).terminal and not await self._read(job_id, cursor, 1, None):
                    return
                continue
            for entry in entries:
                yield entry
                if entry.terminal:
                    return
            cursor = entries[-1].id
