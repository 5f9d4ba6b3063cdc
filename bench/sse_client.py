"""Server-Sent Events line parsing for the bench's clients (httpx in the engine phases, raw sockets in
the relay phase), so both read frames the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """(event type, data) per frame; comments (pings) and ids are skipped."""
    event, data = "message", []
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
