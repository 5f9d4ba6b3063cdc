"""vLLM's routes for pooling models, run as jobs on the shared queue: `/v1/embeddings`, `/pooling`,
`/classify`, `/score` and `/v1/score`, `/rerank`, `/v1/rerank` and `/v2/rerank`.

A request, however many inputs it gives, is one job of its model's queue, admitted as any job is
(tenants' limits and fair share, the queue's bound, priority); its worker answers it with vLLM's own
serving code, and the route answers that answer whole, as vLLM's server would have (its errors in
vLLM's OpenAI shape). The job is named in `X-Streampool-Job-Id`, and can be read through the native
API; a client that leaves before the answer cancels it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.pooling import (
    CLASSIFY_PATH,
    EMBEDDINGS_PATH,
    POOLING_PATH,
    RERANK_PATHS,
    SCORE_PATHS,
    ClassifyBody,
    EmbeddingsBody,
    PoolingBody,
    PoolingRouteBody,
    RerankBody,
    ScoreBody,
)
from gateway.deadlines import header_deadline
from gateway.deps import Services, ServicesDep
from gateway.generation import JOB_ID_HEADER, JobRun
from gateway.routes.openai import ERRORS, OpenAIErrors, OpenAIRoute
from shared.errors import EngineError, StreampoolError
from shared.pooling import POOLING_ERROR_STATUS


class PoolingErrors(OpenAIErrors):
    """OpenAI's shape, as vLLM's server answers; a refusal of vLLM's pooling code (the job's error names
    vLLM's error type: `POOLING_ERROR_STATUS`) as vLLM's server answers it: its `ErrorResponse`, whose
    `type` is the error's and `code` the status."""

    def failure(self, exc: StreampoolError) -> tuple[int, dict[str, Any]]:
        kind = exc.detail.get("code")
        if not isinstance(exc, EngineError) or kind not in POOLING_ERROR_STATUS:
            return super().failure(exc)
        status = POOLING_ERROR_STATUS[kind]
        return status, {"error": {"message": exc.message, "type": kind, "param": None, "code": status}}


POOLING_ERRORS = PoolingErrors()


class PoolingAPIRoute(OpenAIRoute):
    error_shape = POOLING_ERRORS


router = APIRouter(
    tags=["pooling"], dependencies=[REQUIRE_KEY], responses=ERRORS, route_class=PoolingAPIRoute
)


async def answer(body: PoolingBody, request: Request, owner: str, services: Services) -> Response:
    """Refusals (a model that does not serve the route, too many inputs or tokens, a full queue, a
    tenant at a limit) are answered before any job is made; then the job's answer, once it has one. Its
    wait in the queue is bounded as on every route (`X-Streampool-Deadline`: `gateway.deadlines`)."""
    with services.hold_reader(owner):
        deadline = header_deadline(request.headers, services.settings)
        submission = await services.admission.admit(
            body.job_request(), owner, model=body.model, deadline=deadline
        )
        result = await JobRun(services, submission.job_id, request).result()
    return JSONResponse(result.pooled, headers={JOB_ID_HEADER: submission.job_id})


@router.post(EMBEDDINGS_PATH, response_model=None)
async def embeddings(body: EmbeddingsBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """OpenAI's embeddings, as vLLM answers them for an embedding model: a text, texts, token ids or lists
    of them (or vLLM's conversations), one vector each in order, `float` or `base64`."""
    return await answer(body, request, owner, services)


@router.post(POOLING_PATH, response_model=None)
async def pooling(body: PoolingRouteBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """vLLM's pooling route: the pooler's output for each input."""
    return await answer(body, request, owner, services)


@router.post(CLASSIFY_PATH, response_model=None)
async def classify(body: ClassifyBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """vLLM's classification: each input's label and class probabilities."""
    return await answer(body, request, owner, services)


async def score(body: ScoreBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """vLLM's scores: one for each pair of inputs."""
    return await answer(body, request, owner, services)


async def rerank(body: RerankBody, request: Request, owner: Owner, services: ServicesDep) -> Response:
    """vLLM's reranking (Jina's and Cohere's shape): the documents by their relevance to the query."""
    return await answer(body, request, owner, services)


for path in SCORE_PATHS:
    router.add_api_route(path, score, methods=["POST"], response_model=None)
for path in RERANK_PATHS:
    router.add_api_route(path, rerank, methods=["POST"], response_model=None)
