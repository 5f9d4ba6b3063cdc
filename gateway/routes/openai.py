"""OpenAI-compatible completions and chat completions, run as jobs on the shared queue.

They answer as vLLM's OpenAI server does, and name the job in `X-Streampool-Job-Id`
so that it can also be followed, replayed or cancelled through the native API.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.openai import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    Answer,
    ChatBody,
    ChatCompletionResponse,
    ChunkStream,
    CompletionBody,
    CompletionResponse,
    check_model,
    completion,
)
from gateway.deps import Services, ServicesDep
from gateway.errors import documented, openai_error
from gateway.generation import JOB_ID_HEADER, JobRun, raise_for_failure
from gateway.metrics import GatewayMetrics
from shared.errors import StreampoolError
from shared.workers import live_workers

# A failed job answers 410 when it was cancelled through the native API while its client waited.
# Every 4xx has OpenAI's shape, validation errors included: "4XX" keeps FastAPI from listing its own 422.
ERRORS = {
    **documented(400, 401, 404, 410, 413, 429, 503, openai=True),
    "4XX": documented(400, openai=True)[400] | {"description": "any other client error"},
}
STREAM = {"text/event-stream": {"schema": {"type": "string", "description": "chunks, then [DONE]"}}}

router = APIRouter(tags=["openai"], dependencies=[REQUIRE_KEY], responses=ERRORS)


@router.post(
    COMPLETIONS_PATH,
    response_model=None,
    responses={200: {"model": CompletionResponse, "content": STREAM}},
)
async def completions(
    body: CompletionBody, request: Request, owner: Owner, services: ServicesDep
) -> Response:
    """OpenAI's (legacy) text completion: one prompt, one choice."""
    return await _answer(body, request, owner, services)


@router.post(
    CHAT_COMPLETIONS_PATH,
    response_model=None,
    responses={200: {"model": ChatCompletionResponse, "content": STREAM}},
)
async def chat_completions(body: ChatBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """OpenAI's chat completion: the messages rendered with the model's chat template."""
    return await _answer(body, request, owner, services)


async def _answer(
    body: CompletionBody | ChatBody, request: Request, owner: str, services: Services
) -> Response:
    """Refusals, a prompt too long, an unknown model, a full queue and a lost Redis are all answered
    before the job runs."""
    job = body.job_request(services.settings.max_tokens_limit)
    await services.prompt_limit.check(job)
    check_model(body.model, {worker.model for worker in await live_workers(services.redis, services.keys)})
    run = await JobRun.submit(services, job, owner)
    answer = Answer(chat=body.chat, job_id=run.job_id, model=body.model, created=int(time.time()))
    headers = {JOB_ID_HEADER: run.job_id}
    if body.stream:
        frames = _frames(run, ChunkStream(answer, body.include_usage), services.metrics)
        return EventSourceResponse(frames, headers=headers, ping=services.settings.sse_ping_seconds)
    result = await run.result(request)
    logprobs = result.logprobs if job.logprobs is not None else None
    return JSONResponse(
        completion(answer, result.text, logprobs, result.finish_reason, result.usage), headers=headers
    )


def _frame(data: dict[str, Any]) -> ServerSentEvent:
    # Only `data:` lines, as OpenAI streams them: no `event:` or `id:` fields.
    return ServerSentEvent(data=json.dumps(data))


async def _frames(
    run: JobRun, chunks: ChunkStream, metrics: GatewayMetrics
) -> AsyncIterator[ServerSentEvent]:
    """The answer's chunks then `[DONE]`; a failure ends it as an `error` chunk, never a silent close.

    Closing this generator early (the client went away) closes the job's events, which cancels the job.
    """
    metrics.streams_open.inc()
    try:
        async with aclosing(run.events()) as events:
            async for event in events:
                raise_for_failure(event)
                for chunk in chunks.feed(event):
                    yield _frame(chunk)
    except StreampoolError as exc:
        yield _frame(openai_error(exc)[1])
    finally:
        metrics.streams_open.dec()
    yield ServerSentEvent(data="[DONE]")
