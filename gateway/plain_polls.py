"""Plain long-polls of the native events route, answered before the rest of the application's stack.

A long-poll comes once per batch of events: a client that polls at a stream's tip costs the gateway a
request per step of its job. Measured at 2,000 polls a second on one gateway process, the middlewares
inside Starlette's outermost one, the router's matching of every route that comes before the events
route, and its exception handling took about a quarter of the gateway's CPU, as much as the page
itself. `PlainPolls` sits outside them: a plain poll (`gateway.relay.polls.plain_poll`: plain values, no
body, no event stream) of the events route is answered here by the route's own steps (`plain_page`),
counted as `RequestMetrics` counts every answer, and what those steps raise is answered by the
application's own exception handlers, in the route's error shape. Every other request goes through the
stack, so that a refusal is answered as FastAPI answers it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import caller
from gateway.deps import checked_job_id, services_of
from gateway.relay.cursors import parse_cursor
from gateway.relay.polls import Poll, page_response, plain_poll
from gateway.request_metrics import RequestCounts


class PlainPolls:
    """ASGI middleware, outside every other of the gateway's own (see the module's docstring)."""

    def __init__(self, app: ASGIApp, route: BaseRoute, template: str, counts: RequestCounts) -> None:
        self.app = app
        self.route = route  # the events route, as the application holds it
        self.template = template  # its path, the label `RequestMetrics` counts its answers under
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            match, child_scope = self.route.matches(scope)
            if match is Match.FULL and (poll := plain_poll(scope)) is not None:
                scope.update(child_scope)  # the route and its path parameters, as the router sets them
                request = Request(scope, receive, send)
                try:
                    response = await plain_page(request, poll)
                except Exception as exc:
                    response = await _handled(request, exc)
                self.counts.count(self.template, response.status_code)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def plain_page(request: Request, poll: Poll) -> Response:
    """A plain long-poll's page, by the steps the events route takes for it (the caller's key, the job
    id's form, the cursor, the page) without FastAPI's resolving of its parameters."""
    owner = await caller(request)
    job_id = checked_job_id(request.scope["path_params"]["job_id"])
    cursor = parse_cursor(poll.last_event_id or poll.after)
    services = services_of(request)
    return await page_response(
        services.relay, services.settings, job_id, cursor, poll.wait, poll.limit, owner
    )


async def _handled(request: Request, exc: Exception) -> Response:
    """The answer the application's exception handler for `exc` gives, found as Starlette finds it
    (the handler of the nearest class in `exc`'s MRO); `exc` raised again where none is."""
    handlers = request.app.exception_handlers
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            response: Response = await handler(request, exc)
            return response
    raise exc
