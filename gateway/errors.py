"""The one place where errors become HTTP answers: `{"error": ..., "error_type": ...}`,
and OpenAI's `{"error": {"message", "type", "param", "code"}}` on the OpenAI-compatible routes."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.compat import openai as openai_compat
from gateway.compat import tgi as tgi_compat
from gateway.generation import JobCancelled
from shared.errors import (
    BackendUnavailable,
    BodyTooLarge,
    CursorExpired,
    InvalidRequest,
    JobNotFound,
    Overloaded,
    PromptTooLong,
    StreampoolError,
    Unauthorized,
)
from shared.requests import ErrorBody

log = logging.getLogger(__name__)

STATUS_CODES: dict[type[StreampoolError], int] = {
    InvalidRequest: 422,
    Unauthorized: 401,
    JobNotFound: 404,
    CursorExpired: 410,
    PromptTooLong: 413,
    BodyTooLarge: 413,
    Overloaded: 429,
    BackendUnavailable: 503,
}
OPENAI_STATUS_CODES: dict[type[StreampoolError], int] = {
    InvalidRequest: 400,  # OpenAI's status for a bad parameter, where the native API says 422
    PromptTooLong: 400,  # as vLLM answers it, with the numbers in the message
    openai_compat.ModelNotFound: 404,
    JobCancelled: 410,  # cancelled through the native API while its client waited: not worth a retry
}
OPENAI_CODES: dict[type[StreampoolError], str] = {
    PromptTooLong: "context_length_exceeded",
    Unauthorized: "invalid_api_key",
}
RETRY_AFTER_SECONDS = "1"
FIELD = re.compile(r"\w+")  # a field name or index in an error's `loc`; not a union member's type
# What each documented status means, for the OpenAPI document.
MEANINGS = {
    400: "a body that cannot be parsed; on OpenAI's routes any invalid parameter, or a prompt too long",
    401: "no API key, or an unknown one",
    404: "no such job, or another key's",
    410: "the cursor is older than what the stream still holds",
    413: "the body is larger than max_body_bytes, or the prompt does not fit the context",
    422: "invalid request",
    429: "the queue is full; retry after Retry-After seconds",
    503: "Redis is unreachable, or no worker is alive",
}


def error_body(message: str, error_type: str, **extra: Any) -> dict[str, Any]:
    return {"error": message, "error_type": error_type, **extra}


def _status(exc: StreampoolError, codes: dict[type[StreampoolError], int]) -> int:
    return next((code for cls, code in codes.items() if isinstance(exc, cls)), 500)


def _headers(status: int) -> dict[str, str] | None:
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return {"Retry-After": RETRY_AFTER_SECONDS} if status in (429, 503) else None


def error_response(path: str, exc: StreampoolError) -> JSONResponse:
    """The answer to a failure on `path`: OpenAI's shape on its routes, streampool's elsewhere."""
    if path in tgi_compat.GENERATION_PATHS and isinstance(exc, PromptTooLong):
        exc = InvalidRequest(exc.message, **exc.detail)  # TGI checks the input length as validation: 422
    if path in openai_compat.PATHS:
        status, body = openai_error(exc)
    else:
        status = _status(exc, STATUS_CODES)
        body = error_body(exc.message, exc.error_type, **jsonable_encoder(exc.detail))
    return JSONResponse(body, status_code=status, headers=_headers(status))


def speaks_openai(request: Request) -> bool:
    """Errors take OpenAI's shape on the OpenAI-compatible routes, and only there."""
    return request.url.path in openai_compat.PATHS


def documented(*statuses: int, openai: bool = False) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route's OpenAPI operation for the errors it may answer with."""
    model = openai_compat.OpenAIErrorBody if openai else ErrorBody
    return {status: {"model": model, "description": MEANINGS[status]} for status in statuses}


def openai_error(exc: StreampoolError) -> tuple[int, dict[str, Any]]:
    """Status and OpenAI body of a failure; the body alone also ends a stream that failed."""
    status = _status(exc, {**STATUS_CODES, **OPENAI_STATUS_CODES})
    code = exc.detail.get("code") or OPENAI_CODES.get(type(exc), exc.error_type)
    return status, openai_compat.error_object(status, exc.message, exc.detail.get("param"), code)


async def _streampool_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StreampoolError)
    if isinstance(exc, BackendUnavailable):
        log.warning("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(request.url.path, exc)


def _encodable(value: Any) -> Any:
    """`value` as JSON can carry it: refused input is echoed, lone surrogates and NaN included."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    return value


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _encodable(jsonable_encoder(exc.errors()))
    # Of a union's errors, the one of the member that fits the value's type says what is wrong.
    first = next(
        (error for error in errors if not error["type"].endswith("_type")), errors[0] if errors else {}
    )
    where = ".".join(
        str(part) for part in first.get("loc", ()) if part != "body" and FIELD.fullmatch(str(part))
    )
    message = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg", "invalid request")
    if speaks_openai(request):
        param = where if where and first.get("type") != "json_invalid" else None
        return JSONResponse(
            openai_compat.error_object(400, message, param, first.get("type")), status_code=400
        )
    return JSONResponse(error_body(message, "validation", detail=errors), status_code=422)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if speaks_openai(request):
        body = openai_compat.error_object(exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
    error_type = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "http_error"
    )
    return JSONResponse(
        error_body(str(exc.detail), error_type), status_code=exc.status_code, headers=exc.headers
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    if speaks_openai(request):
        return JSONResponse(openai_compat.error_object(500, "internal error"), status_code=500)
    return JSONResponse(error_body("internal error", "internal"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StreampoolError, _streampool_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
