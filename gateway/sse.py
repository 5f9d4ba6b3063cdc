"""Server-Sent Events framing of a job stream (sse-starlette does the wire format)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.entries import Entry
from gateway.metrics import GatewayMetrics
from shared.errors import StreampoolError


async def _frames(entries: AsyncIterator[Entry], metrics: GatewayMetrics) -> AsyncIterator[ServerSentEvent]:
    metrics.streams_open.inc()
    try:
        async for entry in entries:
            yield ServerSentEvent(data=entry.data, id=entry.id, event=entry.type)
    except StreampoolError as exc:
        # The response has started: the failure becomes a last event, never a silent close.
        # It has no id, so a client that reconnects resumes where it really was.
        body = {"type": "error", "message": exc.message, "code": exc.error_type}
        yield ServerSentEvent(data=json.dumps(body), event="error")
    finally:
        metrics.streams_open.dec()


def event_stream(
    entries: AsyncIterator[Entry], metrics: GatewayMetrics, ping_seconds: float
) -> EventSourceResponse:
    return EventSourceResponse(_frames(entries, metrics), ping=ping_seconds)
