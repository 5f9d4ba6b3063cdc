"""OpenAI's Responses API with background mode, a response being one job on the shared queue.

A background response is the job API under OpenAI's names: created at once, polled, followed and
resumed by `sequence_number` (`gateway.compat.responses_answers`) through any gateway for as long as the
retention lasts, and cancelled. A response in the foreground is answered as the chat route answers:
its client waits (or streams) and its job is cancelled if the client goes away; as on OpenAI it
cannot be cancelled through the API, nor streamed again. Everything is under the API key that
created the response (404 for any other); a response made with `store: false` cannot be read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.openai_answers import item_list
from gateway.compat.responses_answers import (
    RESPONSE_PREFIX,
    Head,
    ResponseEvents,
    Standing,
    deleted,
    error_event,
    logprob_object,
    response_object,
)
from gateway.compat.responses_bodies import RESPONSES_PATH, ResponsesBody, Stored
from gateway.deadlines import header_deadline
from gateway.deps import Services, ServicesDep, prefixed_job_id
from gateway.generation import JOB_ID_HEADER, HeldEventSource, JobRun, keep_alive
from gateway.relay.cursors import START
from gateway.relay.entries import Entry
from gateway.relay.following import IDLE_SECONDS, Following
from gateway.relay.open_streams import NOT_HELD, Hold, StreamLimits
from gateway.relay.streamed_answer import streamed_answer
from gateway.routes.openai import ERRORS, OPENAI_ERRORS, SEPARATOR, STREAM, OpenAIRoute, ignored_fields_header
from shared.errors import (
    DeadlineExceeded,
    EngineError,
    InvalidRequest,
    JobCancelled,
    JobNotFound,
    Overloaded,
    PromptTooLong,
    StreampoolError,
)
from shared.events import JobState, event_adapter
from shared.requests import ChatMessage
from shared.webhooks import RESPONSE_API

CANCEL_WAIT_SECONDS = 10.0
"""How long a cancel waits for a running response to end (a worker ends it within two decoding
steps) so that it can answer with the Response `cancelled`, as OpenAI's does."""

router = APIRouter(
    prefix=RESPONSES_PATH,
    tags=["responses"],
    dependencies=[REQUIRE_KEY],
    responses=ERRORS,
    route_class=OpenAIRoute,
)

ResponseIdPath = Annotated[str, Path(description="resp_ and the job's 32 lowercase hex digits")]


async def owned_response(
    response_id: ResponseIdPath, owner: Owner, services: ServicesDep
) -> tuple[str, Stored]:
    """The response's job id and stored fields, once it is known to be the caller's and stored."""
    job_id = prefixed_job_id(response_id, RESPONSE_PREFIX)
    missing = JobNotFound(f"Response with id '{response_id}' not found.")
    if job_id is None:
        raise missing
    try:
        await services.store.check_owner(job_id, owner)
        stored = Stored.of_annotations(await services.store.annotations(job_id))
    except JobNotFound:
        raise missing from None
    if stored is None or not stored.store:
        raise missing
    return job_id, stored


OwnedResponse = Annotated[tuple[str, Stored], Depends(owned_response)]


async def _previous(
    response_id: str | None, owner: str, services: Services
) -> tuple[str | None, tuple[ChatMessage, ...]]:
    """The job of the response `previous_response_id` names, and the conversation it ended (read back
    turn by turn: each turn's record holds its own input and output alone)."""
    if response_id is None:
        return None, ()
    job_id, _ = await owned_response(response_id, owner, services)
    record = await services.store.record(job_id)
    if not record.status.terminal:
        raise InvalidRequest(
            f"previous_response_id: response {response_id} has not finished", param="previous_response_id"
        )
    try:
        return job_id, await services.store.conversation(job_id)
    except JobNotFound as exc:
        gone = RESPONSE_PREFIX + exc.detail["job_id"]
        raise JobNotFound(
            f"Previous response with id '{gone}' not found: the conversation of {response_id} goes "
            "back to it, and it was deleted or its retention ended.",
            param="previous_response_id",
        ) from exc
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"previous_response_id: {exc.message}", param="previous_response_id", code="invalid_value"
        ) from exc


def _written_at(entry: Entry) -> float:
    """When an entry's step was sent (its `at`, milliseconds); now for an entry that predates `at`.
    Not its stream id: that is the event's seq."""
    return int(entry.at) / 1000 if entry.at else time.time()


def _frame(event: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(event), event=event["type"], sep=SEPARATOR)


def _frames(
    entries: AsyncGenerator[Entry | None, None], events: ResponseEvents, after: int, services: Services
) -> AsyncGenerator[ServerSentEvent, None]:
    """The response events of the job's entries numbered past `after`, and a keep-alive for each
    silence (None); a failure of the stream itself (not of the job) ends it with an `error` event
    numbered after the last one sent (`streamed_answer`)."""
    last = after

    async def frames() -> AsyncGenerator[ServerSentEvent, None]:
        nonlocal last
        async with aclosing(entries):  # closing a foreground run's entries early cancels its job
            async for entry in entries:
                if entry is None:
                    yield keep_alive(SEPARATOR)
                    continue
                for event in events.feed(event_adapter.validate_json(entry.data), _written_at(entry)):
                    if event["sequence_number"] > after:
                        last = event["sequence_number"]
                        yield _frame(event)

    def failed(exc: StreampoolError) -> list[ServerSentEvent]:
        code = OPENAI_ERRORS.failure(exc)[1]["error"]["code"]
        return [_frame(error_event(exc.message, code, last + 1))]

    return streamed_answer(frames(), failed, services.metrics)


async def _followed(services: Services, following: Following) -> AsyncGenerator[Entry | None, None]:
    """The job's entries from its first, to its end or until the gateway stops (then the client
    resumes elsewhere with `starting_after`), and None after each `sse_ping_seconds` of silence;
    leaving leaves the job running."""
    with services.relay.open_streams.open(following):
        async with aclosing(following.batches(services.settings.sse_ping_seconds)) as batches:
            async for batch in batches:
                if not batch:
                    yield None
                for entry in batch:
                    yield entry


async def _forgetting(
    services: Services, job_id: str, entries: AsyncGenerator[Entry | None, None]
) -> AsyncGenerator[Entry | None, None]:
    """The entries of a response made with `store: false`, whose job is deleted once they end."""
    try:
        async with aclosing(entries):
            async for entry in entries:
                yield entry
    finally:
        await asyncio.shield(_forget(services, job_id))


async def _forget(services: Services, job_id: str) -> None:
    """Delete a `store: false` response's job (its input and output) once its answer is given, as
    OpenAI keeps no such response. One cancelled as its client left ends within two decoding steps:
    waited for, a bounded time, under its answer's hold (past it, the job goes when its retention ends)."""
    with contextlib.suppress(JobNotFound):
        try:
            await services.store.delete(job_id)
        except InvalidRequest:  # still running: its end is on the way
            await _until_ended(services, job_id)
            with contextlib.suppress(InvalidRequest):
                await services.store.delete(job_id)


def _stream(
    head: Head, entries: AsyncGenerator[Entry | None, None], after: int, services: Services, hold: Hold
) -> EventSourceResponse:
    """The response's events as Server-Sent Events; its keep-alives are `_frames`' own."""
    if not head.stored.store:
        entries = _forgetting(services, head.job_id, entries)
    return HeldEventSource(
        _frames(entries, ResponseEvents(head), after, services),
        hold,
        headers={JOB_ID_HEADER: head.job_id},
        ping=0,
        sep=SEPARATOR,
    )


@router.post("", response_model=None, responses={200: {"content": STREAM}})
async def create_response(
    body: ResponsesBody, request: Request, owner: Owner, services: ServicesDep
) -> Response:
    """Create a response: queued and answered at once with `background`, else waited for (or streamed)."""
    with services.hold_reader(owner) if body.stream or not body.background else NOT_HELD as hold:
        return await _created(body, request, owner, services, hold)


async def _created(
    body: ResponsesBody, request: Request, owner: str, services: Services, hold: Hold
) -> Response:
    """`create_response` once its reader's place (if it holds its connection open) is held."""
    body.refuse_unsupported()
    previous, earlier = await _previous(body.previous_response_id, owner, services)
    job = body.job_request(services.settings.max_tokens_limit)
    stored = body.stored(job)
    background = stored.background
    try:
        webhook = services.webhook_targets.annotations(owner, body.webhook, RESPONSE_API)
        submission = await services.admission.admit(
            job,
            owner,
            model=body.model,
            annotations={**stored.annotations(), **webhook},
            fill_context=body.max_output_tokens is None,  # as OpenAI: bounded by the context alone
            turn=body.turn(previous, earlier),
            deadline=header_deadline(request.headers, services.settings),
        )
    except InvalidRequest as exc:
        raise body.in_own_terms(exc) from exc
    head = Head(submission.job_id, submission.created_at.timestamp(), stored)
    headers = {JOB_ID_HEADER: head.job_id, **ignored_fields_header(body.ignored_fields)}
    if body.stream:
        if background:
            following = services.relay.follow(head.job_id, START)
            entries = _followed(services, following)
        else:
            entries = JobRun(services, head.job_id, request).entries()
        streamed = _stream(head, entries, -1, services, hold.hand_over())
        streamed.headers.update(headers)
        return streamed
    if background:
        return JSONResponse(response_object(head, Standing("queued")), headers=headers)
    logprobs = None
    try:
        # The record says how it ended.
        with contextlib.suppress(JobCancelled, EngineError, PromptTooLong, DeadlineExceeded):
            result = await JobRun(services, head.job_id, request).result()
            if stored.output_logprobs:  # the record does not keep them: the job's events do
                logprobs = [logprob_object(logprob, stored.top_logprobs) for logprob in result.first.logprobs]
        record = await services.store.record(head.job_id)
    finally:
        if not stored.store:
            await asyncio.shield(_forget(services, head.job_id))
    return JSONResponse(response_object(head, Standing.of_record(record, logprobs)), headers=headers)


@router.get("/{response_id}", response_model=None, responses={200: {"content": STREAM}})
async def get_response(
    owned: OwnedResponse,
    owner: Owner,
    services: ServicesDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0, le=2**53)] = None,
) -> Response:
    """The Response as it stands; with `stream`, a background response's events after
    `starting_after` (from its first without), then live to its end."""
    job_id, stored = owned
    record = await services.store.record(job_id)
    head = Head(job_id, record.created_at.timestamp(), stored)
    if not stream:
        return JSONResponse(response_object(head, Standing.of_record(record)))
    if not stored.background:
        raise InvalidRequest(
            "This response cannot be streamed because it was not created with background=true.",
            param="stream",
        )
    # 410 once the stream's start is trimmed away; 429 past the reader limits
    following, hold = await services.relay.open(job_id, START, owner, StreamLimits.of(services.settings))
    after = -1 if starting_after is None else starting_after
    return _stream(head, _followed(services, following), after, services, hold)


async def _until_ended(services: Services, job_id: str) -> None:
    """Wait (a bounded time) for the job's terminal event."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CANCEL_WAIT_SECONDS):
            async with aclosing(services.relay.follow(job_id, START).batches(IDLE_SECONDS)) as batches:
                async for batch in batches:
                    if batch and batch[-1].terminal:
                        return


async def _until_cancelled(services: Services, job_id: str, owner: str) -> None:
    """Wait for a cancelled job's end, holding a reader's place; at the reader limits the cancel is
    answered at once instead, with the response as it stands (its end on the way)."""
    try:
        hold = services.hold_reader(owner)
    except Overloaded:
        return
    with hold:
        await _until_ended(services, job_id)


@router.post("/{response_id}/cancel")
async def cancel_response(owned: OwnedResponse, owner: Owner, services: ServicesDep) -> JSONResponse:
    """Cancel a background response; idempotent, and a finished one is answered as it is."""
    job_id, stored = owned
    if not stored.background:
        raise InvalidRequest("Only responses created with background=true can be cancelled.", param=None)
    answer, took_effect = await services.store.cancel(job_id)
    if took_effect and answer.status is JobState.running:
        await _until_cancelled(services, job_id, owner)
    record = await services.store.record(job_id)
    head = Head(job_id, record.created_at.timestamp(), stored)
    return JSONResponse(response_object(head, Standing.of_record(record)))


@router.delete("/{response_id}")
async def delete_response(owned: OwnedResponse, services: ServicesDep) -> JSONResponse:
    """Delete a finished response (its job's keys) before its retention ends; a queued or running one
    is refused, as a worker may write to it yet: cancel it first."""
    job_id, _ = owned
    try:
        await services.store.delete(job_id)
    except InvalidRequest as exc:
        raise InvalidRequest(f"Response {RESPONSE_PREFIX}{job_id} has not finished: cancel it first") from exc
    return JSONResponse(deleted(job_id))


@router.get("/{response_id}/input_items")
async def list_input_items(
    owned: OwnedResponse,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[str | None, Query(max_length=256)] = None,
) -> JSONResponse:
    """The response's input items, OpenAI's list page."""
    job_id, stored = owned
    items = stored.input_items(job_id, await services.store.own_messages(job_id))
    return JSONResponse(item_list(items, limit, order == "asc", after))
