"""The ASGI server's own `send`, kept in the scope for the event streams' body writes.

The gateway's middleware and Starlette's exception handlers each wrap `send` in a coroutine
of their own, and an event stream writes thousands of times a second: at 10,000 events/s
those layers took several of the 75-80 microseconds the gateway spent per event. They only
watch for the answer's start (its status, and whether it began), which an event stream
still sends through them; its body then skips them. (Starlette's outermost error handler
stays in the way: the application cannot reach outside it.)
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

SERVER_SEND = "streampool.server_send"


class KeepServerSend:
    """ASGI middleware, outside the others: puts the `send` it is given in the scope (see the module's
    docstring)."""

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
