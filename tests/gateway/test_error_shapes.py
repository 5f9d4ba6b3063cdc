"""An error's shape follows the router its route belongs to, never the path it was asked at.

The apps here mount routers where the gateway does not: no Redis and no worker are needed,
since every request is refused before a route would use its services.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from gateway.auth import ApiKeys
from gateway.body_limit import BodyLimit
from gateway.errors import ErrorShape, ShapedRoute, install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.routes import openai, tgi
from shared.errors import Overloaded, PromptTooLong, StreampoolError

MAX_BODY_BYTES = 4096


class Teapot(ErrorShape):
    """A dialect of a route a later issue might add."""

    def failure(self, exc: StreampoolError) -> tuple[int, dict[str, Any]]:
        return 418, {"teapot": exc.message}


class TeapotRoute(ShapedRoute):
    error_shape = Teapot()


teapot = APIRouter(route_class=TeapotRoute)
tgi_shaped = APIRouter(route_class=tgi.TGIRoute)
openai_shaped = APIRouter(route_class=openai.OpenAIRoute)
plain = APIRouter()


@teapot.get("/brew")
@plain.get("/plain/brew")
async def brew() -> None:
    raise Overloaded("the pot is full")


@tgi_shaped.get("/too-long")
@plain.get("/plain/too-long")
async def too_long() -> None:
    raise PromptTooLong("a prompt too long", prompt_tokens=9, max_tokens=1, context_length=8)


@openai_shaped.get("/fail")
@plain.get("/plain/fail")
async def fail() -> None:
    raise RuntimeError("a bug")


def _app() -> FastAPI:
    metrics = GatewayMetrics()
    app = FastAPI()
    app.state.api_keys = ApiKeys(())
    app.state.metrics = metrics
    app.state.services = None  # refused before any route reads it
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, metrics=metrics)
    install_error_handlers(app)
    app.include_router(openai.router, prefix="/elsewhere")
    app.include_router(tgi.router, prefix="/tgi")
    app.include_router(teapot, prefix="/teapot")
    app.include_router(tgi_shaped, prefix="/tgi-shaped")
    app.include_router(openai_shaped, prefix="/openai-shaped")
    app.include_router(plain)
    return app


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)  # a 500 is answered
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


def _is_openai(answer: httpx.Response) -> bool:
    body = answer.json()
    return set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}


async def test_a_router_of_another_dialect_answers_in_its_shape_at_any_path(http: httpx.AsyncClient) -> None:
    brewed = await http.get("/teapot/brew")
    assert (brewed.status_code, brewed.json()) == (418, {"teapot": "the pot is full"})
    plain_answer = await http.get("/plain/brew")
    assert plain_answer.status_code == 429
    assert plain_answer.json() == {"error": "the pot is full", "error_type": "overloaded"}


async def test_openai_routes_mounted_elsewhere_still_answer_openai_errors(http: httpx.AsyncClient) -> None:
    invalid = await http.post("/elsewhere/v1/completions", json={"prompt": "hi"})
    assert invalid.status_code == 400 and _is_openai(invalid)
    assert invalid.json()["error"]["param"] == "model"
    wrong_method = await http.get("/elsewhere/v1/chat/completions")
    assert wrong_method.status_code == 405 and _is_openai(wrong_method)
    too_large = await http.post("/elsewhere/v1/completions", content=b"x" * (MAX_BODY_BYTES + 1))
    assert too_large.status_code == 413 and _is_openai(too_large)  # answered before routing
    # Where no route is, the path alone says nothing: streampool's own shape.
    unrouted = await http.post("/v1/completions", json={"prompt": "hi"})
    assert unrouted.status_code == 404
    assert unrouted.json() == {"error": "Not Found", "error_type": "not_found"}


async def test_tgi_routes_answer_a_prompt_too_long_as_invalid_input(http: httpx.AsyncClient) -> None:
    numbers = {"prompt_tokens": 9, "max_tokens": 1, "context_length": 8}
    tgi_answer = await http.get("/tgi-shaped/too-long")
    assert tgi_answer.status_code == 422
    assert tgi_answer.json() == {"error": "a prompt too long", "error_type": "validation", **numbers}
    plain_answer = await http.get("/plain/too-long")
    assert plain_answer.status_code == 413
    assert plain_answer.json() == {"error": "a prompt too long", "error_type": "prompt_too_long", **numbers}
    invalid = await http.post("/tgi/generate", json={})
    assert invalid.status_code == 422 and invalid.json()["error_type"] == "validation"


async def test_an_unexpected_failure_is_a_500_in_the_routes_shape(http: httpx.AsyncClient) -> None:
    openai_answer = await http.get("/openai-shaped/fail")
    assert openai_answer.status_code == 500 and _is_openai(openai_answer)
    plain_answer = await http.get("/plain/fail")
    assert plain_answer.status_code == 500
    assert plain_answer.json() == {"error": "internal error", "error_type": "internal"}
