"""OpenAI-compatible completions and chat completions, run as jobs on the shared queue.

They answer as vLLM's OpenAI server does, and name the job in `X-Streampool-Job-Id`
so that it can also be followed, replayed or cancelled through the native API. A client that leaves
cancels its job, unless the chat completion is stored (`store: true`) or the request says
`X-Streampool-Keep-Running: true`: then the job runs to its end, and its stream can be resumed
(`gateway.routes.resume`). A body's fields that
neither OpenAI's API nor vLLM's defines are ignored, as vLLM ignores them, with a warning in the log,
and named in `X-Streampool-Ignored-Fields` (comma-separated; a nested one by its path, e.g.
`stream_options.x`), so that a client can see what had no effect.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.openai_answers import (
    ChatCompletionResponse,
    CompletionResponse,
    OpenAIErrorBody,
    error_object,
)
from gateway.compat.openai_bodies import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, ChatBody, CompletionBody
from gateway.compat.stored_chat import stored_annotations
from gateway.deadlines import header_deadline
from gateway.deps import Services, ServicesDep
from gateway.errors import STATUS_CODES, ErrorShape, ShapedRoute, documented_compatible, status_of
from gateway.generation import JOB_ID_HEADER, JobRun, chunk_frames, event_source, whole_answer
from gateway.relay.open_streams import Hold
from gateway.resumption import Framing, keeps_running
from gateway.stored_completions import StoredCompletions
from shared.errors import (
    InvalidRequest,
    JobCancelled,
    PromptTooLong,
    RateLimited,
    StreampoolError,
    Unauthorized,
)

log = logging.getLogger(__name__)

IGNORED_FIELDS_HEADER = "X-Streampool-Ignored-Fields"
MAX_IGNORED_NAMED = 32  # a body of thousands of unknown keys gets a header of bounded size
MAX_NAME_CHARS = 100


class OpenAIErrors(ErrorShape):
    """OpenAI's `{"error": {"message", "type", "param", "code"}}`, with OpenAI's statuses."""

    body_model = OpenAIErrorBody
    status_codes = {
        **STATUS_CODES,
        InvalidRequest: 400,  # OpenAI's status for a bad parameter, where the native API says 422
        PromptTooLong: 400,  # as vLLM answers it, with the numbers in the message
        JobCancelled: 410,  # cancelled through the native API while its client waited: not worth a retry
    }
    codes: dict[type[StreampoolError], str] = {
        PromptTooLong: "context_length_exceeded",
        Unauthorized: "invalid_api_key",
        RateLimited: "rate_limit_exceeded",  # OpenAI's; the message begins with the limit's name
    }

    def failure(self, exc: StreampoolError) -> tuple[int, dict[str, Any]]:
        """The body alone also ends a stream that failed."""
        status = status_of(exc, self.status_codes)
        code = exc.detail.get("code") or self.codes.get(type(exc), exc.error_type)
        return status, error_object(status, exc.message, exc.detail.get("param"), code)

    def invalid(
        self, message: str, where: str, error_type: str | None, errors: list[Any]
    ) -> tuple[int, dict[str, Any]]:
        param = where if where and error_type != "json_invalid" else None
        return 400, error_object(400, message, param, error_type)

    def refusal(self, status: int, message: str) -> dict[str, Any]:
        return error_object(status, message)


OPENAI_ERRORS = OpenAIErrors()


class OpenAIRoute(ShapedRoute):
    error_shape = OPENAI_ERRORS


# A failed job answers 410 when it was cancelled through the native API while its client waited.
ERRORS = documented_compatible(OPENAI_ERRORS)
STREAM = {"text/event-stream": {"schema": {"type": "string", "description": "chunks, then [DONE]"}}}

# OpenAI and vLLM end each line with "\n" alone; vLLM's benchmark client splits events on "\n\n" only.
SEPARATOR = "\n"

router = APIRouter(tags=["openai"], dependencies=[REQUIRE_KEY], responses=ERRORS, route_class=OpenAIRoute)


@router.post(
    COMPLETIONS_PATH,
    response_model=None,
    responses={200: {"model": CompletionResponse, "content": STREAM}},
)
async def completions(
    body: CompletionBody, request: Request, owner: Owner, services: ServicesDep
) -> Response:
    """OpenAI's (legacy) text completion: a prompt (or several), `n` choices each.

    Fields neither OpenAI's API nor vLLM's defines are ignored and named in the answer's
    `X-Streampool-Ignored-Fields` header."""
    return await _answer(body, request, owner, services)


@router.post(
    CHAT_COMPLETIONS_PATH,
    response_model=None,
    responses={200: {"model": ChatCompletionResponse, "content": STREAM}},
)
async def chat_completions(body: ChatBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """OpenAI's chat completion: the messages rendered with the model's chat template, with the tools
    offered; the answer carries the model's tool calls and reasoning where its pool parses them.

    Fields neither OpenAI's API nor vLLM's defines are ignored and named in the answer's
    `X-Streampool-Ignored-Fields` header."""
    return await _answer(body, request, owner, services)


async def _answer(
    body: CompletionBody | ChatBody, request: Request, owner: str, services: Services
) -> Response:
    """Refusals, a prompt too long, an unknown model, a full queue, a full gateway and a lost Redis are
    all answered before the job runs."""
    with services.hold_reader(owner) as hold:
        return await _answer_held(body, request, owner, services, hold)


async def _answer_held(
    body: CompletionBody | ChatBody, request: Request, owner: str, services: Services, hold: Hold
) -> Response:
    job = body.job_request(services.settings.max_tokens_limit)
    headers = ignored_fields_header(body.ignored_fields)
    prompt_tokens = None
    if body.stream_options is not None and body.stream_options.continuous_usage:
        target = await services.admission.resolve(body.model)
        prompt_tokens = await services.admission.prompt_limit.count(job, target.model)
    framing = Framing.of(body, prompt_tokens)
    keep_running = keeps_running(body, request.headers)
    stored = stored_annotations(body)
    annotations = framing.annotations() if keep_running else {}  # what a resumed stream is made with
    try:
        submission = await services.admission.admit(
            job,
            owner,
            model=body.model,
            fill_context=body.fills_context,
            annotations=annotations | stored,
            deadline=header_deadline(request.headers, services.settings),
        )
    except InvalidRequest as exc:
        raise body.in_own_terms(exc) from exc
    if stored:
        await StoredCompletions(services).add(owner, submission.job_id, submission.created_at.timestamp())
    run = JobRun(services, submission.job_id, request, keep_running=keep_running)
    created = int(submission.created_at.timestamp())  # the job's: a resumed stream's chunks say the same
    answer = framing.answer(run.job_id, created)
    if body.stream:
        chunks = framing.chunks(run.job_id, created)
        frames = chunk_frames(run, chunks.feed, stream_failure, SEPARATOR)
        response = event_source(run, frames, hold.hand_over(), sep=SEPARATOR)
        response.headers.update(headers)
        return response
    result = await run.result()
    return JSONResponse(
        whole_answer(body, job, answer, result), headers={JOB_ID_HEADER: run.job_id, **headers}
    )


def stream_failure(exc: StreampoolError) -> dict[str, Any]:
    """The chunk that ends a stream that failed: OpenAI's error body alone."""
    return OPENAI_ERRORS.failure(exc)[1]


def ignored_fields_header(ignored: list[str]) -> dict[str, str]:
    """The header naming the fields a body gave that nothing defines (its `ignored_fields`), logged once
    per request as vLLM logs them."""
    if not ignored:
        return {}
    # A header holds printable ASCII alone: any other character of a name goes escaped.
    names = [name[:MAX_NAME_CHARS].encode("unicode_escape").decode() for name in ignored]
    if len(names) > MAX_IGNORED_NAMED:
        names = [*names[:MAX_IGNORED_NAMED], f"and {len(names) - MAX_IGNORED_NAMED} more"]
    named = ", ".join(names)
    log.warning("fields no API defines, ignored: %s", named)
    return {IGNORED_FIELDS_HEADER: named}
