"""The route a request goes to, for what runs before routing (middleware) as well as after."""

from __future__ import annotations

from starlette.routing import BaseRoute, Match
from starlette.types import Scope


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
