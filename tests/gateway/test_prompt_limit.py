"""Prompts too long for the context are refused by the gateway before any job is made.

The gateway runs in-process against the real Redis with the card of the real default model
published under the test's prefix, as a worker publishes it; no worker runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from shared.prompt_tokens import PromptCounter
from shared.requests import JobRequest
from tests.conftest import make_settings
from tests.gateway.stand_ins import CARD_CONTEXT as CONTEXT
from tests.helpers import eventually
from tests.redis_cleanup import delete_prefix

LONG = "The quick brown fox jumps over the lazy dog. " * 300  # about 3,000 tokens


@pytest.fixture
async def settings(redis_url: str) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, allow_unauthenticated=True)
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


async def _keys(redis_client: aioredis.Redis, settings: Settings) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=f"{settings.key_prefix}:*")}


async def test_a_prompt_over_the_context_is_413_with_the_numbers_and_creates_nothing(
    gateway: httpx.AsyncClient, published: ModelCard, redis_client: aioredis.Redis, settings: Settings
) -> None:
    before = await _keys(redis_client, settings)
    answer = await gateway.post("/v1/jobs", json={"prompt": LONG, "max_tokens": 16})
    assert answer.status_code == 413, answer.text
    body = answer.json()
    expected = PromptCounter(published).count(JobRequest(prompt=LONG))
    assert (body["error_type"], body["prompt_tokens"], body["max_tokens"], body["context_length"]) == (
        "prompt_too_long",
        expected,
        16,
        CONTEXT,
    )
    assert str(expected) in body["error"] and str(CONTEXT) in body["error"]
    assert await _keys(redis_client, settings) == before


@pytest.mark.parametrize(
    "request_body",
    [
        {"prompt": "Once upon a time, in a lighthouse by the sea, there lived"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]},
    ],
    ids=["prompt", "chat"],
)
async def test_prompt_and_max_tokens_may_fill_the_context_exactly(
    gateway: httpx.AsyncClient, published: ModelCard, request_body: dict[str, Any]
) -> None:
    prompt_tokens = PromptCounter(published).count(JobRequest.model_validate(request_body))
    assert prompt_tokens is not None
    room = CONTEXT - prompt_tokens
    fits = await gateway.post("/v1/jobs", json={**request_body, "max_tokens": room})
    assert fits.status_code == 202, fits.text
    over = await gateway.post("/v1/jobs", json={**request_body, "max_tokens": room + 1})
    assert over.status_code == 413, over.text
    assert over.json()["prompt_tokens"] == prompt_tokens


async def test_openai_routes_answer_400_context_length_exceeded(
    gateway: httpx.AsyncClient, published: ModelCard
) -> None:
    chat = {"model": published.model, "messages": [{"role": "user", "content": LONG}]}
    completion = {"model": published.model, "prompt": LONG}
    for path, body in [("/v1/completions", completion), ("/v1/chat/completions", chat)]:
        answer = await gateway.post(path, json=body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "context_length_exceeded")
        assert str(CONTEXT) in error["message"]


@pytest.mark.parametrize("path", ["/generate", "/generate_stream", "/"])
async def test_tgi_routes_answer_422_validation_as_tgi_does(
    gateway: httpx.AsyncClient, published: ModelCard, path: str
) -> None:
    answer = await gateway.post(path, json={"inputs": LONG, "parameters": {"max_new_tokens": 8}})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error_type"] == "validation"
    assert "maximum context length" in answer.json()["error"]


async def test_a_chat_the_template_refuses_is_422(
    gateway: httpx.AsyncClient, card: ModelCard, settings: Settings, redis_client: aioredis.Redis
) -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    strict = card.model_copy(update={"chat_template": template})
    await publish_model_card(redis_client, Keys(settings.key_prefix), strict)
    answer = await gateway.post("/v1/jobs", json={"messages": [{"role": "assistant", "content": "hi"}]})
    assert answer.status_code == 422, answer.text
    assert "user first" in answer.json()["error"]


async def test_without_a_model_card_the_worker_is_left_to_check(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.post("/v1/jobs", json={"prompt": LONG, "max_tokens": 16})
    assert answer.status_code == 202, answer.text


async def _job_request_of_a_call(
    gateway: httpx.AsyncClient,
    redis_client: aioredis.Redis,
    settings: Settings,
    path: str,
    body: dict[str, Any],
) -> dict[str, Any]:
    """The job a call makes, read from its record as soon as it is queued (no worker runs here, so
    a call that waits for the answer is cancelled once its job exists)."""
    call = asyncio.ensure_future(gateway.post(path, json=body))
    records: list[str] = []

    async def queued() -> bool:
        records[:] = [
            key
            async for key in redis_client.scan_iter(match=f"{settings.key_prefix}:job:*")
            if key.count(":") == 2
        ]
        return bool(records)

    try:
        await eventually(queued, f"{path} queued a job", timeout=10)
    finally:
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
    request: dict[str, Any] = json.loads(await redis_client.hget(records[0], "request"))  # type: ignore[misc]
    return request


HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.mark.parametrize(
    ("path", "body", "fills"),
    [
        ("/v1/chat/completions", {"messages": HELLO}, True),  # vLLM's default: what the context leaves
        ("/v1/responses", {"input": HELLO}, True),  # OpenAI's: bounded by the context alone
        ("/v1/completions", {"prompt": "Hello!"}, False),  # 16, as vLLM and OpenAI
        ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 7}, False),
    ],
    ids=["chat", "responses", "completions", "chat with max_tokens"],
)
async def test_without_a_maximum_chat_and_responses_may_fill_the_context(
    gateway: httpx.AsyncClient,
    published: ModelCard,
    redis_client: aioredis.Redis,
    settings: Settings,
    path: str,
    body: dict[str, Any],
    fills: bool,
) -> None:
    request = await _job_request_of_a_call(
        gateway, redis_client, settings, path, {"model": published.model, **body}
    )
    counter = PromptCounter(published)
    prompt_tokens = counter.count(
        JobRequest.model_validate({"messages": HELLO} if "prompt" not in body else {"prompt": "Hello!"})
    )
    assert prompt_tokens is not None
    expected = CONTEXT - prompt_tokens if fills else body.get("max_tokens", 16)
    assert request["max_tokens"] == expected
