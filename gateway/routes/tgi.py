"""text-generation-inference's API: `POST /generate`, `POST /generate_stream`, `POST /`, `GET /info`.

Jobs go through the same queue, streams and cancel keys as the native API; a client
that leaves before the end cancels its job. Every answer names its job in a header.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncGenerator
from contextlib import aclosing
from importlib.metadata import version
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from pydantic_core import to_json
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat import tgi
from gateway.deadlines import header_deadline
from gateway.deps import Services, ServicesDep
from gateway.errors import ErrorShape, ShapedRoute, documented
from gateway.generation import JOB_ID_HEADER, JobRun, event_source, keep_alive
from gateway.relay.streamed_answer import streamed_answer
from shared.errors import BackendUnavailable, InvalidRequest, PromptTooLong, StreampoolError


class TGIErrors(ErrorShape):
    """Streampool's own shape, but a prompt too long for the context is invalid input (422):
    TGI checks the input length as part of validation."""

    def failure(self, exc: StreampoolError) -> tuple[int, dict[str, Any]]:
        if isinstance(exc, PromptTooLong):
            exc = InvalidRequest(exc.message, **exc.detail)
        return super().failure(exc)


class TGIRoute(ShapedRoute):
    error_shape = TGIErrors()


router = APIRouter(
    tags=["tgi"], dependencies=[REQUIRE_KEY], responses=documented(401, 503), route_class=TGIRoute
)

# As TGI: 422 for any invalid input (a prompt too long for the context included).
GENERATION_ERRORS: dict[int | str, dict[str, Any]] = {
    **documented(400, 413, 422, 429, 504),
    424: {"model": tgi.ErrorResponse, "description": "generation failed"},
    500: {"model": tgi.ErrorResponse, "description": "the job was cancelled before it ended"},
}
STREAM = {
    "text/event-stream": {
        "schema": {"type": "string", "description": "one event per token; the last has `generated_text`"}
    }
}


def _json(content: BaseModel | list[BaseModel], status_code: int, job_id: str) -> Response:
    # pydantic writes a -inf logprob as null; the json module would refuse it.
    return Response(
        to_json(content, inf_nan_mode="null"),
        status_code=status_code,
        media_type="application/json",
        headers={JOB_ID_HEADER: job_id},
    )


async def _submit(
    services: Services, body: tgi.GenerateRequest, request: Request, owner: str, *, stream: bool
) -> JobRun:
    """Invalid input, a prompt too long and no known model are all answered before a job is made. TGI
    serves one model: the gateway's default one (or the only one it knows)."""
    job = body.job_request(services.settings.max_tokens_limit, stream=stream)
    try:
        submission = await services.admission.admit(
            job, owner, deadline=header_deadline(request.headers, services.settings)
        )
    except InvalidRequest as exc:
        raise body.in_own_terms(exc) from exc
    return JobRun(services, submission.job_id, request)


async def _generate(
    services: Services, body: tgi.GenerateRequest, request: Request, owner: str, *, listed: bool
) -> Response:
    """The whole answer; TGI's `POST /` lists it, as the Inference API did."""
    with services.hold_reader(owner):
        run = await _submit(services, body, request, owner, stream=False)
        try:
            result = await run.result()
        except StreampoolError as exc:
            # The job failed after it was accepted: answered with TGI's status for the failure.
            answer, status = tgi.error(exc.message, exc.error_type)
            return _json(answer, status, run.job_id)
    first = result.first  # TGI's routes ask for one choice
    generation = tgi.generated(
        body, first.text, first.logprobs, first.finish_reason, result.usage.completion_tokens
    )
    return _json([generation] if listed else generation, 200, run.job_id)


def _token_events(
    services: Services, run: JobRun, body: tgi.GenerateRequest
) -> AsyncGenerator[ServerSentEvent, None]:
    """The job's tokens as TGI events, each sent once no event at hand shows it to be the last; a
    failure ends them with the tokens held back and TGI's error message (`streamed_answer`)."""
    tokens = tgi.TokenStream(body)

    def failed(exc: StreampoolError) -> list[ServerSentEvent]:
        messages = [*tokens.flush(), tgi.error(exc.message, exc.error_type)[0]]
        return [ServerSentEvent(data=message.model_dump_json()) for message in messages]

    return streamed_answer(_tokens(run, tokens), failed, services.metrics)


async def _tokens(run: JobRun, tokens: tgi.TokenStream) -> AsyncGenerator[ServerSentEvent, None]:
    """`_token_events`' events and keep-alives, a failure raised."""
    async with aclosing(tgi.with_lookahead(run.events())) as events:
        async for event, next_at_hand in events:
            if event is None:
                yield keep_alive()
                continue
            messages = tokens.feed(event)
            if not next_at_hand:
                messages += tokens.flush()
            for message in messages:
                yield ServerSentEvent(data=message.model_dump_json())


async def _stream(
    services: Services, body: tgi.GenerateRequest, request: Request, owner: str
) -> EventSourceResponse:
    with services.hold_reader(owner) as hold:
        run = await _submit(services, body, request, owner, stream=True)
        return event_source(run, _token_events(services, run, body), hold.hand_over())


@router.post(
    "/generate",
    response_model=None,
    responses={200: {"model": tgi.GenerateResponse | tgi.DetailedResponse}, **GENERATION_ERRORS},
)
async def generate(
    body: tgi.GenerateRequest, request: Request, owner: Owner, services: ServicesDep
) -> Response:
    """Generate, and answer once with the whole text (and `details` when asked for)."""
    return await _generate(services, body, request, owner, listed=False)


@router.post(
    "/generate_stream",
    response_model=None,
    responses={200: {"content": STREAM}, **GENERATION_ERRORS},
)
async def generate_stream(
    body: tgi.GenerateRequest, request: Request, owner: Owner, services: ServicesDep
) -> EventSourceResponse:
    """Generate, streaming one Server-Sent Event per token; the last carries the whole text."""
    return await _stream(services, body, request, owner)


@router.post(
    "/",
    response_model=None,
    responses={
        200: {"model": list[tgi.GenerateResponse | tgi.DetailedResponse], "content": STREAM},
        **GENERATION_ERRORS,
    },
)
async def compat_generate(
    body: tgi.GenerateRequest, request: Request, owner: Owner, services: ServicesDep
) -> Response:
    """`/generate_stream` or `/generate` by the body's `stream` flag: where `InferenceClient(url)` posts."""
    if body.stream:
        return await _stream(services, body, request, owner)
    return await _generate(services, body, request, owner, listed=True)


@router.get("/info")
async def info(services: ServicesDep) -> tgi.Info:
    """The served model (TGI serves one: the default one), its dtype and context from its workers'
    heartbeats (or, while none is live, from what the last one announced); the gateway's own limits."""
    catalog = await services.admission.catalog()
    model = catalog.resolve(None, services.admission.default_model).model
    serving = [worker for worker in await services.admission.live_workers() if worker.model == model]
    max_total_tokens = min((worker.max_model_len for worker in serving), default=None)
    max_total_tokens = max_total_tokens or catalog.entries[model].max_model_len
    if max_total_tokens is None:
        raise BackendUnavailable(f"no worker of model {model} has announced its context yet")
    dtypes = Counter(worker.dtype for worker in serving if worker.dtype is not None)
    settings = services.settings
    return tgi.Info(
        model_id=model,
        model_dtype=dtypes.most_common(1)[0][0] if dtypes else tgi.UNKNOWN_DTYPE,
        max_concurrent_requests=settings.max_queued_jobs or None,
        max_input_tokens=max_total_tokens - 1,
        max_input_length=max_total_tokens - 1,
        max_total_tokens=max_total_tokens,
        max_new_tokens=settings.max_tokens_limit,
        version=version("streampool"),
        workers=len(serving),
    )
