"""The bench's lean HTTP clients on raw asyncio sockets, cheaper than httpx, so that the load generator
adds as little as it can to what it measures, and the Server-Sent Events parsing every client shares."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """(event type, data) per frame; comments (pings) and ids are skipped."""
    event, data = "message", list[str]()
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


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


class EventsConnection:
    """One job's SSE over HTTP/1.0 (no chunked framing to undo), a connection of its own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, job_id: str) -> EventsConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"GET /v1/jobs/{job_id}/events HTTP/1.0\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n"
        writer.write(head.encode())
        await _head(reader, f"events of job {job_id}")
        return cls(reader, writer)

    def events(self) -> AsyncIterator[tuple[str, str]]:
        return sse_events(_lines(self.reader))

    def close(self) -> None:
        self.writer.close()


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
