"""The native job API: submit, read, follow (SSE or long-poll), cancel."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from gateway.auth import REQUIRE_KEY, Owner
from gateway.deadlines import header_deadline
from gateway.deps import JobId, OwnedJobId, ServicesDep
from gateway.errors import ShapedRoute, documented
from gateway.generation import JOB_ID_HEADER
from gateway.relay.cursors import START, parse_cursor
from gateway.relay.open_streams import NOT_HELD, StreamLimits
from gateway.relay.polls import CURSOR_MAX_LENGTH, LIMIT_DEFAULT, LIMIT_MOST, WAIT_MOST, page_response
from gateway.relay.sse import EventStream
from shared.events import JobState
from shared.requests import (
    CancelAnswer,
    EventsPage,
    JobAccepted,
    JobRecord,
    JobSubmission,
    JobUrls,
)
from shared.webhooks import JOB_API, WEBHOOK_URL, WebhookDelivery

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    dependencies=[REQUIRE_KEY],
    responses=documented(401, 422, 503),
    route_class=ShapedRoute,
)

EVENTS_CONTENT = {
    "text/event-stream": {
        "schema": {
            "type": "string",
            "description": "with `Accept: text/event-stream`: an event per stream entry, `id:` its stream id",
        }
    }
}


SUBMIT_STREAM_CONTENT = {
    "text/event-stream": {
        "schema": {
            "type": "string",
            "description": "with `Accept: text/event-stream`: the job's events from its first, as its events "
            "route streams them; the job's id in `X-Streampool-Job-Id` and `Location`",
        }
    }
}


def _wants_events(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


def _urls(job_id: str) -> JobUrls:
    base = f"/v1/jobs/{job_id}"
    return JobUrls(self=base, events=f"{base}/events", cancel=f"{base}/cancel")


@router.post(
    "",
    status_code=202,
    response_model=JobAccepted,
    responses={200: {"content": SUBMIT_STREAM_CONTENT}, **documented(400, 413, 429)},
)
async def submit_job(
    body: JobSubmission,
    owner: Owner,
    services: ServicesDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
) -> JobAccepted | EventStream:
    """Queue a generation job; answers at once with where to follow it, or, with
    `Accept: text/event-stream`, follows it from its first event in the same request.

    A prompt that cannot fit the context with `max_tokens` is refused (413) before any job is made, and
    so is a `webhook` the gateway may not POST to (400).
    """
    annotations = services.webhook_targets.annotations(owner, body.webhook, JOB_API)
    streaming = _wants_events(request)
    # A stream over the limits is refused before any job is made.
    with services.hold_reader(owner) if streaming else NOT_HELD as hold:
        submission = await services.admission.admit(
            body,
            owner,
            idempotency_key=idempotency_key,
            annotations=annotations,
            deadline=header_deadline(request.headers, services.settings),
        )
        job_id = submission.job_id
        headers = {"Location": _urls(job_id).self, JOB_ID_HEADER: job_id}
        if not submission.created:
            headers["Idempotent-Replayed"] = "true"
        if streaming:
            # Leaving this stream leaves the job running: it can be followed again from any event id.
            following = services.relay.follow(job_id, START, services.settings.reader_batch_bytes)
            return EventStream(
                following, hold.hand_over(), services.metrics, services.settings.sse_ping_seconds, headers
            )
    response.headers.update(headers)
    return JobAccepted(
        id=job_id, status=submission.status, created_at=submission.created_at, urls=_urls(job_id)
    )


@router.get("/{job_id}", response_model=JobRecord, responses=documented(404))
async def get_job(job_id: OwnedJobId, services: ServicesDep) -> JobRecord:
    """The job record: state, timings, output so far, usage; for a queued job whose model has no live
    worker, what it waits for."""
    record = await services.store.record(job_id)
    if record.status is JobState.queued and record.model is not None:
        record.waiting = await services.admission.waiting(record.model)
    return record


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=CancelAnswer,
    responses={200: {"model": CancelAnswer, "description": "the job had already ended"}, **documented(404)},
)
async def cancel_job(job_id: OwnedJobId, services: ServicesDep, response: Response) -> CancelAnswer:
    """Cancel a job; idempotent, and a finished job stays as it was (answered with 200)."""
    answer, took_effect = await services.store.cancel(job_id)
    if not took_effect:
        response.status_code = 200
    log.info("cancel: %s", answer.message, extra={"job_id": job_id})
    return answer


@router.get("/{job_id}/webhook", response_model=WebhookDelivery, responses=documented(404))
async def job_webhook(job_id: OwnedJobId, services: ServicesDep) -> WebhookDelivery:
    """How the job's webhook went: attempts, the last answer, when it was delivered (404: no webhook)."""
    annotations = await services.store.annotations(job_id)
    return await services.deliveries.record(job_id, annotations.get(WEBHOOK_URL))


async def job_events(
    job_id: JobId,
    owner: Owner,
    request: Request,
    services: ServicesDep,
    after: Annotated[
        str | None, Query(max_length=CURSOR_MAX_LENGTH, description="stream id to read after")
    ] = None,
    wait: Annotated[
        float,
        Query(
            ge=0, le=WAIT_MOST, description="long-poll: seconds to wait for an event (at most poll_wait_max)"
        ),
    ] = 0.0,
    limit: Annotated[
        int, Query(ge=1, le=LIMIT_MOST, description="long-poll: most events per page")
    ] = LIMIT_DEFAULT,
    last_event_id: Annotated[str | None, Header(max_length=CURSOR_MAX_LENGTH)] = None,
) -> Response:
    """SSE from the cursor to the terminal event, or (without `Accept: text/event-stream`) one page."""
    cursor, limits = parse_cursor(last_event_id or after), StreamLimits.of(services.settings)
    if _wants_events(request):
        # 404 / 410 / 422 / 429 before the stream starts
        followed, hold = await services.relay.open(job_id, cursor, owner, limits)
        return EventStream(followed, hold, services.metrics, services.settings.sse_ping_seconds)
    return await page_response(services.relay, services.settings, job_id, cursor, wait, limit, owner)


router.add_api_route(
    "/{job_id}/events",
    job_events,
    methods=["GET"],
    response_model=EventsPage,
    responses={200: {"content": EVENTS_CONTENT}, **documented(404, 410, 429)},
)


def events_route(routes: list[BaseRoute]) -> APIRoute:
    """The events route among an application's routes (`gateway.plain_polls` answers its plain polls)."""
    return next(route for route in routes if isinstance(route, APIRoute) and route.endpoint is job_events)
