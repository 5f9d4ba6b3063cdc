"""The bench's lean HTTP clients on raw asyncio sockets, cheaper than httpx, so that the load generator
adds as little as it can to what it measures, and the Server-Sent Events parsing every client shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import cast


def parse_frame(lines: Iterable[str]) -> tuple[str, str] | None:
    """(event type, data) of one frame's lines; None for a frame without data (a ping, a comment)."""
    event, data = "message", list[str]()
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    return (event, "\n".join(data)) if data else None


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """(event type, data) per frame of a body read a line at a time; pings and ids are skipped."""
    frame: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if line:
            frame.append(line)
            continue
        parsed, frame = parse_frame(frame), []
        if parsed is not None:
            yield parsed


async def _lines(reader: asyncio.StreamReader) -> AsyncIterator[str]:
    while line := await reader.readline():
        yield line.decode()


async def _head(reader: asyncio.StreamReader, what: str) -> dict[str, str]:
    """The status line (which must be 2xx) and the headers of an answer."""
    status = await reader.readline()
    if status[9:10] != b"2":
        raise RuntimeError(f"{what}: {status!r}")
    headers = {}
    while line := (await reader.readline()).strip():
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    return headers


class EventsConnection(asyncio.Protocol):
    """One job's SSE over HTTP/1.0 (no chunked framing to undo) on a connection of its own, parsed as
    its bytes arrive rather than a line at a time through a StreamReader: a third of the CPU, so that a
    thousand of them leave the cores to the gateway and Redis they measure. Frames end with a blank
    line written as the gateway writes it ("\r\n\r\n"); the gateway closes the connection after the
    terminal event (HTTP/1.0), which resolves `closed`."""

    def __init__(self, request: bytes, on_event: Callable[[str, str, float], None]) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.on_event = on_event  # (event type, data, time.time() when its bytes arrived)
        self.answered: asyncio.Future[None] = loop.create_future()  # a 2xx status line and headers came
        self.closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.pending = b""

    @classmethod
    async def open(
        cls,
        port: int,
        job_id: str,
        on_event: Callable[[str, str, float], None],
        last_event_id: str | None = None,
    ) -> EventsConnection:
        """Follow the job from its stream's start, or from after `last_event_id` as a client resuming."""
        resume = f"Last-Event-ID: {last_event_id}\r\n" if last_event_id is not None else ""
        request = (
            f"GET /v1/jobs/{job_id}/events HTTP/1.0\r\nHost: bench\r\nAccept: text/event-stream\r\n"
            f"{resume}\r\n"
        )
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: cls(request.encode(), on_event), "127.0.0.1", port
        )
        await connection.answered
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        arrived = time.time()
        self.pending += data
        if not self.answered.done():
            head, blank, self.pending = self.pending.partition(b"\r\n\r\n")
            if not blank:
                self.pending = head
                return
            if head[9:10] != b"2":
                self.answered.set_exception(RuntimeError(f"events: {head.splitlines()[0]!r}"))
                self.close()
                return
            self.answered.set_result(None)
        *frames, self.pending = self.pending.split(b"\r\n\r\n")
        for frame in frames:
            parsed = parse_frame(frame.decode().split("\r\n"))
            if parsed is not None:
                self.on_event(*parsed, arrived)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(exc or ConnectionError("closed before answering"))
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Poller:
    """Long-poll pages of one job's events (`GET /v1/jobs/{id}/events?after=&wait=`), one at a time over
    one kept-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def page(self, job_id: str, after: str | None, wait: float, limit: int) -> tuple[bytes, float]:
        """The page's JSON after the cursor `after` (None: from the start), and when it came (time.time())."""
        if self._connection is None:
            self._connection = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._connection
        query = f"wait={wait:g}&limit={limit}" + (f"&after={after}" if after is not None else "")
        writer.write(f"GET /v1/jobs/{job_id}/events?{query} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        headers = await _head(reader, "long-poll")
        body = await reader.readexactly(int(headers["content-length"]))
        return body, time.time()

    def close(self) -> None:
        if self._connection is not None:
            self._connection[1].close()


class Submitter:
    """`POST /v1/jobs` asking for the job's events, over one kept-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def submit_and_follow(self, body: bytes) -> tuple[str, AsyncIterator[tuple[str, str]]]:
        """Submit asking for the job's events: its id, and its events to the end of the answer (read them
        all before the next submission: they share the connection)."""
        if self._connection is None:
            self._connection = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._connection
        head = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        headers = await _head(reader, "submit")
        return headers["x-streampool-job-id"], sse_events(_chunked_lines(reader))

    def close(self) -> None:
        if self._connection is not None:
            self._connection[1].close()


async def _chunked_lines(reader: asyncio.StreamReader) -> AsyncIterator[str]:
    """The lines of a chunked HTTP/1.1 body, up to its last chunk."""
    pending = b""
    while size := int((await reader.readline()).strip(), 16):
        pending += (await reader.readexactly(size + 2))[:-2]
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode() + "\n"
    await reader.readline()  # the empty line after the last chunk
