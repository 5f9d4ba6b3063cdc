"""Prompts too long for the context are refused by the gateway before any job is made.

Most tests run the gateway in-process against the real Redis with the card of the real default
model published under the test's prefix, as a worker publishes it; no worker runs. Those of every
path the limit must hold on (no card, `truncate_prompt_tokens`) run a real gateway process, with a
worker's heartbeat written as a worker writes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from shared.prompt_tokens import Measure, PromptCounter
from shared.requests import JobRequest
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import KeyedGateway, run_gateway
from tests.gateway.stand_ins import CARD_CONTEXT as CONTEXT
from tests.gateway.stand_ins import heartbeat
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
    await publish_model_card(redis_client, Keys.of(settings), strict)
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
    request: dict[str, Any] = json.loads(await redis_client.hget(records[0], "request"))
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


HUGE = "a " * 450_000  # 450,000 tokens of the default model, in a body under `max_body_bytes`
DECLARED = "declared-later"  # declared by the gateway process; no worker of it has announced itself
HEARTBEAT_CONTEXT = 512
CHARS_PER_TOKEN = 8  # what the stand-in worker says of its tokenizer's longest token


@pytest.fixture(scope="module")
def process(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    """A real gateway process of this module's own, declaring `DECLARED` beside the default model."""
    yield from run_gateway(
        redis_url, tmp_path_factory.mktemp("prompt-limit"), allow_unauthenticated=True, models=[DECLARED]
    )


@pytest.fixture
async def http(process: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=process.base_url, timeout=10) as client:
        yield client


async def _announced(redis_client: aioredis.Redis, process: KeyedGateway, model: str) -> None:
    """A worker of `model` without a card (its tokenizer has no `tokenizers` form) says it lives."""
    await heartbeat(
        redis_client,
        process.keys,
        f"worker-of-{model}",
        model,
        max_model_len=HEARTBEAT_CONTEXT,
        max_chars_per_token=CHARS_PER_TOKEN,
    )


def _call(path: str, model: str, text: str, **options: Any) -> dict[str, Any]:
    """The body of a call to `path` whose prompt (or one user message) is `text`."""
    if path == "/v1/chat/completions":
        return {"model": model, "messages": [{"role": "user", "content": text}], **options}
    return {"model": model, "prompt": text, **options}


def _refused_as_too_long(answer: httpx.Response, path: str, context: int) -> None:
    if path == "/v1/jobs":
        assert answer.status_code == 413, answer.text
        assert (answer.json()["error_type"], answer.json()["context_length"]) == ("prompt_too_long", context)
    else:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {context} tokens" in answer.text


async def _jobs(redis_client: aioredis.Redis, process: KeyedGateway) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=f"{process.settings.key_prefix}:job:*")}


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
async def test_without_a_card_the_context_of_the_workers_heartbeats_bounds_the_prompt(
    http: httpx.AsyncClient, redis_client: aioredis.Redis, process: KeyedGateway, path: str
) -> None:
    model = f"no-card-{path.rsplit('/', 1)[1]}"
    await _announced(redis_client, process, model)
    await eventually(
        lambda: http.post("/v1/jobs", json={"model": model, "prompt": "Hi", "max_tokens": 1}),
        f"the gateway knows {model}",
        until=lambda answer: answer.status_code == 202,
    )
    before = await _jobs(redis_client, process)
    for text, max_tokens in [(LONG, 16), (HUGE, 16), ("Hello!", HEARTBEAT_CONTEXT)]:
        answer = await http.post(path, json=_call(path, model, text, max_tokens=max_tokens))
        _refused_as_too_long(answer, path, HEARTBEAT_CONTEXT)
    assert "at least" in (await http.post(path, json=_call(path, model, LONG, max_tokens=16))).text
    assert await _jobs(redis_client, process) == before
    if path == "/v1/jobs":
        fits = await http.post(path, json=_call(path, model, "Hello!", max_tokens=16))
        assert fits.status_code == 202, fits.text


async def test_a_declared_model_queues_its_jobs_until_a_worker_of_it_announces_its_context(
    http: httpx.AsyncClient, redis_client: aioredis.Redis, process: KeyedGateway
) -> None:
    """No worker of it has ever run: nothing bounds its prompts yet, and refusing its jobs would keep
    an autoscaler from ever starting its first worker, so they are queued for that worker to check."""
    body = {"model": DECLARED, "prompt": LONG, "max_tokens": 16}
    queued = await http.post("/v1/jobs", json=body)
    assert queued.status_code == 202, queued.text
    await _announced(redis_client, process, DECLARED)
    refused = await eventually(
        lambda: http.post("/v1/jobs", json=body),
        "the declared model's context is known",
        until=lambda answer: answer.status_code != 202,
    )
    _refused_as_too_long(refused, "/v1/jobs", HEARTBEAT_CONTEXT)


@pytest.fixture
async def carded(card: ModelCard, redis_client: aioredis.Redis, process: KeyedGateway) -> ModelCard:
    """The default model's card, published under the gateway process's prefix."""
    await publish_model_card(redis_client, process.keys, card)
    return card


@pytest.mark.parametrize("source", ["card", "heartbeat"])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
async def test_truncate_prompt_tokens_over_the_context_is_refused_as_vllm_refuses_it(
    http: httpx.AsyncClient,
    redis_client: aioredis.Redis,
    process: KeyedGateway,
    card: ModelCard,
    source: str,
    path: str,
) -> None:
    if source == "card":
        await publish_model_card(redis_client, process.keys, card)
        model, context = card.model, CONTEXT
    else:
        model, context = f"truncated-{path.rsplit('/', 1)[1]}", HEARTBEAT_CONTEXT
        await _announced(redis_client, process, model)
    body = _call(path, model, "Hello!", max_tokens=16, truncate_prompt_tokens=context + 1)
    answer = await eventually(
        lambda: http.post(path, json=body),
        "the gateway knows the context",
        until=lambda answer: answer.status_code != 404,
    )
    assert answer.status_code == (422 if path == "/v1/jobs" else 400), answer.text
    assert (
        f"truncate_prompt_tokens: {context + 1} cannot be greater than max_model_len = {context}"
        in answer.text
    )
    if path != "/v1/jobs":
        assert answer.json()["error"]["param"] == "truncate_prompt_tokens"


async def test_truncate_prompt_tokens_minus_one_keeps_what_the_context_holds_beside_max_tokens(
    http: httpx.AsyncClient, redis_client: aioredis.Redis, process: KeyedGateway, carded: ModelCard
) -> None:
    """-1 truncates a 450,000-token prompt to what fits; a `max_tokens` that leaves no room for even one
    prompt token is refused, with the card or with the heartbeat's context."""
    kept = await http.post("/v1/jobs", json={"prompt": HUGE, "max_tokens": 16, "truncate_prompt_tokens": -1})
    assert kept.status_code == 202, kept.text
    await _announced(redis_client, process, "truncated-all")
    for model, context in [(carded.model, CONTEXT), ("truncated-all", HEARTBEAT_CONTEXT)]:
        body = {"model": model, "prompt": HUGE, "max_tokens": context, "truncate_prompt_tokens": -1}
        answer = await eventually(
            lambda body=body: http.post("/v1/jobs", json=body),
            f"{model} is known",
            until=lambda answer: answer.status_code != 404,
        )
        _refused_as_too_long(answer, "/v1/jobs", context)
        assert answer.json()["prompt_tokens"] == 1


@pytest.mark.parametrize("field", ["logit_bias", "stop_token_ids"])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
async def test_token_ids_past_the_vocabulary_are_refused_as_vllm_refuses_them(
    http: httpx.AsyncClient,
    redis_client: aioredis.Redis,
    process: KeyedGateway,
    carded: ModelCard,
    field: str,
    path: str,
) -> None:
    """vLLM fails the job for a `logit_bias` or `stop_token_ids` id past the model's vocabulary (the
    card's `vocab_size`): the gateway refuses it in vLLM's words, naming the field, and makes no job."""
    size = carded.vocab_size
    assert size is not None
    await eventually(
        lambda: http.post("/tokenize", json={"model": carded.model, "prompt": "Hi"}),
        "the gateway has read the card",
        until=lambda answer: answer.status_code == 200,
    )

    def given(*token_ids: int) -> dict[str, Any]:
        if field == "logit_bias":
            return {"logit_bias": {str(token_id): 5 for token_id in token_ids}}
        return {"stop_token_ids": list(token_ids)}

    before = await _jobs(redis_client, process)
    answer = await http.post(
        path, json=_call(path, carded.model, "Hi", max_tokens=4, **given(1, size, 2**31 - 1))
    )
    assert answer.status_code == (422 if path == "/v1/jobs" else 400), answer.text
    unknown = f"token_id(s) [{size}, {2**31 - 1}] in {field} contain out-of-vocab token ids"
    assert f"{field}: {unknown}. Vocabulary size: {size}" in answer.text
    if path != "/v1/jobs":
        assert answer.json()["error"]["param"] == field
    assert await _jobs(redis_client, process) == before
    if path == "/v1/jobs":
        last = await http.post(path, json=_call(path, carded.model, "Hi", max_tokens=4, **given(size - 1)))
        assert last.status_code == 202, last.text


def test_a_prompt_far_over_the_context_is_measured_without_tokenizing_it(card: ModelCard) -> None:
    """As vLLM: no token is longer than the vocabulary's longest, so a text longer than the context of
    such tokens is over it, and is not tokenized (450,000 tokens take a second of CPU)."""
    counter = PromptCounter(card)
    assert counter.measure(JobRequest(prompt=HUGE), at_most=CONTEXT) == [
        Measure(-(-len(HUGE) // counter.max_chars_per_token), exact=False)
    ]
    ((tokens, exact, token_ids),) = counter.measure(JobRequest(prompt=LONG), at_most=CONTEXT) or []
    assert (tokens, exact) == (counter.count(JobRequest(prompt=LONG)), True)
    assert token_ids == counter.encode(LONG, add_special_tokens=True)  # kept: the queue hashes their blocks
