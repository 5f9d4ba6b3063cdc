"""Resuming the stream of a kept OpenAI answer (a stored chat completion, or a request sent with
`X-Streampool-Keep-Running: true`), through any gateway, for as long as its job is retained.

`GET /v1/chat/completions/{id}/chunks?starting_after=N` (and `/v1/completions/{id}/chunks`) streams
the answer's chunks after its first N, in the framing of the original stream, then `[DONE]`: the
job's events are replayed from its start through the framing its request kept, and the first N chunks
made again are not sent, so that a client that had N chunks gets each of the others once. The id is the
chunks' `id` (`chatcmpl-...`, `cmpl-...`) or the job id of `X-Streampool-Job-Id`; another API key's,
or a job not kept, is 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sse_starlette import EventSourceResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.openai_bodies import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH
from gateway.deps import JOB_ID, Services, ServicesDep
from gateway.generation import JobRun, chunk_frames, event_source
from gateway.relay.cursors import START
from gateway.relay.open_streams import StreamLimits
from gateway.resumption import Framing
from gateway.routes.openai import ERRORS, SEPARATOR, STREAM, OpenAIRoute, stream_failure
from shared.errors import JobNotFound

router = APIRouter(tags=["openai"], dependencies=[REQUIRE_KEY], responses=ERRORS, route_class=OpenAIRoute)

CompletionId = Annotated[
    str, Path(description="the chunks' `id`, or the job id its answer named in `X-Streampool-Job-Id`")
]
StartingAfter = Annotated[
    int, Query(ge=0, le=2**53, description="how many chunks the client has, from the answer's first")
]
CHUNKS = "/{completion_id}/chunks"


@router.get(CHAT_COMPLETIONS_PATH + CHUNKS, response_model=None, responses={200: {"content": STREAM}})
async def resume_chat_completion(
    completion_id: CompletionId,
    request: Request,
    owner: Owner,
    services: ServicesDep,
    starting_after: StartingAfter = 0,
) -> EventSourceResponse:
    """A kept chat completion's stream, after its first `starting_after` chunks, live to its end."""
    return await resumed_stream(completion_id, request, owner, services, starting_after, chat=True)


@router.get(COMPLETIONS_PATH + CHUNKS, response_model=None, responses={200: {"content": STREAM}})
async def resume_completion(
    completion_id: CompletionId,
    request: Request,
    owner: Owner,
    services: ServicesDep,
    starting_after: StartingAfter = 0,
) -> EventSourceResponse:
    """A kept completion's stream, after its first `starting_after` chunks, live to its end."""
    return await resumed_stream(completion_id, request, owner, services, starting_after, chat=False)


async def resumed_stream(
    completion_id: str, request: Request, owner: str, services: Services, starting_after: int, *, chat: bool
) -> EventSourceResponse:
    """The stream of `owner`'s kept answer `completion_id` (a chat completion's if `chat`), after its
    first `starting_after` chunks; 404 for any other, 410 once its stream's start is no longer kept,
    429 past the reader limits."""
    kind = "chat completion" if chat else "completion"
    job_id = completion_id.removeprefix("chatcmpl-" if chat else "cmpl-")
    missing = JobNotFound(f"no {kind} {completion_id} kept running: only those can be resumed")
    if not JOB_ID.fullmatch(job_id):
        raise missing
    try:
        await services.store.check_owner(job_id, owner)
        framing = Framing.of_annotations(await services.store.annotations(job_id))
        record = await services.store.record(job_id)
    except JobNotFound:
        raise missing from None
    if framing is None or framing.chat != chat:
        raise missing
    following, hold = await services.relay.open(job_id, START, owner, StreamLimits.of(services.settings))
    run = JobRun(services, job_id, request, keep_running=True, following=following)
    chunks = framing.chunks(job_id, int(record.created_at.timestamp()))
    frames = chunk_frames(run, chunks.feed, stream_failure, SEPARATOR, starting_after)
    return event_source(run, frames, hold, sep=SEPARATOR)
