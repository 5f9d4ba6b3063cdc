"""The route a request goes to, for what runs before routing (middleware) as well as after; and the
route class every route with a JSON body is built on."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from shared import json_text


def route_of(scope: Scope) -> BaseRoute | None:
    """The route that answered, or would have had the request got that far: chosen as the
    router chooses it (the first full match, else the first route whose path matches but not
    its method); None when no route's path matches."""
    route: BaseRoute | None = scope.get("route")
    if route is not None:
        return route
    app = scope.get("app")
    routes: list[BaseRoute] = app.routes if app is not None else []
    partial = None
    for candidate in routes:
        match, _ = candidate.matches(scope)
        if match is Match.FULL:
            return candidate
        if match is Match.PARTIAL and partial is None:
            partial = candidate
    return partial


class JSONBodyRequest(Request):
    """A request whose body is parsed as JSON and nothing more (`shared.json_text`): too deep a nesting
    or a number JSON cannot hold is a `JSONDecodeError`, which FastAPI answers as any body that is not
    JSON, before the route's model validates it."""

    async def json(self) -> Any:
        return json_text.loads(await self.body())


class JSONRoute(APIRoute):
    """A route whose body, when it has one, FastAPI reads through `JSONBodyRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None:  # nothing to parse: a GET (a long-poll) pays nothing
            return handle

        async def handler(request: Request) -> Response:
            return await handle(JSONBodyRequest(request.scope, request.receive))

        return handler
