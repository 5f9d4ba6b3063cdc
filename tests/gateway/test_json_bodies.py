"""What JSON cannot carry is refused as a body that is not JSON, before anything is validated or queued:
arrays and objects nested past `MAX_JSON_DEPTH`, and numbers that are not finite (`NaN`, `Infinity`,
`1e999`), on every JSON route in its own error shape and in a batch input file's lines. A real gateway
process of this module's own, no worker, the default model's card published; the `openai` package
where it can send the body, raw HTTP where it cannot (it sends no number that is not finite)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from fastapi.routing import APIRoute

from gateway.app import create_app
from gateway.routing import JSONRoute
from shared.config import DEFAULT_MODEL_DIR
from shared.json_text import MAX_JSON_DEPTH
from shared.model_card import ModelCard, publish_model_card
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import KeyedGateway, run_gateway

MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model
TOO_DEEP = f"nest deeper than {MAX_JSON_DEPTH} levels"
NOT_FINITE = "is not a finite number"
CRASHED = 900
"""A depth past the bound at which the gateway used to answer 500, its validation-error handler
recursing out of Python's stack."""


def nested(levels: int) -> Any:
    """A value of `levels` arrays, one in another."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture(scope="module")
def process(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    folder = tmp_path_factory.mktemp("json-bodies")
    yield from run_gateway(redis_url, folder, allow_unauthenticated=True, files_dir=folder / "files")


@pytest.fixture
async def carded(card: ModelCard, redis_client: aioredis.Redis, process: KeyedGateway) -> ModelCard:
    """The default model's card, published as its worker publishes it: the render routes answer."""
    await publish_model_card(redis_client, process.keys, card)
    return card


@pytest.fixture
async def http(process: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=process.base_url, timeout=30) as client:
        yield client


@pytest.fixture
async def client(process: KeyedGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    # No retries: a failure must show as it happened, not as the third attempt.
    async with openai.AsyncOpenAI(base_url=f"{process.base_url}/v1", api_key="none", max_retries=0) as client:
        yield client


async def _keys(redis_client: aioredis.Redis, process: KeyedGateway) -> set[str]:
    """Every key under the gateway's prefix: a job, a queue entry, a stored response or file adds one."""
    return {key async for key in redis_client.scan_iter(match=f"{process.settings.key_prefix}:*")}


def _message(answer: httpx.Response) -> str:
    """The error's sentence in streampool's shape (`error`) or OpenAI's and vLLM's (`error.message`)."""
    error = answer.json()["error"]
    return str(error["message"] if isinstance(error, dict) else error)


# Each body nests its deep value where the route would refuse it anyway: what is checked is why.
DEEP_BODIES: list[tuple[str, str, dict[str, Any], int]] = [
    ("native", "/v1/jobs", {"prompt": "Hi", "stop": None}, 422),
    ("openai", "/v1/completions", {"model": MODEL, "prompt": "Hi", "stop": None}, 400),
    ("tgi", "/generate", {"inputs": "Hi", "parameters": {"stop": None}}, 422),
    ("tgi-stream", "/generate_stream", {"inputs": "Hi", "parameters": {"stop": None}}, 422),
    (
        "responses",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "background": True, "metadata": None},
        400,
    ),
    ("vllm-tokens", "/inference/v1/generate", {"model": MODEL, "token_ids": None}, 400),
]


def _with_deep(body: dict[str, Any], levels: int) -> dict[str, Any]:
    """`body` with its one None (at most one object down) replaced by `levels` arrays."""
    return {
        name: _with_deep(value, levels)
        if isinstance(value, dict)
        else nested(levels)
        if value is None
        else value
        for name, value in body.items()
    }


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH, CRASHED], ids=["just-past-the-bound", "crashed"])
@pytest.mark.parametrize(
    ("path", "body", "status"),
    [(path, body, status) for _, path, body, status in DEEP_BODIES],
    ids=[name for name, *_ in DEEP_BODIES],
)
async def test_a_body_nested_past_the_bound_is_refused_in_the_routes_shape_and_queues_nothing(
    http: httpx.AsyncClient,
    redis_client: aioredis.Redis,
    process: KeyedGateway,
    path: str,
    body: dict[str, Any],
    status: int,
    levels: int,
) -> None:
    before = await _keys(redis_client, process)
    answer = await http.post(path, json=_with_deep(body, levels))
    assert answer.status_code == status, answer.text
    assert "not valid JSON" in _message(answer) and TOO_DEEP in _message(answer), answer.text
    if status == 422:
        assert answer.json()["error_type"] == "validation"
    assert await _keys(redis_client, process) == before


async def test_the_openai_package_sees_a_deep_chat_and_response_refused_as_bad_requests(
    client: openai.AsyncOpenAI, redis_client: aioredis.Redis, process: KeyedGateway
) -> None:
    before = await _keys(redis_client, process)
    with pytest.raises(openai.BadRequestError, match=TOO_DEEP):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stop=nested(CRASHED)
        )
    with pytest.raises(openai.BadRequestError, match=TOO_DEEP):
        await client.responses.create(model=MODEL, input="Hi", metadata=nested(CRASHED))
    assert await _keys(redis_client, process) == before


async def test_a_batch_input_line_nested_past_the_bound_is_refused_naming_its_line(
    client: openai.AsyncOpenAI, redis_client: aioredis.Redis, process: KeyedGateway
) -> None:
    fine = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    line = {"method": "POST", "url": "/v1/chat/completions"}
    deep = "[" * 5_000 + "]" * 5_000  # past what json.dumps itself writes
    content = (
        json.dumps({"custom_id": "fine", **line, "body": fine})
        + "\n"
        + json.dumps({"custom_id": "deep", **line, "body": None}).replace("null", deep)
        + "\n"
    ).encode()
    before = await _keys(redis_client, process)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.create(file=("input.jsonl", content), purpose="batch")
    assert "line 2" in refused.value.message and TOO_DEEP in refused.value.message, refused.value.message
    assert await _keys(redis_client, process) == before


def _text_with(body: dict[str, Any], literal: str) -> str:
    """`body` as JSON text with its one None replaced by `literal`, which `json.dumps` cannot write."""
    text = json.dumps(body)
    assert text.count("null") == 1
    return text.replace("null", literal)


SCHEMA = {"type": "object", "properties": {"n": {"type": "number", "maximum": None}}, "required": ["n"]}
TEXT_FORMAT = {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}
NON_FINITE_BODIES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "responses",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "background": True, "text": TEXT_FORMAT},
        "invalid_request_error",
    ),
    (
        "responses-stream",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "stream": True, "text": TEXT_FORMAT},
        "invalid_request_error",
    ),
    (
        "chat-render",
        "/v1/chat/completions/render",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
        },
        "BadRequestError",  # vLLM's own shape
    ),
]


@pytest.mark.parametrize("literal", ["1e999", "NaN", "-Infinity"])
@pytest.mark.parametrize(
    ("path", "body", "error_type"),
    [(path, body, error_type) for _, path, body, error_type in NON_FINITE_BODIES],
    ids=[name for name, *_ in NON_FINITE_BODIES],
)
async def test_a_schema_number_that_is_not_finite_is_a_bad_request_before_any_job(
    http: httpx.AsyncClient,
    redis_client: aioredis.Redis,
    process: KeyedGateway,
    carded: ModelCard,
    path: str,
    body: dict[str, Any],
    error_type: str,
    literal: str,
) -> None:
    before = await _keys(redis_client, process)
    text = _text_with(body, literal)
    async with http.stream(
        "POST", path, content=text, headers={"Content-Type": "application/json"}
    ) as answer:
        assert answer.status_code == 400, answer.headers  # no stream begun, nor a job made
        error = json.loads(await answer.aread())["error"]
    assert f"{literal} {NOT_FINITE}" in error["message"], error
    assert f"character {text.index(literal)}" in error["message"], error
    assert error["type"] == error_type
    assert await _keys(redis_client, process) == before


def test_every_route_with_a_body_reads_it_as_json_and_no_more(redis_url: str) -> None:
    app = create_app(make_settings(redis_url, allow_unauthenticated=True))
    with_body = [route for route in app.routes if isinstance(route, APIRoute) and route.body_field]
    assert with_body
    assert [route.path for route in with_body if not isinstance(route, JSONRoute)] == []
