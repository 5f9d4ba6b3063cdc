"""The ASGI server's own `send`, kept in the scope for the event streams' body writes.

The gateway's middleware and Starlette's exception handlers each wrap `send` in a coroutine
of their own, and an event stream writes thousands of times a second: at 10,000 events/s
those layers took several of the 75-80 microseconds the gateway spent per event. They only
watch for the answer's start (its status, and whether it began), which an event stream
still sends through them; its body then skips them. `KeepServerSend` wraps the whole application
where the server is made (`gateway.app.GatewayServer`), outside Starlette's outermost error handler
too, so that the `send` it keeps is the server's own.

`body_writer` goes one step further, for the events the stream hub hands out as it hears them: it
writes a body chunk to the client's socket at once, from the hub's own callback, where awaiting
`send` would mean waking a task per event (measured at 1,000 followed streams over SSE, not waking
it cut the gateway's CPU per event by about a quarter).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

SERVER_SEND = "streampool.server_send"

BodyWriter = Callable[[bytes], bool]
"""Writes one body chunk now and answers True, or answers False and writes nothing when the chunk
must go through `send` instead: it would have to wait (the client's socket buffer is full), or the
client is gone, or the answer has ended."""


class KeepServerSend:
    """ASGI middleware around the whole application: puts the `send` it is given in the scope (see
    the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SERVER_SEND] = send
        await self.app(scope, receive, send)


def server_send(scope: Scope, send: Send) -> Send:
    """The server's `send` for a response's body, once its start has gone through `send`."""
    found: Send = scope.get(SERVER_SEND, send)
    return found


def body_writer(send: Send) -> BodyWriter | None:
    """A `BodyWriter` for the answer whose server `send` this is (see `server_send`), once its start
    has gone through `send`; None for a server it cannot write for.

    It writes a chunk exactly as uvicorn's `send` does for `http.response.body` with `more_body`
    (chunked transfer encoding, then the transport's non-blocking write), and refuses where that
    `send` would wait for the socket to drain: the next chunk then goes through `send`, which waits,
    so chunks keep their order and a slow client still holds back only its own stream. uvicorn's
    httptools protocol only (the gateway's server: `uvicorn[standard]`); `send` is its request
    cycle's own method. Under any other server or protocol every chunk goes through `send`.
    """
    cycle = getattr(send, "__self__", None)
    if not isinstance(cycle, RequestResponseCycle) or cycle.chunked_encoding is not True:
        return None  # another server, or an answer whose start chose no chunked encoding
    flow, transport = cycle.flow, cycle.transport
    transport_write, is_closing = transport.write, transport.is_closing

    def write(body: bytes) -> bool:
        if (
            flow.write_paused
            or cycle.disconnected
            or cycle.response_complete
            or is_closing()  # uvloop raises on a write to a closed transport
        ):
            return False
        transport_write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    return write
