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
