"""vLLM's scale-out routes on a gateway without a worker: the render routes, answered from the model card
of the real default model as a worker publishes it, and what `/inference/v1/generate` and
`/v1/completions` refuse before any job is made. vLLM's own protocol models parse the answers, as a
client of vLLM's server would; what the routes make of a job's events is in
tests/e2e/test_scale_out_routes.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from shared.model_card import ModelCard
from tests.conftest import make_settings
from tests.gateway.stand_ins import CARD_CONTEXT as CONTEXT
from tests.gateway.stand_ins import CARD_MODEL as MODEL
from tests.redis_cleanup import delete_prefix
from tests.vllm_protocol import vllm_protocol

PROMPT = "Once upon a time, in a lighthouse by the sea, there lived"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
VOCABULARY = 49152  # the default model's: its ids run from 0 to 49151


@pytest.fixture
async def settings(redis_url: str) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, allow_unauthenticated=True, max_prompts=4)
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


async def _tokens(gateway: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
    answer = await gateway.post("/tokenize", json=body)
    assert answer.status_code == 200, answer.text
    tokens: list[int] = answer.json()["tokens"]
    return tokens


async def _jobs(redis_client: aioredis.Redis, settings: Settings) -> set[str]:
    keys = Keys.of(settings)
    return {key async for key in redis_client.scan_iter(match=keys.job("*"), count=1000)}


async def test_a_completion_renders_as_vllm_does_one_request_per_prompt(
    gateway: httpx.AsyncClient, published: ModelCard
) -> None:
    GenerateRequest = vllm_protocol().GenerateRequest  # noqa: N806 (vLLM's class)

    body = {"model": MODEL, "prompt": [PROMPT, "Hello"], "max_tokens": 7, "temperature": 0}
    answer = await gateway.post("/v1/completions/render", json=body, headers={"X-Request-Id": "abc"})
    assert answer.status_code == 200, answer.text
    rendered = [GenerateRequest.model_validate(one) for one in answer.json()]
    assert [one.request_id for one in rendered] == ["cmpl-abc-0", "cmpl-abc-1"]
    assert [one.token_ids for one in rendered] == [
        await _tokens(gateway, {"prompt": PROMPT}),
        await _tokens(gateway, {"prompt": "Hello"}),
    ]
    params = rendered[0].sampling_params
    assert (params.max_tokens, params.temperature, params.n, params.top_k) == (7, 0.0, 1, 0)
    assert (rendered[0].model, rendered[0].stream, rendered[0].output_mode) == (MODEL, False, "tokens")
    ids = await gateway.post("/v1/completions/render", json={**body, "prompt": [504, 3575, 282]})
    assert [one["token_ids"] for one in ids.json()] == [[504, 3575, 282]]  # as given: no BOS added


async def test_a_chat_renders_through_the_template_with_what_the_context_leaves(
    gateway: httpx.AsyncClient, published: ModelCard
) -> None:
    GenerateRequest = vllm_protocol().GenerateRequest  # noqa: N806 (vLLM's class)

    body = {"model": MODEL, "messages": CHAT, "stream": True, "stream_options": {"include_usage": True}}
    answer = await gateway.post("/v1/chat/completions/render", json=body)
    assert answer.status_code == 200, answer.text
    rendered = GenerateRequest.model_validate(answer.json())
    assert rendered.request_id.startswith("chatcmpl-")
    assert rendered.token_ids == await _tokens(gateway, {"messages": CHAT})
    assert rendered.sampling_params.max_tokens == CONTEXT - len(rendered.token_ids)  # as vLLM's default
    assert rendered.stream and rendered.stream_options is not None and rendered.stream_options.include_usage


async def test_render_keeps_what_truncation_keeps(gateway: httpx.AsyncClient, published: ModelCard) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "truncate_prompt_tokens": 4}
    answer = await gateway.post("/v1/completions/render", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()[0]["token_ids"] == (await _tokens(gateway, {"prompt": PROMPT}))[-4:]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions/render", {"prompt": "hi"}),
        ("/v1/chat/completions/render", {"messages": CHAT}),
    ],
)
async def test_rendering_without_a_model_card_is_503_in_vllms_shape(
    gateway: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    ErrorResponse = vllm_protocol().ErrorResponse  # noqa: N806 (vLLM's class)

    answer = await gateway.post(path, json={"model": MODEL, **body})
    assert answer.status_code == 503, answer.text
    assert ErrorResponse.model_validate(answer.json()).error.code == 503


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/inference/v1/generate", {"token_ids": [1, VOCABULARY]}, "token_ids"),
        ("/inference/v1/generate", {"token_ids": [1], "features": {"mm_hashes": {}}}, "features"),
        ("/inference/v1/generate", {"token_ids": [1], "content_parts": [{"type": "x"}]}, "content_parts"),
        ("/inference/v1/generate", {"token_ids": [1], "kv_transfer_params": {}}, "kv_transfer_params"),
        ("/inference/v1/generate", {"token_ids": [1], "ec_transfer_params": {}}, "ec_transfer_params"),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {"prompt_logprobs": 1}},
            "sampling_params.prompt_logprobs",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {"n": 2, "temperature": 0}},
            "sampling_params.n",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "output_mode": "text", "sampling_params": {"detokenize": False}},
            "output_mode",
        ),
        ("/inference/v1/generate", {"token_ids": [], "sampling_params": {}}, "token_ids"),
        ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {}, "unknown": 1}, "unknown"),
        ("/v1/completions", {"prompt": [5, VOCABULARY + 7]}, "prompt"),
        ("/v1/completions", {"prompt": [[5], [6], [7], [8], [9]]}, "prompt"),  # past max_prompts (4)
        ("/v1/completions/render", {"prompt": [5, VOCABULARY]}, "prompt"),
    ],
)
async def test_refused_before_any_job_in_vllms_shape_naming_the_parameter(
    gateway: httpx.AsyncClient,
    published: ModelCard,
    redis_client: aioredis.Redis,
    settings: Settings,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    ErrorResponse = vllm_protocol().ErrorResponse  # noqa: N806 (vLLM's class)

    body = {"model": MODEL, **body}
    if path == "/inference/v1/generate":
        body.setdefault("sampling_params", {"max_tokens": 4, "temperature": 0})
    answer = await gateway.post(path, json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]  # OpenAI's shape on /v1/completions, as every OpenAI route answers
    if path.startswith("/inference") or path.endswith("/render"):
        vllms = ErrorResponse.model_validate(answer.json()).error
        assert (vllms.code, vllms.type) == (400, "BadRequestError")
    assert param in error["param"]
    assert answer.headers.get("X-Streampool-Job-Id") is None
    assert await _jobs(redis_client, settings) == set()


@pytest.mark.parametrize("path", ["/inference/v1/generate", "/v1/completions"])
async def test_token_ids_past_the_context_are_counted_as_given_and_refused_before_a_job(
    gateway: httpx.AsyncClient,
    published: ModelCard,
    redis_client: aioredis.Redis,
    settings: Settings,
    path: str,
) -> None:
    ids = [504] * (CONTEXT - 3)
    if path == "/v1/completions":
        body: dict[str, Any] = {"model": MODEL, "prompt": ids, "max_tokens": 4}
    else:
        body = {"model": MODEL, "token_ids": ids, "sampling_params": {"max_tokens": 4}}
    answer = await gateway.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert f"({CONTEXT - 3} in the prompt, 4 for the completion)" in answer.json()["error"]["message"]
    assert await _jobs(redis_client, settings) == set()
