"""A request on a raw socket, held open as long as a test needs: an SSE client that reads nothing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def raw_request(
    port: int, target: str, headers: dict[str, str], wait: float = 60
) -> AsyncIterator[asyncio.Task[bytes]]:
    """A request on a socket of its own, held open while the context lasts; gives the reading of
    the answer's head (a long-poll answers only once it has waited), which must come within `wait` s."""
    sock = socket.create_connection(("127.0.0.1", port))
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\n{lines}\r\n".encode())
    sock.settimeout(wait)

    def read_head() -> bytes:
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        return head

    head = asyncio.create_task(asyncio.to_thread(read_head))
    try:
        yield head
    finally:
        sock.close()
        await asyncio.gather(head, return_exceptions=True)
