"""vLLM's pooling routes on an in-process gateway, with no worker: the default model's card stands for a
generating pool, and the same card, said to be a pooling pool's (`--convert embed`), for an embedding
model; a stand-in worker ends a job with the answer a worker would give. What vLLM's own server answers
is held against streampool's in tests/e2e/test_pooling.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.events import DoneEvent, ErrorEvent, Event, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from tests.conftest import make_settings
from tests.gateway.stand_ins import CARD_MODEL, WORKER, StandInWorker
from tests.helpers import eventually
from tests.redis_cleanup import delete_prefix

EMBEDDER = "smollm2-embed"
MAX_INPUTS = 4
MAX_TOKENS = 64
SERVED = ["embeddings", "pooling", "score", "rerank"]  # what vLLM serves for a causal LM with --convert embed
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "/v1/embeddings": ("embeddings", {"input": ["a", "b"]}),
    "/pooling": ("pooling", {"input": "a"}),
    "/score": ("score", {"queries": "q", "documents": ["a", "b"]}),
    "/v1/score": ("score", {"text_1": "q", "text_2": ["a", "b"]}),
    "/rerank": ("rerank", {"query": "q", "documents": ["a", "b"]}),
    "/v1/rerank": ("rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1}),
    "/v2/rerank": ("rerank", {"query": "q", "documents": ["a", "b"]}),
}


@pytest.fixture
async def settings(redis_url: str) -> AsyncIterator[Settings]:
    settings = make_settings(
        redis_url,
        allow_unauthenticated=True,
        models=[EMBEDDER],
        max_pooling_inputs=MAX_INPUTS,
        max_pooling_tokens=MAX_TOKENS,
    )
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture
async def store(settings: Settings, redis_client: aioredis.Redis) -> JobStore:
    return JobStore(redis_client, Keys.of(settings), settings)


@pytest.fixture
async def embedder(card: ModelCard, published: ModelCard, store: JobStore) -> ModelCard:
    """The default model's card as a pooling pool of it publishes it, beside the generating pool's."""
    pooling = card.model_copy(update={"model": EMBEDDER, "generates": False, "pooling_routes": SERVED})
    await publish_model_card(store.redis, store.keys, pooling)
    return pooling


async def _jobs(store: JobStore) -> dict[str, dict[str, Any]]:
    """Every job's request, by id."""
    jobs = {}
    async for key in store.redis.scan_iter(store.keys.job("*"), _type="hash"):
        if (request := await store.redis.hget(key, "request")) is not None:
            jobs[str(key).rpartition(":")[2]] = json.loads(request)
    return jobs


async def _answer_with(store: JobStore, job_id: str, result: dict[str, Any]) -> None:
    """End the job as its worker would: one `done` event carrying the answer."""
    usage = Usage(prompt_tokens=3, completion_tokens=0)
    done = DoneEvent(seq=2, finish_reason="stop", usage=usage, result=result)
    await _end(
        store, job_id, done, Outcome(JobState.completed, "", 0, usage, finish_reason="stop", result=result)
    )


async def _end(store: JobStore, job_id: str, terminal: Event, outcome: Outcome) -> None:
    await StandInWorker(store, job_id).start(EMBEDDER)
    await store.redis.execute_command(*store.finish_commands(job_id, WORKER, [terminal], outcome).record)


async def _asked(
    gateway: httpx.AsyncClient, store: JobStore, path: str, body: dict[str, Any]
) -> tuple[asyncio.Task[httpx.Response], str, dict[str, Any]]:
    """The request under way, and the one job it made, with its request."""
    asking = asyncio.create_task(gateway.post(path, json=body))
    jobs = await eventually(lambda: _jobs(store), f"{path}'s job is queued")
    assert len(jobs) == 1, jobs
    [(job_id, request)] = jobs.items()
    return asking, job_id, request


@pytest.mark.parametrize("path", list(ROUTES))
async def test_each_route_is_one_job_of_its_handler_answered_whole_with_its_result(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard, path: str
) -> None:
    route, inputs = ROUTES[path]
    body = {"model": EMBEDDER, **inputs, "truncate_prompt_tokens": -1}
    asking, job_id, request = await _asked(gateway, store, path, body)
    assert request["model"] == EMBEDDER
    assert request["pooling"] == {"route": route, "body": body, "inputs": 1 if route == "pooling" else 2}
    result = {"id": f"embd-{job_id}", "object": "list", "data": [{"index": 0}], "usage": {"prompt_tokens": 3}}
    await _answer_with(store, job_id, result)
    answer = await asyncio.wait_for(asking, 10)
    assert answer.status_code == 200, answer.text
    assert answer.json() == result
    assert answer.headers["X-Streampool-Job-Id"] == job_id
    record = (await gateway.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "completed"
    assert record["output"]["result"] == result  # the native API reads the answer too


async def test_a_request_names_the_canonical_model_to_its_worker_and_counts_token_lists_and_chats(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard
) -> None:
    """A list of token ids is one input, a list of lists one each; a conversation is one input, a list of
    them one each (vLLM's forms of `input`)."""
    forms: list[tuple[Any, int]] = [
        ([1, 2, 3], 1),
        ([[1, 2], [3], [4, 5]], 3),
        ("one", 1),
        ([{"role": "user", "content": "hi"}], 1),
        ([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "ho"}]], 2),
    ]
    for given, inputs in forms:
        asking, job_id, request = await _asked(
            gateway, store, "/v1/embeddings", {"input": given, "model": EMBEDDER}
        )
        assert request["pooling"]["inputs"] == inputs, given
        assert request["pooling"]["body"]["input"] == given
        await _answer_with(store, job_id, {"data": []})
        assert (await asyncio.wait_for(asking, 10)).status_code == 200
        await store.redis.delete(store.keys.job(job_id))


async def test_a_generation_for_the_pooling_model_and_embeddings_of_the_generating_one_are_400_with_no_job(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard
) -> None:
    generation = await gateway.post(
        "/v1/completions", json={"model": EMBEDDER, "prompt": "hi", "max_tokens": 2}
    )
    assert generation.status_code == 400, generation.text
    error = generation.json()["error"]
    assert error["param"] == "model"
    assert error["message"] == (
        f"model {EMBEDDER} does not generate: it is a pooling model (--runner pooling), and serves "
        "embeddings, pooling, score, rerank"
    )
    native = await gateway.post("/v1/jobs", json={"model": EMBEDDER, "prompt": "hi"})
    assert native.status_code == 422, native.text
    embeddings = await gateway.post("/v1/embeddings", json={"model": CARD_MODEL, "input": "hi"})
    assert embeddings.status_code == 400, embeddings.text
    assert embeddings.json()["error"]["message"] == (
        f"model {CARD_MODEL} does not answer embeddings requests: it is a generating model, and serves "
        "generation"
    )
    classify = await gateway.post("/classify", json={"model": EMBEDDER, "input": "hi"})
    assert classify.status_code == 400, classify.text
    assert "does not answer classify requests" in classify.json()["error"]["message"]
    assert await _jobs(store) == {}


async def test_too_many_inputs_or_tokens_are_refused_before_any_job(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard
) -> None:
    inputs = await gateway.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["a"] * (MAX_INPUTS + 1)})
    assert inputs.status_code == 400, inputs.text
    assert inputs.json()["error"]["param"] == "input"
    assert (
        f"at most {MAX_INPUTS} inputs in one request, not {MAX_INPUTS + 1}"
        in inputs.json()["error"]["message"]
    )
    documents = await gateway.post(
        "/rerank", json={"model": EMBEDDER, "query": "q", "documents": ["d"] * (MAX_INPUTS + 1)}
    )
    assert documents.status_code == 400 and documents.json()["error"]["param"] == "documents"
    long = "lighthouse keeper " * MAX_TOKENS
    tokens = await gateway.post("/v1/embeddings", json={"model": EMBEDDER, "input": long})
    assert tokens.status_code == 400, tokens.text
    assert tokens.json()["error"]["code"] == "context_length_exceeded"
    assert f"one request may hold at most {MAX_TOKENS}" in tokens.json()["error"]["message"]
    native = await gateway.post(
        "/v1/jobs", json={"model": EMBEDDER, "pooling": {"route": "embeddings", "body": {"input": long}}}
    )
    assert native.status_code == 413, native.text
    truncated = [[1] * 40, [2] * 40]  # 80 tokens, of which truncation keeps 20 each
    kept = await gateway.post(
        "/v1/jobs",
        json={"model": EMBEDDER, "pooling": {"route": "embeddings", "body": {"input": truncated}}},
    )
    assert kept.status_code == 413, kept.text
    assert await _jobs(store) == {}
    body = {"input": truncated, "truncate_prompt_tokens": 20}
    kept = await gateway.post(
        "/v1/jobs", json={"model": EMBEDDER, "pooling": {"route": "embeddings", "body": body}}
    )
    assert kept.status_code == 202, kept.text


async def test_a_native_submission_of_a_pooling_job_is_checked_as_its_route_and_recounted(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard
) -> None:
    wrong = {"route": "rerank", "body": {"documents": ["a"]}}
    refused = await gateway.post("/v1/jobs", json={"model": EMBEDDER, "pooling": wrong})
    assert refused.status_code == 422, refused.text
    assert refused.json()["param"] == "query"
    miscounted = {"route": "rerank", "body": {"query": "q", "documents": ["a", "b", "c"]}, "inputs": 1}
    accepted = await gateway.post("/v1/jobs", json={"model": EMBEDDER, "pooling": miscounted})
    assert accepted.status_code == 202, accepted.text
    request = (await _jobs(store))[accepted.json()["id"]]
    assert request["pooling"]["inputs"] == 3
    assert request["pooling"]["body"]["model"] == EMBEDDER


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "a", "encoding_format": "bytes"}, "encoding_format"),
        ({"input": []}, None),
        ({"input": [1, "a"]}, "input"),
        ({"input": "a", "model": ""}, "model"),
    ],
)
async def test_an_embeddings_body_no_worker_could_answer_in_json_is_400_with_no_job(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard, body: dict[str, Any], param: str | None
) -> None:
    answer = await gateway.post("/v1/embeddings", json={"model": EMBEDDER, **body})
    assert answer.status_code == 400, answer.text
    if param is not None:
        assert answer.json()["error"]["param"] == param
    assert await _jobs(store) == {}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/rerank", {"query": "q", "documents": []}),
        ("/score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": "c"}),
    ],
    ids=["no-document", "two-to-three", "two-to-one"],
)
async def test_inputs_vllm_cannot_pair_are_400_with_no_job(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard, path: str, body: dict[str, Any]
) -> None:
    answer = await gateway.post(path, json={"model": EMBEDDER, **body})
    assert answer.status_code == 400, answer.text
    assert await _jobs(store) == {}


async def test_a_refusal_of_vllms_pooling_code_is_answered_as_vllms_server_answers_it(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard
) -> None:
    """The worker fails the job with vLLM's error type and message (tests/worker's pooling tests); the
    route answers vLLM's `ErrorResponse` with its status."""
    asking, job_id, _ = await _asked(
        gateway, store, "/v1/embeddings", {"model": EMBEDDER, "input": "a", "dimensions": 7}
    )
    message = f'Model "{EMBEDDER}" does not support matryoshka representation'  # vLLM's words
    usage = Usage(prompt_tokens=0, completion_tokens=0)
    error = ErrorEvent(seq=2, message=message, code="BadRequestError")
    await _end(store, job_id, error, Outcome(JobState.failed, "", 0, usage, error=message))
    answer = await asyncio.wait_for(asking, 10)
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    }


async def test_a_pooling_requests_wait_in_the_queue_is_bounded_by_its_deadline_header(
    gateway: httpx.AsyncClient, store: JobStore, embedder: ModelCard
) -> None:
    refused = await gateway.post(
        "/v1/embeddings", json={"model": EMBEDDER, "input": "a"}, headers={"X-Streampool-Deadline": "soon"}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Streampool-Deadline"
    assert await _jobs(store) == {}
    asking = asyncio.create_task(
        gateway.post(
            "/v1/embeddings", json={"model": EMBEDDER, "input": "a"}, headers={"X-Streampool-Deadline": "0.5"}
        )
    )
    answer = await asyncio.wait_for(asking, 30)  # no worker starts it: its deadline ends it
    assert answer.status_code == 504, answer.text
    assert answer.json()["error"]["code"] == "deadline_exceeded"
