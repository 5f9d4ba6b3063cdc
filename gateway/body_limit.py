"""A cap on request bodies (413 `body_too_large`): on the declared Content-Length, and on the bytes read.

It answers before routing, in the error shape of the route the request would go to.

The body is read here, up to the cap, before the route sees it, so that a body sent without a
length (chunked) is refused as soon as it passes the cap, not after all of it has arrived.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import error_response
from gateway.metrics import GatewayMetrics
from shared.errors import BodyTooLarge


class BodyLimit:
    """ASGI middleware: bodies above `max_bytes` never reach a route, but those POSTed to a path of
    `streamed`, whose route reads its body as a stream and bounds it itself (a file upload)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, metrics: GatewayMetrics, streamed: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.streamed = streamed

    def _too_large(self) -> BodyTooLarge:
        self.metrics.jobs_rejected.labels(reason="body_too_large").inc()
        return BodyTooLarge(
            f"the request body is larger than {self.max_bytes} bytes", max_body_bytes=self.max_bytes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not _declares_body(scope)
            or (scope["method"] == "POST" and scope["path"] in self.streamed)
        ):
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(scope, self._too_large())(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        first: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body ended
                first = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await error_response(scope, self._too_large())(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replay: Message = first or {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        replayed = False

        async def receive_after_body() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return replay
            return await receive()

        await self.app(scope, receive_after_body, send)


def _declares_body(scope: Scope) -> bool:
    """Whether a request says it has a body: a transfer coding (chunked), or a Content-Length other
    than 0. One that says neither has none (RFC 9112, 6.3), as nearly every GET: a long-poll, one a
    batch of events, goes to its route without its empty body being read and handed on here."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False
