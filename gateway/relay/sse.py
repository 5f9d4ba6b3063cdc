"""Server-Sent Events of a job stream: the wire format, and the response that writes it.

The OpenAI- and TGI-compatible routes stream with sse-starlette's `EventSourceResponse`.
The native events route, the one that carries the relay's load, writes its frames
straight to the ASGI server with `EventStream` instead: measured at 10,000 events/s on
one gateway process, most of the CPU per event went to EventSourceResponse's machinery
(a task group per stream, a cancel scope and a lock per send, one send per event), which
made relay lag grow far past its target. `EventStream` keeps what sse-starlette gives a
client - the same frames (`frame` is checked against sse-starlette's encoder in the
tests), the same headers, a keep-alive comment after each `ping_seconds` of silence, the
stream ended as soon as the client disconnects - and sends every entry that arrived
together in one write; live entries are written from the stream hub's callback as it hears
them, while the client's socket takes them (`server_send.body_writer`), without waking the
stream's task. Shutting the gateway down ends every stream (the relay's `OpenStreams`), so that
clients reconnect elsewhere with `Last-Event-ID` instead of holding the shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import datetime, timezone

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.metrics import GatewayMetrics
from gateway.relay.entries import Entry
from gateway.relay.following import Following
from gateway.relay.open_streams import Hold
from gateway.relay.server_send import body_writer, server_send
from gateway.relay.streamed_answer import streamed_answer
from shared.errors import StreampoolError

SEPARATOR = "\r\n"  # sse-starlette's default line separator
LINE_BREAK = re.compile(r"\r\n|\r|\n")
HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}
END = {"type": "http.response.body", "body": b"", "more_body": False}

log = logging.getLogger(__name__)


def _has_line_break(text: str) -> bool:
    return "\n" in text or "\r" in text  # far cheaper than a regular expression on every event


def frame(data: str, event: str | None = None, id: str | None = None) -> bytes:
    """One event as sse-starlette's `ServerSentEvent(data, event=..., id=...).encode()` writes it."""
    if _has_line_break(data):
        data = f"{SEPARATOR}data: ".join(LINE_BREAK.split(data))
    head = ""
    if id is not None:
        head = f"id: {LINE_BREAK.sub('', id) if _has_line_break(id) else id}{SEPARATOR}"
    if event is not None:
        head += f"event: {LINE_BREAK.sub('', event) if _has_line_break(event) else event}{SEPARATOR}"
    return f"{head}data: {data}{SEPARATOR}{SEPARATOR}".encode()


def entry_frame(entry: Entry) -> bytes:
    """A stream entry as one event whose `id:` is its stream id (the client's cursor)."""
    return event_frame(entry.id, entry.type, entry.data)


def event_frame(entry_id: str, event: str, data: str) -> bytes:
    """An entry's event from its fields: `frame`'s bytes, made in one step when nothing needs
    breaking or cleaning, as for every event a worker writes (its data is one line of JSON, and a
    stream id has no line break)."""
    if "\n" in data or "\r" in data or "\n" in event or "\r" in event:
        return frame(data, event, entry_id)
    return f"id: {entry_id}{SEPARATOR}event: {event}{SEPARATOR}data: {data}{SEPARATOR}{SEPARATOR}".encode()


def ping_frame() -> bytes:
    """A keep-alive comment, as sse-starlette's pings."""
    return f": ping - {datetime.now(timezone.utc)}{SEPARATOR}{SEPARATOR}".encode()


def error_frame(exc: StreampoolError) -> bytes:
    """A failure after the stream started, as its last event: never a silent close. It has no
    id, so a client that reconnects resumes where it really was."""
    body = {"type": "error", "message": exc.message, "code": exc.error_type}
    return frame(json.dumps(body), "error")


class EventStream(Response):
    """SSE of one job stream from a cursor to its terminal event (see the module's docstring)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        following: Following,
        hold: Hold,
        metrics: GatewayMetrics,
        ping_seconds: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.following = following
        self.hold = hold
        self.metrics = metrics
        self.ping_seconds = ping_seconds
        self.status_code = 200
        self.background = None
        self.init_headers(HEADERS | (headers or {}))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Open from the first byte: the follow's place among the open streams is given back
        # however the response ends, a client gone before its head included.
        with self.hold, self.following.relay.open_streams.open(self.following):
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            send = server_send(scope, send)
            if scope["method"] == "HEAD":
                await send(END)
                return
            write_body = body_writer(send)
            if write_body is not None:
                # Live entries, written from the hub's callback while `_write` waits; the hub observes
                # their relay lag, once per notice (`StreamHub`'s `on_written`).
                self.following.write_now = lambda entry_id, kind, data: write_body(
                    event_frame(entry_id, kind, data)
                )
            listening = asyncio.create_task(self._stop_on_disconnect(receive))
            # The writes run in a task of their own: woken once per batch, a task resumes every frame
            # it is suspended in, and here that would be the dozen of the ASGI stack above this one.
            writing = asyncio.create_task(self._write(send))
            try:
                await writing
            finally:
                writing.cancel()
                listening.cancel()
        await send(END)

    async def _write(self, send: Send) -> None:
        bodies = streamed_answer(self._bodies(), self._failed, self.metrics)
        async with aclosing(bodies):
            async for body in bodies:
                await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _bodies(self) -> AsyncGenerator[bytes, None]:
        """Every entry that arrived together as one body, a keep-alive after each silence."""
        async with aclosing(self.following.batches(self.ping_seconds)) as batches:
            async for batch in batches:
                yield b"".join(map(entry_frame, batch)) if batch else ping_frame()
                if batch and batch[0].at:  # once per write, for its oldest entry: cheap at the relay's rate
                    self.metrics.observe_relay_lag(batch[0].at)

    def _failed(self, exc: StreampoolError) -> list[bytes]:
        """The client resumes from its cursor; an operator may want to know."""
        log.warning("a follow of job %s ended early: %s", self.following.job_id, exc.message)
        return [error_frame(exc)]

    async def _stop_on_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.following.stop()
