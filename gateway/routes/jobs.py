"""The native job API: submit, read, follow (SSE or long-poll), cancel."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.deps import OwnedJobId, ServicesDep
from gateway.errors import documented
from gateway.generation import JOB_ID_HEADER
from gateway.relay import START, parse_cursor
from gateway.sse import EventStream, event_stream
from shared.errors import InvalidRequest, Overloaded
from shared.requests import CancelAnswer, EventsPage, JobAccepted, JobRecord, JobRequest, JobUrls

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], dependencies=[REQUIRE_KEY], responses=documented(401, 422, 503)
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
    body: JobRequest,
    owner: Owner,
    services: ServicesDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
) -> JobAccepted | EventStream:
    """Queue a generation job; answers at once with where to follow it, or, with
    `Accept: text/event-stream`, follows it from its first event in the same request.

    A prompt that cannot fit the context with `max_tokens` is refused (413) before any job is made.
    """
    if body.max_tokens > services.settings.max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens: must be at most {services.settings.max_tokens_limit}",
            detail=[{"loc": ["body", "max_tokens"], "type": "less_than_equal", "input": body.max_tokens}],
        )
    await services.prompt_limit.check(body)
    try:
        submission = await services.store.submit(body, idempotency_key, owner)
    except Overloaded:
        services.metrics.jobs_rejected.labels(reason="overloaded").inc()
        raise
    job_id = submission.job_id
    headers = {"Location": _urls(job_id).self, JOB_ID_HEADER: job_id}
    if submission.created:
        services.metrics.jobs_submitted.inc()
        log.info("queued", extra={"job_id": job_id})
    else:
        headers["Idempotent-Replayed"] = "true"
    if _wants_events(request):
        # Leaving this stream leaves the job running: it can be followed again from any event id.
        following = services.relay.follow(job_id, START)
        return event_stream(following, services.metrics, services.settings.sse_ping_seconds, headers)
    response.headers.update(headers)
    return JobAccepted(
        id=job_id, status=submission.status, created_at=submission.created_at, urls=_urls(job_id)
    )


@router.get("/{job_id}", response_model=JobRecord, responses=documented(404))
async def get_job(job_id: OwnedJobId, services: ServicesDep) -> JobRecord:
    """The job record: state, timings, output so far, usage."""
    return await services.store.record(job_id)


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


@router.get(
    "/{job_id}/events",
    response_model=EventsPage,
    responses={200: {"content": EVENTS_CONTENT}, **documented(404, 410)},
)
async def job_events(
    job_id: OwnedJobId,
    request: Request,
    services: ServicesDep,
    after: Annotated[str | None, Query(max_length=41, description="stream id to read after")] = None,
    wait: Annotated[
        float,
        Query(ge=0, le=3600, description="long-poll: seconds to wait for an event (at most poll_wait_max)"),
    ] = 0.0,
    limit: Annotated[int, Query(ge=1, le=1000, description="long-poll: most events per page")] = 100,
    last_event_id: Annotated[str | None, Header(max_length=41)] = None,
) -> Response:
    """SSE from the cursor to the terminal event, or (without `Accept: text/event-stream`) one page."""
    cursor = parse_cursor(last_event_id or after)
    if _wants_events(request):
        await services.relay.check(job_id, cursor)  # 404 / 410 before the stream starts
        followed = services.relay.follow(job_id, cursor)
        return event_stream(followed, services.metrics, services.settings.sse_ping_seconds)
    wait = min(wait, services.settings.poll_wait_max)
    entries, state, done = await services.relay.page(job_id, cursor, limit, wait)
    page = EventsPage(
        events=[entry.as_dict() for entry in entries],
        cursor=entries[-1].id if entries else cursor,
        status=state,
        done=done,
    )
    return JSONResponse(page.model_dump(mode="json"))
