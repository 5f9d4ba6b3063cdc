"""Long-polls of a job's events: one page as `EventsPage`'s JSON, and a plain poll's values read
straight from the request (`gateway.plain_polls` answers those before the application's stack).

The events route (`gateway.routes.jobs`) and the plain-poll middleware both answer a page here: the
route with the values FastAPI resolved, the middleware with those `plain_poll` read.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from starlette.responses import Response
from starlette.types import Scope

from gateway.relay.entries import Entry
from gateway.relay.open_streams import StreamLimits
from gateway.relay.relay import Relay
from shared.config import GatewaySettings
from shared.events import JobState

CURSOR_MAX_LENGTH = 41  # of `after` and `Last-Event-ID`
WAIT_MOST = 3600  # s, of a long-poll's `wait`, before `poll_wait_max` bounds it further
LIMIT_MOST = 1000  # events of a long-poll page
LIMIT_DEFAULT = 100
JSON = "application/json"

PLAIN_VALUES = {
    b"after": re.compile(rb"[0-9-]{0,%d}" % CURSOR_MAX_LENGTH),
    b"wait": re.compile(rb"(0|[1-9][0-9]{0,3})(\.[0-9]{1,6})?"),
    b"limit": re.compile(rb"[1-9][0-9]{0,3}"),
}
"""The values of a long-poll's query that `plain_poll` reads itself: plain digits, as clients send
them; FastAPI reads every other form."""
NOT_PLAIN_HEADERS = frozenset({b"content-length", b"transfer-encoding"})
"""A request that declares a body is not a plain poll: the body limit (`gateway.body_limit`) sees it."""


async def page_response(
    relay: Relay, settings: GatewaySettings, job_id: str, cursor: str, wait: float, limit: int, owner: str
) -> Response:
    """One long-poll page, as an `EventsPage`'s JSON."""
    wait = min(wait, settings.poll_wait_max)
    limits = StreamLimits.of(settings)
    entries, state, done = await relay.page(job_id, cursor, limit, wait, owner, limits)
    return Response(page_json(entries, entries[-1].id if entries else cursor, state, done), media_type=JSON)


def page_json(entries: list[Entry], cursor: str, state: JobState, done: bool) -> str:
    """An `EventsPage` as JSON, written from the entries' own JSON (`Entry.as_json`): a page goes out
    once per batch of events, and decoding its events to validate and encode them again cost the
    gateway more than the rest of the page."""
    events = ",".join(entry.as_json() for entry in entries)
    done_json = "true" if done else "false"
    return (
        f'{{"events":[{events}],"cursor":{json.dumps(cursor)},"status":"{state.value}","done":{done_json}}}'
    )


class Poll(NamedTuple):
    """A plain long-poll's values, as the events route would be given them."""

    after: str | None
    wait: float
    limit: int
    last_event_id: str | None


def plain_poll(scope: Scope) -> Poll | None:
    """A long-poll's `after`, `wait`, `limit` and `Last-Event-ID`, where the query has no other
    parameter and each is absent or plain (`PLAIN_VALUES`) and within the bounds the events route
    declares, read as Starlette and FastAPI read them (the last of a repeated parameter, the first of
    a repeated header); None for a request that is anything else: an event stream's, one with a body,
    or one whose values FastAPI is to refuse, or to read otherwise."""
    values: dict[bytes, bytes] = {}
    query: bytes = scope["query_string"]
    for pair in query.split(b"&") if query else ():
        name, _, value = pair.partition(b"=")
        plain = PLAIN_VALUES.get(name)
        if plain is None or not plain.fullmatch(value):
            return None
        values[name] = value
    accept = last_event_id = None
    for name, value in scope["headers"]:
        if name == b"accept" and accept is None:
            accept = value
        elif name == b"last-event-id" and last_event_id is None:
            last_event_id = value.decode("latin-1")
        elif name in NOT_PLAIN_HEADERS:
            return None
    if (accept is not None and b"text/event-stream" in accept) or len(
        last_event_id or ""
    ) > CURSOR_MAX_LENGTH:
        return None
    wait, limit = float(values.get(b"wait", 0)), int(values.get(b"limit", LIMIT_DEFAULT))
    if wait > WAIT_MOST or limit > LIMIT_MOST:
        return None
    after = values.get(b"after")
    return Poll(None if after is None else after.decode(), wait, limit, last_event_id)
