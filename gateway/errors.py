"""The one place where errors become HTTP answers, in the shape of the API a route belongs to.

Streampool's own shape is `{"error": ..., "error_type": ...}`. A router that speaks another
API's dialect says so with a route class (`ShapedRoute` with its own `error_shape`, passed as
`route_class=`); the handlers here, and the body limit before routing, find the shape on the
route a request goes to, never by its path. A path no route matches is answered in streampool's.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from gateway.routing import JSONRoute, route_of
from shared.errors import (
    BackendUnavailable,
    BodyTooLarge,
    CursorExpired,
    DeadlineExceeded,
    Forbidden,
    IdempotencyMismatch,
    InvalidRequest,
    JobNotFound,
    ModelNotFound,
    ModelRequired,
    Overloaded,
    PromptTooLong,
    RateLimited,
    StreampoolError,
    Unauthorized,
    WebhookRefused,
)
from shared.json_text import MAX_JSON_DEPTH
from shared.requests import ErrorBody

log = logging.getLogger(__name__)

STATUS_CODES: dict[type[StreampoolError], int] = {
    WebhookRefused: 400,  # before InvalidRequest, which it is
    InvalidRequest: 422,
    IdempotencyMismatch: 422,
    Unauthorized: 401,
    Forbidden: 403,
    JobNotFound: 404,
    ModelRequired: 400,
    ModelNotFound: 404,
    CursorExpired: 410,
    PromptTooLong: 413,
    BodyTooLarge: 413,
    Overloaded: 429,
    BackendUnavailable: 503,
    DeadlineExceeded: 504,
}
HTTP_ERROR_TYPES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 500: "internal"}
RETRY_AFTER_SECONDS = "1"
FIELD = re.compile(r"\w+")  # a field name or index in an error's `loc`; not a union member's type
# What each documented status means, for the OpenAPI document.
MEANINGS = {
    400: "a body that cannot be parsed, no `model` where several are served, or a webhook that is not "
    "allowed (webhook_refused); on OpenAI's routes any invalid parameter, or a prompt too long",
    401: "no API key, or an unknown one",
    403: "a key that is not an admin's, on a route for admin keys",
    404: "no such job, or another key's; or a model that is neither declared nor announced (model_not_found)",
    410: "the cursor is older than what the stream still holds",
    413: "the body is larger than max_body_bytes, or the prompt does not fit the context",
    422: "invalid request, or an Idempotency-Key used before with another body (idempotency_mismatch)",
    429: "the queue is full, Redis's memory past its high-water mark (overloaded), or the key's tenant at "
    "one of its limits (rate_limited, naming it); retry after Retry-After seconds",
    503: "Redis is unreachable, or no model is known at all (none declared, no worker ever announced one)",
    504: "the request's deadline passed while its job was queued: it ended without running "
    "(deadline_exceeded)",
}


def error_body(message: str, error_type: str, **extra: Any) -> dict[str, Any]:
    return {"error": message, "error_type": error_type, **extra}


def status_of(exc: StreampoolError, codes: Mapping[type[StreampoolError], int]) -> int:
    return next((code for cls, code in codes.items() if isinstance(exc, cls)), 500)


def _headers(status: int, exc: StreampoolError) -> dict[str, str] | None:
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(exc.retry_after)}
    return {"Retry-After": RETRY_AFTER_SECONDS} if status in (429, 503) else None


class ErrorShape:
    """How an API writes its errors; this one is streampool's own, which other dialects override."""

    body_model: ClassVar[type[BaseModel]] = ErrorBody
    status_codes: ClassVar[Mapping[type[StreampoolError], int]] = STATUS_CODES

    def failure(self, exc: StreampoolError) -> tuple[int, dict[str, Any]]:
        """Status and body of a failure."""
        status = status_of(exc, self.status_codes)
        return status, error_body(exc.message, exc.error_type, **jsonable_encoder(exc.detail))

    def invalid(
        self, message: str, where: str, error_type: str | None, errors: list[Any]
    ) -> tuple[int, dict[str, Any]]:
        """Status and body of a request that failed validation: `message` says what is wrong,
        at the field `where` (empty: the body as a whole), with pydantic's error `error_type`."""
        return 422, error_body(message, "validation", detail=errors)

    def refusal(self, status: int, message: str) -> dict[str, Any]:
        """The body of routing's own refusals (404, 405, ...), and of an unexpected failure (500)."""
        return error_body(message, HTTP_ERROR_TYPES.get(status, "http_error"))


NATIVE = ErrorShape()


class ShapedRoute(JSONRoute):
    """A route whose errors take `error_shape` (and whose body is JSON, no more); a router of another
    dialect subclasses it."""

    error_shape: ClassVar[ErrorShape] = NATIVE


def shape_of(scope: Scope) -> ErrorShape:
    """The error shape of the route a request goes to; streampool's own where no route matches."""
    shape = getattr(route_of(scope), "error_shape", NATIVE)
    return shape if isinstance(shape, ErrorShape) else NATIVE


def error_response(scope: Scope, exc: StreampoolError) -> JSONResponse:
    """The answer to a failure, in the shape of the route the request goes to."""
    status, body = shape_of(scope).failure(exc)
    return JSONResponse(body, status_code=status, headers=_headers(status, exc))


def documented(*statuses: int, shape: ErrorShape = NATIVE) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route's OpenAPI operation for the errors it may answer with."""
    return {status: {"model": shape.body_model, "description": MEANINGS[status]} for status in statuses}


def documented_compatible(shape: ErrorShape) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a compatible API's routes: every 4xx in its shape, validation errors included
    ("4XX" keeps FastAPI from listing its own 422)."""
    return {
        **documented(400, 401, 404, 410, 413, 429, 503, 504, shape=shape),
        "4XX": documented(400, shape=shape)[400] | {"description": "any other client error"},
    }


async def _streampool_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StreampoolError)
    if isinstance(exc, BackendUnavailable):
        log.warning("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(request.scope, exc)


ELIDED = "..."
"""What stands, in echoed input, for what nests deeper than MAX_JSON_DEPTH."""


def _encodable(value: Any, depth: int = 0) -> Any:
    """`value` as JSON can carry it: refused input is echoed, lone surrogates and NaN included, and
    no deeper than MAX_JSON_DEPTH, so that no input makes this (or `jsonable_encoder`, which is given
    its result) recurse without bound."""
    if depth > MAX_JSON_DEPTH:
        return ELIDED
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, list | tuple):
        return [_encodable(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item, depth + 1) for key, item in value.items()}
    return value


def _message(error: Mapping[str, Any], where: str) -> str:
    """What is wrong, in a sentence: the field and pydantic's message, or why the body is not JSON."""
    if error.get("type") == "json_invalid" and where.isdigit():  # FastAPI's: `loc` ends at the character
        return f"the body is not valid JSON at character {where}: {error.get('ctx', {}).get('error')}"
    return f"{where}: {error.get('msg', 'invalid')}" if where else error.get("msg", "invalid request")


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = jsonable_encoder(_encodable(exc.errors()))
    # Of a union's errors, the one of the member that fits the value's type says what is wrong.
    first = next(
        (error for error in errors if not error["type"].endswith("_type")), errors[0] if errors else {}
    )
    where = ".".join(
        str(part) for part in first.get("loc", ()) if part != "body" and FIELD.fullmatch(str(part))
    )
    status, body = shape_of(request.scope).invalid(_message(first, where), where, first.get("type"), errors)
    return JSONResponse(body, status_code=status)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    body = shape_of(request.scope).refusal(exc.status_code, str(exc.detail))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(shape_of(request.scope).refusal(500, "internal error"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StreampoolError, _streampool_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
