"""Counting HTTP answers by route template and status (`streampool_http_requests_total`).

The label is the route's template (`/v1/jobs/{job_id}`), never the raw path, which would
make a series per job; a path no route matches counts as `other`.
"""

from __future__ import annotations

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.metrics import GatewayMetrics
from gateway.routing import route_of

OTHER = "other"


def route_template(scope: Scope) -> str:
    """The template of the route that answered, or would have had the request got that far."""
    return str(getattr(route_of(scope), "path", OTHER))


class RequestCounts:
    """The answers counted so far, by route template and status: the series of each, kept.

    `labels` takes a lock and builds its key from the label values on every call, a cost a long-poll
    (one request a batch of events) paid per page; there are as many series as templates times
    statuses, a few dozen."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self._series: dict[tuple[str, int], Counter] = {}

    def count(self, template: str, status: int) -> None:
        """One answer of `status` from the route of `template`."""
        key = (template, status)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self.metrics.http_requests.labels(route=template, status=str(status))
        series.inc()


class RequestMetrics:
    """ASGI middleware, outside the others but `PlainPolls` (which counts the plain polls it answers
    itself): counts each answer once, when it starts (an event stream counts when it opens, not when
    it ends)."""

    def __init__(self, app: ASGIApp, counts: RequestCounts) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                started = True
                self.counts.count(route_template(scope), message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # the server answers it with a 500
                self.counts.count(route_template(scope), 500)
            raise
