"""The pooling routes' bodies against vLLM's own request models: every form of every route's request, with
every field vLLM's model has (as vLLM's model fills them in), is taken by the gateway's body and reaches
the worker as a body vLLM's model reads the same; each counts its inputs as vLLM answers them (one vector,
score or result each)."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
from pydantic import TypeAdapter

from gateway.compat.pooling import BODIES, pooling_body
from shared.pooling import PoolingRoute

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
FORMS: list[tuple[PoolingRoute, dict[str, Any], int]] = [
    ("embeddings", {"input": "a text"}, 1),
    ("embeddings", {"input": ["one", "two", "three"], "encoding_format": "base64", "dimensions": 8}, 3),
    ("embeddings", {"input": [1, 2, 3], "truncate_prompt_tokens": 2}, 1),
    ("embeddings", {"input": [[1, 2], [3, 4], [5]]}, 3),
    ("embeddings", {"messages": CHAT}, 1),
    ("embeddings", {"messages": [CHAT, CHAT]}, 2),
    ("embeddings", {"input": CHAT}, 1),
    ("embeddings", {"input": [CHAT, CHAT, CHAT]}, 3),
    ("pooling", {"input": ["one", "two"], "task": "embed"}, 2),
    ("pooling", {"messages": CHAT}, 1),
    ("classify", {"input": ["one", "two"]}, 2),
    ("classify", {"messages": CHAT}, 1),
    ("score", {"queries": "q", "documents": ["a", "b"]}, 2),
    ("score", {"queries": ["q1", "q2"], "items": ["a", "b"]}, 2),
    ("score", {"data_1": "q", "data_2": "a"}, 1),
    ("score", {"text_1": "q", "text_2": ["a", "b", "c"]}, 3),
    ("score", {"queries": "q", "documents": {"content": [{"type": "text", "text": "a"}]}}, 1),
    ("rerank", {"query": "q", "documents": ["a", "b", "c"], "top_n": 2}, 3),
]


@functools.cache
def vllm_requests() -> dict[PoolingRoute, TypeAdapter[Any]]:
    """vLLM's request model of each route, as its server validates a body."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.entrypoints.pooling.classify.protocol import ClassificationRequest
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
        from vllm.entrypoints.pooling.pooling.protocol import PoolingRequest
        from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest
    return {
        "embeddings": TypeAdapter(EmbeddingRequest),
        "pooling": TypeAdapter(PoolingRequest),
        "classify": TypeAdapter(ClassificationRequest),
        "score": TypeAdapter(ScoreRequest),
        "rerank": TypeAdapter(RerankRequest),
    }


@pytest.mark.parametrize(("route", "form", "inputs"), FORMS)
def test_every_field_of_vllms_request_reaches_the_worker_as_vllm_reads_it(
    route: PoolingRoute, form: dict[str, Any], inputs: int
) -> None:
    adapter = vllm_requests()[route]
    full = adapter.validate_python({"model": "m", **form}).model_dump(mode="json")
    body = BODIES[route].model_validate(full)
    job = body.job_request()
    assert job.pooling is not None
    assert job.pooling.route == route
    assert job.pooling.inputs == inputs
    assert job.pooling.body == full
    assert adapter.validate_python(job.pooling.body).model_dump(mode="json") == full
    assert pooling_body(job.pooling).pieces() == body.pieces()
