"""The one exception tree of streampool; the gateway turns each into an HTTP answer in one place.

StreampoolError
├── InvalidRequest        422 validation
│   └── WebhookRefused    400 webhook_refused (a webhook URL the gateway may not POST to)
├── IdempotencyMismatch   422 idempotency_mismatch (an Idempotency-Key reused with another body)
├── Unauthorized          401 unauthorized (no or unknown API key)
├── Forbidden             403 forbidden (a key that may not use the route: an admin's)
├── JobNotFound           404 not_found
├── ModelRequired         400 model_required (no `model` where several are served and no default)
├── ModelNotFound         404 model_not_found (a model neither declared nor announced by a worker)
├── CursorExpired         410 cursor_expired
├── PromptTooLong         413 prompt_too_long
├── BodyTooLarge          413 body_too_large
├── Overloaded            429 overloaded
│   └── RateLimited       429 rate_limited (the caller's tenant is at one of its limits)
├── BackendUnavailable    503 unavailable (Redis unreachable, no model known at all)
├── JobCancelled          cancelled: the job a client waited on ended early (410 on OpenAI's routes)
├── DeadlineExceeded      504 deadline_exceeded: the job a client waited on was still queued at its deadline
├── EngineError           a generation failed inside the engine (worker side)
├── NotResumable          not_resumable: a job of several choices met a second run (it fails)
└── EngineDead            the engine itself is gone: no job is to blame, and its worker must go too
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

    field: str | None = None
    """The job field at fault, when one is: an API layer names it in its own terms."""
    reason: str = ""

    @classmethod
    def of_field(cls, field: str, reason: str, **detail: Any) -> InvalidRequest:
        """`field: reason`, remembering both."""
        exc = cls(f"{field}: {reason}", **detail)
        exc.field, exc.reason = field, reason
        return exc


class WebhookRefused(InvalidRequest):
    """A request's webhook that is not allowed; 400 as OpenAI answers a bad parameter: the body is
    valid, the operator's configuration refuses it."""

    error_type = "webhook_refused"


class IdempotencyMismatch(StreampoolError):
    error_type = "idempotency_mismatch"


class Unauthorized(StreampoolError):
    error_type = "unauthorized"


class Forbidden(StreampoolError):
    error_type = "forbidden"


class JobNotFound(StreampoolError):
    error_type = "not_found"


class ModelRequired(StreampoolError):
    error_type = "model_required"


class ModelNotFound(StreampoolError):
    error_type = "model_not_found"


class CursorExpired(StreampoolError):
    error_type = "cursor_expired"


class PromptTooLong(StreampoolError):
    error_type = "prompt_too_long"


class BodyTooLarge(StreampoolError):
    error_type = "body_too_large"


class Overloaded(StreampoolError):
    error_type = "overloaded"


class RateLimited(Overloaded):
    """A tenant at one of its limits (`limit` names it in the detail); a retry after `retry_after`
    seconds may be admitted."""

    error_type = "rate_limited"

    def __init__(self, message: str, *, limit: str, retry_after: int) -> None:
        super().__init__(message, limit=limit)
        self.retry_after = retry_after


class BackendUnavailable(StreampoolError):
    error_type = "unavailable"


class JobCancelled(StreampoolError):
    error_type = "cancelled"


class DeadlineExceeded(StreampoolError):
    """The job a client waited on failed unrun: its deadline passed before a worker started it."""

    error_type = "deadline_exceeded"


class EngineError(StreampoolError):
    error_type = "engine_error"


class NotResumable(StreampoolError):
    """A job of several choices met a second run: its choices cannot go on token-exactly from one
    stream, so it fails rather than restarts under readers that already saw its first tokens."""

    error_type = "not_resumable"


class EngineDead(StreampoolError):
    """Not an `EngineError`: the job at hand did nothing wrong, and goes on on another worker."""

    error_type = "engine_dead"
