"""The one place where errors become HTTP answers: `{"error": ..., "error_type": ...}`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import (
    BackendUnavailable,
    CursorExpired,
    InvalidRequest,
    JobNotFound,
    Overloaded,
    PromptTooLong,
    StreampoolError,
)

log = logging.getLogger(__name__)

STATUS_CODES: dict[type[StreampoolError], int] = {
    InvalidRequest: 422,
    JobNotFound: 404,
    CursorExpired: 410,
    PromptTooLong: 413,
    Overloaded: 429,
    BackendUnavailable: 503,
}
RETRY_AFTER_SECONDS = "1"


def error_body(message: str, error_type: str, **extra: Any) -> dict[str, Any]:
    return {"error": message, "error_type": error_type, **extra}


def streampool_error_response(exc: StreampoolError) -> JSONResponse:
    status = next((code for cls, code in STATUS_CODES.items() if isinstance(exc, cls)), 500)
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status in (429, 503) else None
    body = error_body(exc.message, exc.error_type, **jsonable_encoder(exc.detail))
    return JSONResponse(body, status_code=status, headers=headers)


async def _streampool_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StreampoolError)
    if isinstance(exc, BackendUnavailable):
        log.warning("%s %s: %s", request.method, request.url.path, exc.message)
    return streampool_error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = jsonable_encoder(exc.errors())
    first = errors[0] if errors else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg", "invalid request")
    return JSONResponse(error_body(message, "validation", detail=errors), status_code=422)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        error_body(str(exc.detail), error_type), status_code=exc.status_code, headers=exc.headers
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(error_body("internal error", "internal"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StreampoolError, _streampool_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
