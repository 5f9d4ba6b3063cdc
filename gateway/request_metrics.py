"""Counting HTTP answers by route template and status (`streampool_http_requests_total`).

The label is the route's template (`/v1/jobs/{job_id}`), never the raw path, which would
make a series per job; a path no route matches counts as `other`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.metrics import GatewayMetrics
from gateway.routing import route_of

OTHER = "other"


def route_template(scope: Scope) -> str:
    """The template of the route that answered, or would have had the request got that far."""
    return str(getattr(route_of(scope), "path", OTHER))


class RequestMetrics:
    """ASGI middleware, outermost: counts each answer once, when it starts (an event stream counts
    when it opens, not when it ends)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    def _count(self, scope: Scope, status: int) -> None:
        self.metrics.http_requests.labels(route=route_template(scope), status=str(status)).inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                started = True
                self._count(scope, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # the server answers it with a 500
                self._count(scope, 500)
            raise
