"""vLLM's scale-out routes for a text model: tokens in, tokens out (`POST /inference/v1/generate`), and
the render routes that turn a completion's or a chat's request into the requests it would take.

Generation runs as a job on the shared queue, as every route's does: admitted once (limits, tenant,
model), resumable, cancellable through the native API (`X-Streampool-Job-Id` names it), and cancelled
when its client goes away, as vLLM's server aborts the request. Rendering needs no worker: the
gateway answers with the model card, as `/tokenize`. Errors take vLLM's shape, whose `code` is the
HTTP status.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.generate_answers import (
    GenerateAnswer,
    GenerateChunks,
    GenerateTextResponse,
    GenerateTokensResponse,
    VllmErrorBody,
    vllm_error,
)
from gateway.compat.generate_bodies import GENERATE_PATH, GenerateBody
from gateway.compat.openai_bodies import ChatBody, CompletionBody
from gateway.compat.render import CHAT_RENDER_PATH, COMPLETIONS_RENDER_PATH, render_requests
from gateway.deadlines import header_deadline
from gateway.deps import Services, ServicesDep
from gateway.errors import ErrorShape, ShapedRoute, documented_compatible, status_of
from gateway.generation import JOB_ID_HEADER, JobRun, chunk_frames, event_source
from gateway.routes.openai import SEPARATOR, OpenAIErrors
from gateway.routes.vllm import model_counter
from shared.errors import InvalidRequest, StreampoolError

REQUEST_ID_HEADER = "X-Request-Id"  # as on vLLM's server: the base of the answer's request id


class VllmErrors(ErrorShape):
    """vLLM's `ErrorResponse`, with the statuses of OpenAI's routes (vLLM's own)."""

    body_model = VllmErrorBody
    status_codes = OpenAIErrors.status_codes

    def failure(self, exc: StreampoolError) -> tuple[int, dict[str, Any]]:
        status = status_of(exc, self.status_codes)
        return status, vllm_error(status, exc.message, exc.detail.get("param"))

    def invalid(
        self, message: str, where: str, error_type: str | None, errors: list[Any]
    ) -> tuple[int, dict[str, Any]]:
        return 400, vllm_error(400, message, where or None)

    def refusal(self, status: int, message: str) -> dict[str, Any]:
        return vllm_error(status, message)


VLLM_ERRORS = VllmErrors()


class VllmRoute(ShapedRoute):
    error_shape = VLLM_ERRORS


ERRORS = documented_compatible(VLLM_ERRORS)
STREAM = {"text/event-stream": {"schema": {"type": "string", "description": "chunks, then [DONE]"}}}
WHOLE = {"model": GenerateTokensResponse | GenerateTextResponse, "content": STREAM}

router = APIRouter(tags=["vllm"], dependencies=[REQUIRE_KEY], responses=ERRORS, route_class=VllmRoute)


@router.post(GENERATE_PATH, response_model=None, responses={200: WHOLE})
async def generate(body: GenerateBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """vLLM's tokens in, tokens out: exactly the given token ids reach the engine, and the answer gives
    the generated ids (and their text with `output_mode` "text"), whole or streamed."""
    with services.hold_reader(owner) as hold:
        job = body.job_request(services.settings.max_tokens_limit)
        target = await services.admission.resolve(body.model)
        try:
            submission = await services.admission.admit(
                job,
                owner,
                model=body.model,
                fill_context=body.fills_context,
                deadline=header_deadline(request.headers, services.settings),
            )
        except InvalidRequest as exc:
            raise body.in_own_terms(exc) from exc
        run = JobRun(services, submission.job_id, request)
        base_id = request.headers.get(REQUEST_ID_HEADER) or body.request_id or run.job_id
        answer = GenerateAnswer(
            request_id=f"generate-tokens-{base_id}",
            model=target.adapter or target.model,
            created=int(time.time()),
            text=body.output_mode == "text",
            logprobs=job.logprobs,
            prompt_token_ids=body.token_ids if body.return_token_ids else None,
        )
        if body.stream:
            chunks = GenerateChunks(answer, body.include_usage, body.continuous_usage, len(body.token_ids))
            frames = chunk_frames(run, chunks.feed, lambda exc: VLLM_ERRORS.failure(exc)[1], SEPARATOR)
            return event_source(run, frames, hold.hand_over(), sep=SEPARATOR)
        result = await run.result()
    choices = [
        (choice.token_ids, choice.text, choice.logprobs, choice.finish_reason, choice.stop_reason)
        for choice in result.choices
    ]
    return JSONResponse(answer.whole(choices, result.usage), headers={JOB_ID_HEADER: run.job_id})


@router.post(COMPLETIONS_RENDER_PATH, response_model=None, responses={200: {"model": list[GenerateBody]}})
async def render_completion(body: CompletionBody, request: Request, services: ServicesDep) -> Response:
    """The requests `/inference/v1/generate` takes for a completion: one per prompt, its token ids as
    the engine sees them, and the sampling parameters the completion runs with."""
    return JSONResponse(await _render(body, request, services))


@router.post(CHAT_RENDER_PATH, response_model=None, responses={200: {"model": GenerateBody}})
async def render_chat(body: ChatBody, request: Request, services: ServicesDep) -> Response:
    """The request `/inference/v1/generate` takes for a chat: the messages through the model's chat
    template, and the sampling parameters the chat runs with."""
    (rendered,) = await _render(body, request, services)
    return JSONResponse(rendered)


async def _render(
    body: CompletionBody | ChatBody, request: Request, services: Services
) -> list[dict[str, Any]]:
    """What a route of `body`'s kind checks before a job (refusals, limits, the context), then each
    prompt's tokens; 404 for an unknown model, 503 until a worker of it has published its model card."""
    limit = services.settings.max_tokens_limit
    job = body.job_request(limit)
    counter = await model_counter(services, body.model)
    try:
        services.admission.check_limits(job)
        target = await services.admission.resolve(body.model)
        job, _ = await services.admission.prompt_limit.check(
            job, target.model, fill=limit if body.fills_context else None
        )
    except InvalidRequest as exc:
        raise body.in_own_terms(exc) from exc
    # Megabytes of prompt take a while to encode: off the event loop.
    token_ids = (
        counter.token_ids(job) if job.quick_to_tokenize else await asyncio.to_thread(counter.token_ids, job)
    )
    base_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
    return render_requests(job, body, token_ids, base_id, counter.card.max_model_len)
