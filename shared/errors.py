"""The one exception tree of streampool; the gateway turns each into an HTTP answer in one place.

StreampoolError
├── InvalidRequest        422 validation
├── Unauthorized          401 unauthorized (no or unknown API key)
├── JobNotFound           404 not_found
├── CursorExpired         410 cursor_expired
├── PromptTooLong         413 prompt_too_long
├── BodyTooLarge          413 body_too_large
├── Overloaded            429 overloaded
├── BackendUnavailable    503 unavailable (Redis unreachable, no worker)
└── EngineError           a generation failed inside the engine (worker side)
"""

from __future__ import annotations

from typing import Any


class StreampoolError(Exception):
    error_type = "internal"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidRequest(StreampoolError):
    error_type = "validation"


class Unauthorized(StreampoolError):
    error_type = "unauthorized"


class JobNotFound(StreampoolError):
    error_type = "not_found"


class CursorExpired(StreampoolError):
    error_type = "cursor_expired"


class PromptTooLong(StreampoolError):
    error_type = "prompt_too_long"


class BodyTooLarge(StreampoolError):
    error_type = "body_too_large"


class Overloaded(StreampoolError):
    error_type = "overloaded"


class BackendUnavailable(StreampoolError):
    error_type = "unavailable"


class EngineError(StreampoolError):
    error_type = "engine_error"
