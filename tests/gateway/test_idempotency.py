"""An `Idempotency-Key` names one request: the same body again replays its job (202 with
`Idempotent-Replayed: true`), another body under the same key is refused (422
`idempotency_mismatch`) and creates nothing, as payment APIs answer.

No engine runs: the gateway is in-process on the real Redis, and the jobs stay queued.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from tests.conftest import delete_test_keys, make_settings

BODY = {"prompt": "The capital of France is", "max_tokens": 8, "stop": ["\n"]}
KEY = {"Idempotency-Key": "order-42"}


@pytest.fixture
async def settings(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, allow_unauthenticated=True)
    yield settings
    await delete_test_keys(redis_client, Keys.of(settings))


async def test_the_same_key_with_another_body_is_refused_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings
) -> None:
    first = await gateway.post("/v1/jobs", json=BODY, headers=KEY)
    other = await gateway.post("/v1/jobs", json={**BODY, "max_tokens": 9}, headers=KEY)
    assert first.status_code == 202, first.text
    assert other.status_code == 422
    assert other.json()["error_type"] == "idempotency_mismatch"
    assert first.json()["id"] in other.json()["error"]
    assert await redis_client.zcard(Keys.of(settings).model(settings.default_model or "").queue) == 1


async def test_the_same_body_however_written_replays_the_job(gateway: httpx.AsyncClient) -> None:
    first = await gateway.post("/v1/jobs", json=BODY, headers=KEY)
    # The same request in another key order and spacing, with a default spelt out.
    rewritten = json.dumps({"stop": ["\n"], "temperature": 1.0, **BODY}, indent=2, sort_keys=True)
    again = await gateway.post(
        "/v1/jobs", content=rewritten, headers={**KEY, "Content-Type": "application/json"}
    )
    assert again.status_code == 202, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"


async def test_the_api_document_names_the_mismatch(gateway: httpx.AsyncClient) -> None:
    document = (await gateway.get("/openapi.json")).json()
    assert "idempotency_mismatch" in document["paths"]["/v1/jobs"]["post"]["responses"]["422"]["description"]
