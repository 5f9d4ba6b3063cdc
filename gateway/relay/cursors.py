"""Stream ids as cursors: a client's checked before it reaches Redis, and ids compared as Redis
orders them."""

from __future__ import annotations

import re

from shared.errors import InvalidRequest

CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
MAX_ID_PART = 2**64 - 1
START = "0-0"


def id_key(stream_id: str) -> tuple[int, int]:
    """A stream id (or a cursor such as '12', short for '12-0') as a key that sorts as Redis does."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def id_after(cursor: str) -> str | None:
    """The id of the entry right after `cursor` in a job stream, whose ids are '<seq>-1' with seqs
    one apart; None when the cursor is not of that kind (the stream is read from it instead)."""
    seq, _, part = cursor.partition("-")
    if not seq.isdigit():
        return None
    if part == "1":
        return f"{int(seq) + 1}-1"
    return f"{seq}-1" if part in ("", "0") else None


def parse_cursor(cursor: str | None) -> str:
    """A client's cursor (a stream id; none means the start), checked before it reaches Redis."""
    if cursor is None or cursor == "":
        return START
    if not CURSOR.fullmatch(cursor) or max(id_key(cursor)) > MAX_ID_PART:
        raise InvalidRequest(f"cursor {cursor!r} is not an event id like '12-1'")
    return cursor
