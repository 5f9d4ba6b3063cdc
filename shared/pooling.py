"""Pooling requests as jobs: embeddings, pooling, classification, scores and reranking, as vLLM's server
answers them for a pooling model (`--runner pooling`, `--convert embed` / `classify`).

A pooling request is one job of its model's queue, however many inputs it holds. The job carries the
request's body as vLLM's protocol model of its route takes it (`PoolingJob`): the gateway checks what it
must before anything is written (the model serves the route, the bounds on inputs and tokens), and the
worker hands the body to vLLM's own serving code, whose answer is the job's result (`DoneEvent.result`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PoolingRoute = Literal["embeddings", "pooling", "classify", "score", "rerank"]
"""vLLM's pooling handlers: `/v1/embeddings`, `/pooling`, `/classify`, `/score` (and `/v1/score`),
`/rerank` (and `/v1/rerank`, `/v2/rerank`)."""

POOLING_ROUTES: tuple[PoolingRoute, ...] = ("embeddings", "pooling", "classify", "score", "rerank")


class PoolingJob(BaseModel):
    """What a pooling job asks its worker: vLLM's handler, and the request as that handler takes it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    route: PoolingRoute
    body: dict[str, Any] = Field(description="the request as vLLM's protocol model of the route takes it")
    inputs: int = Field(1, ge=1, description="its inputs (texts, token lists, documents), in order")


POOLING_ERROR_STATUS: dict[str, int] = {
    "BadRequestError": 400,
    "NotFoundError": 404,
    "UnprocessableEntityError": 422,
    "InternalServerError": 500,
    "NotImplementedError": 501,
    "ServiceUnavailableError": 503,
}
"""vLLM's error types (its `ErrorResponse`'s `error.type`) and the status its server answers each with.
A pooling job that vLLM refuses fails with its error event's `code` one of these, and vLLM's message."""


def usage_prompt_tokens(result: dict[str, Any]) -> int:
    """The prompt tokens a pooling answer's `usage` counts (a rerank's has `total_tokens` alone)."""
    usage = result.get("usage")
    if not isinstance(usage, dict):
        return 0
    counted = usage.get("prompt_tokens", usage.get("total_tokens"))
    return counted if isinstance(counted, int) else 0
