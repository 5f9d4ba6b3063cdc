"""`body_writer` against the installed uvicorn, served over a real socket as the gateway serves.

The gateway's event streams write live events through it; should an upgrade of uvicorn change
what it relies on, these fail, rather than every stream quietly going back to the slower path.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from gateway.relay.server_send import KeepServerSend, body_writer, server_send
from tests.helpers import eventually
from tests.processes import free_port

CHUNK = b"x" * 65536
MOST_BUFFERED = 16 * 2**20  # far past any socket buffer and uvicorn's high-water mark (64 KiB)

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
Serve = Callable[[Handler], Awaitable[int]]
BODY = "http.response.body"


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serves a handler as the gateway serves its app (uvicorn's httptools protocol, the app wrapped in
    `KeepServerSend`); answers the port."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(handler: Handler) -> int:
        port = free_port()
        config = uvicorn.Config(
            KeepServerSend(handler), port=port, http="httptools", log_config=None, lifespan="off"
        )
        server = uvicorn.Server(config)
        servers.append((server, asyncio.create_task(server.serve())))
        await eventually(lambda: asyncio.sleep(0, server.started), "the server is up", interval=0.01)
        return port

    yield start
    for server, serving in servers:
        server.should_exit = server.force_exit = True  # a failed test may leave its client open
        await serving


async def _start(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})


async def test_chunks_written_now_and_sent_after_them_arrive_whole_and_in_order(serve: Serve) -> None:
    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        await _start(send)
        write = body_writer(server_send(scope, send))
        assert write is not None, "no body writer for uvicorn's httptools protocol"
        assert write(b"one,") and write(b"two,")
        await server_send(scope, send)({"type": BODY, "body": b"three", "more_body": False})
        assert not write(b"after the end")

    port = await serve(handler)
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{port}/")
    assert answer.status_code == 200
    assert answer.content == b"one,two,three"


async def test_a_client_that_does_not_read_is_refused_and_then_served_through_send(serve: Serve) -> None:
    """The writer stops taking chunks once the client's socket is full, past a bounded number of bytes;
    what follows goes through `send`, which waits for the client, and nothing is lost or reordered."""
    written_now = asyncio.get_running_loop().create_future()

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        await _start(send)
        write = body_writer(server_send(scope, send))
        assert write is not None
        count = 0
        while write(bytes([count % 256]) * len(CHUNK)):
            count += 1
            if count * len(CHUNK) > MOST_BUFFERED:
                written_now.set_exception(
                    AssertionError("the writer buffered without bound for a stalled client")
                )
                return
        written_now.set_result(count)
        for n in range(count, count + 4):
            await send({"type": BODY, "body": bytes([n % 256]) * len(CHUNK), "more_body": True})
        await send({"type": BODY, "body": b"", "more_body": False})

    port = await serve(handler)
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        count = await asyncio.wait_for(written_now, 30)  # refused while the client reads nothing
        assert count >= 1  # and taken at first
        received = await asyncio.to_thread(_read_all, client)
    body = _unchunked(received.split(b"\r\n\r\n", 1)[1])
    assert body == b"".join(bytes([n % 256]) * len(CHUNK) for n in range(count + 4))


def _read_all(client: socket.socket) -> bytes:
    client.settimeout(30)
    received = bytearray()
    while not received.endswith(b"0\r\n\r\n"):
        data = client.recv(1 << 20)
        assert data, "the answer ended early"
        received += data
    return bytes(received)


def _unchunked(body: bytes) -> bytes:
    """The payload of a chunked HTTP/1.1 body."""
    payload = b""
    while True:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return payload
        payload += rest[:size]
        body = rest[size + 2 :]
