"""Webhooks' wire shapes: the event a receiver gets when a job ends, as OpenAI's webhook events
(`openai.types.webhooks`), and the delivery record the job's owner reads.

A job's webhook is kept in its record as annotations (`JobStore.annotations`): `webhook_url`, and
`api`, the API the job was made through, which names its events (`job.completed` for a native
job, `response.completed` for a response). The lifecycle's `announce_end.lua` reads both by name.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field

from shared.events import JobState

WEBHOOK_URL = "webhook_url"
API = "api"
JOB_API = "job"
RESPONSE_API = "response"
BATCH_API = "batch"  # a batch's end: its record keeps the same fields a job's does (`batch_move.lua`)
RESPONSE_ID_PREFIX = "resp_"
EVENT_ID_PREFIX = "evt_"
TRUNCATED = "length"
"""The finish reason of a generation the token limit cut: a response is then `incomplete`."""


def event_type(api: str, state: str, finish_reason: str | None) -> str:
    """`<api>.<state>` (`job.completed`, `response.cancelled`, `batch.expired`, ...); a response the
    token limit cut is `response.incomplete`, as OpenAI names it."""
    if api == RESPONSE_API and state == JobState.completed.value and finish_reason == TRUNCATED:
        return "response.incomplete"
    return f"{api}.{state}"


def subject_id(api: str, job_id: str) -> str:
    """The id the event's `data` names: the job's, or for a response the response's."""
    return RESPONSE_ID_PREFIX + job_id if api == RESPONSE_API else job_id


def event_id(job_id: str) -> str:
    """A job ends once, so its one event is named after it: the same on every attempt and gateway."""
    return EVENT_ID_PREFIX + job_id


class WebhookEventData(BaseModel):
    id: str = Field(description="the job's id, the response's (`resp_...`) or the batch's (`batch_...`)")


class WebhookEvent(BaseModel):
    """The body POSTed to a webhook."""

    id: str = Field(
        description="the event's id, also its `webhook-id` header: a receiver drops a repeat by it"
    )
    object: Literal["event"] = "event"
    type: str = Field(
        description="job.completed | job.failed | job.cancelled, response.<status>, or batch.completed | "
        "batch.failed | batch.cancelled | batch.expired"
    )
    created_at: int = Field(description="when the job ended, unix seconds")
    data: WebhookEventData


class DeliveryStatus(str, Enum):
    pending = "pending"  # not yet answered with 2xx; retried until the retry period ends
    delivered = "delivered"  # a receiver answered 2xx: never sent again
    failed = "failed"  # given up: no 2xx within the retry period, or no secret to sign it with


class WebhookDelivery(BaseModel):
    """`GET /v1/jobs/{id}/webhook`: how the job's webhook went."""

    url: str
    event: str | None = Field(None, description="the event's type; none until the job ends")
    event_id: str | None = None
    status: DeliveryStatus | None = Field(None, description="none until the job ends")
    attempts: int = 0
    last_status: int | None = Field(None, description="the HTTP status of the last attempt's answer")
    last_error: str | None = Field(None, description="why the last attempt failed")
    last_attempt_at: datetime | None = None
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
